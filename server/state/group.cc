// Group allocation, page bookkeeping and hyperparameter validation.
#include "server/state/group.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace optstate {

std::string ExactText(double x) {
  char text[32];
  const std::to_chars_result result = std::to_chars(text, text + sizeof(text), x);
  return std::string(text, result.ptr);
}

absl::Status ValidateHyperparameters(const AdamWHyperparameters& h) {
  // The step runs in fp32, so each value must also be in range as a float.
  auto fits_float = [](double x) { return std::isfinite(static_cast<float>(x)); };
  if (!std::isfinite(h.lr) || h.lr < 0 || !fits_float(h.lr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lr must be finite and >= 0 (and within float32's range), got ", ExactText(h.lr)));
  }
  if (!(h.beta1 >= 0 && h.beta1 < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("beta1 must be in [0, 1), got ", ExactText(h.beta1)));
  }
  if (!(h.beta2 >= 0 && h.beta2 < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("beta2 must be in [0, 1), got ", ExactText(h.beta2)));
  }
  if (!std::isfinite(h.eps) || !fits_float(h.eps) || !(static_cast<float>(h.eps) > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eps must be finite and > 0, and at least float32's smallest value 1.4e-45 (the step "
        "runs in fp32), got ",
        ExactText(h.eps)));
  }
  if (!std::isfinite(h.weight_decay) || h.weight_decay < 0 || !fits_float(h.weight_decay)) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_decay must be finite and >= 0 (and within float32's range), got ",
                     ExactText(h.weight_decay)));
  }
  return absl::OkStatus();
}

Group::Group(GroupKey key, GroupConfig config, uint64_t page_elements, HostAllocator* allocator)
    : key_(std::move(key)),
      config_(config),
      page_elements_(page_elements),
      num_pages_((config.num_elements + page_elements - 1) / page_elements),
      allocator_(allocator),
      page_mutexes_(new absl::Mutex[num_pages_]),
      page_steps_(new std::atomic<uint64_t>[num_pages_]),
      page_has_values_(new std::atomic<bool>[num_pages_]),
      pages_awaiting_values_(config.has_initial_values ? num_pages_ : 0) {
  for (uint64_t i = 0; i < num_pages_; ++i) {
    page_steps_[i].store(0, std::memory_order_relaxed);
    page_has_values_[i].store(!config.has_initial_values, std::memory_order_relaxed);
  }
}

absl::StatusOr<std::shared_ptr<Group>> Group::Create(GroupKey key, GroupConfig config,
                                                     uint64_t page_elements,
                                                     HostAllocator* allocator) {
  std::shared_ptr<Group> group(new Group(std::move(key), config, page_elements, allocator));
  const size_t bytes = config.num_elements * sizeof(float);
  group->params_ = static_cast<float*>(allocator->Allocate(bytes));
  group->exp_avg_ = static_cast<float*>(allocator->Allocate(bytes));
  group->exp_avg_sq_ = static_cast<float*>(allocator->Allocate(bytes));
  if (group->params_ == nullptr || group->exp_avg_ == nullptr || group->exp_avg_sq_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("could not allocate ", HostBytesFor(config.num_elements), " bytes of ",
                     allocator->name(), " host memory for group '", group->key().name, "'"));
  }
  return group;
}

Group::~Group() {
  const size_t bytes = config_.num_elements * sizeof(float);
  if (params_ != nullptr) allocator_->Free(params_, bytes);
  if (exp_avg_ != nullptr) allocator_->Free(exp_avg_, bytes);
  if (exp_avg_sq_ != nullptr) allocator_->Free(exp_avg_sq_, bytes);
}

uint64_t Group::PageEnd(uint64_t page) const {
  uint64_t end = (page + 1) * page_elements_;
  return end < config_.num_elements ? end : config_.num_elements;
}

void Group::mark_page_has_values(uint64_t page) {
  if (!page_has_values_[page].exchange(true, std::memory_order_acq_rel)) {
    pages_awaiting_values_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

uint64_t Group::MinStep() const {
  uint64_t min = UINT64_MAX;
  for (uint64_t i = 0; i < num_pages_; ++i) min = std::min(min, page_step(i));
  return num_pages_ == 0 ? 0 : min;
}

uint64_t Group::MaxStep() const {
  uint64_t max = 0;
  for (uint64_t i = 0; i < num_pages_; ++i) max = std::max(max, page_step(i));
  return max;
}

}  // namespace optstate
