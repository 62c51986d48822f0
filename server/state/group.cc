// Group allocation and geometry.
#include "server/state/group.h"

#include "absl/strings/str_cat.h"

namespace optstate {

Group::Group(GroupKey key, GroupConfig config, uint64_t page_elements, HostAllocator* allocator)
    : key_(std::move(key)),
      config_(config),
      page_elements_(page_elements),
      allocator_(allocator),
      pages_((config.num_elements + page_elements - 1) / page_elements, config.has_initial_values) {
}

absl::StatusOr<std::shared_ptr<Group>> Group::Create(GroupKey key, GroupConfig config,
                                                     uint64_t page_elements,
                                                     HostAllocator* allocator) {
  std::shared_ptr<Group> group(new Group(std::move(key), config, page_elements, allocator));
  const size_t bytes = config.num_elements * sizeof(float);
  group->params_ = static_cast<float*>(allocator->Allocate(bytes));
  group->exp_avg_ = static_cast<float*>(allocator->Allocate(bytes));
  group->exp_avg_sq_ = static_cast<float*>(allocator->Allocate(bytes));
  const bool amsgrad = config.hyperparameters.amsgrad;
  if (amsgrad) group->max_exp_avg_sq_ = static_cast<float*>(allocator->Allocate(bytes));
  if (group->params_ == nullptr || group->exp_avg_ == nullptr || group->exp_avg_sq_ == nullptr ||
      (amsgrad && group->max_exp_avg_sq_ == nullptr)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("could not allocate ", HostBytesFor(config), " bytes of ",
                     allocator->name(), " host memory for group '", group->key().name, "'"));
  }
  return group;
}

Group::~Group() {
  const size_t bytes = config_.num_elements * sizeof(float);
  if (params_ != nullptr) allocator_->Free(params_, bytes);
  if (exp_avg_ != nullptr) allocator_->Free(exp_avg_, bytes);
  if (exp_avg_sq_ != nullptr) allocator_->Free(exp_avg_sq_, bytes);
  if (max_exp_avg_sq_ != nullptr) allocator_->Free(max_exp_avg_sq_, bytes);
}

uint64_t Group::PageEnd(uint64_t page) const {
  uint64_t end = (page + 1) * page_elements_;
  return end < config_.num_elements ? end : config_.num_elements;
}

}  // namespace optstate
