// ExportState: header first, then runs of whole pages, tensor by tensor.
#include "server/rpc/export_reactor.h"

#include <algorithm>

#include "server/rpc/proto_convert.h"

namespace optstate {
namespace {

// Bytes of one tensor per chunk (whole pages, at least one): well under the
// least --max_message_bytes, which holds a float32 page and 4 KiB.
constexpr uint64_t kChunkBytes = 1 << 20;

}  // namespace

ExportReactor::ExportReactor(StepEngine* engine, const GroupKey& key) : engine_(engine) {
  absl::StatusOr<std::shared_ptr<Group>> group = engine_->store()->Find(key);
  if (!group.ok()) {
    Finish(ToGrpcStatus(group.status()));
    return;
  }
  group_ = std::move(*group);
  pages_per_run_ = std::max<uint64_t>(1, kChunkBytes / (group_->page_elements() * sizeof(float)));
  v1::GroupStateHeader* header = response_.mutable_header();
  header->set_name(group_->key().name);
  header->set_num_elements(group_->num_elements());
  HyperparametersToProto(group_->config().hyperparameters, header->mutable_hyperparameters());
  header->set_page_elements(group_->page_elements());
  StartWrite(&response_);
}

void ExportReactor::OnWriteDone(bool ok) {
  if (!ok) {
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the export stream broke"));
    return;
  }
  engine_->pool()->Schedule([this] { WriteNext(); });
}

void ExportReactor::WriteNext() {
  if (next_tensor_ == 0) {
    if (next_page_ == group_->num_pages()) {
      Finish(grpc::Status::OK);
      return;
    }
    const uint64_t end = std::min(group_->num_pages(), next_page_ + pages_per_run_);
    absl::Status captured = CapturePages(*engine_->backend(), *group_, next_page_, end, &pages_);
    if (!captured.ok()) {
      Finish(ToGrpcStatus(captured));
      return;
    }
    next_page_ = end;
    next_tensor_ = 1;
  }
  response_.Clear();
  v1::StateChunk* chunk = response_.mutable_chunk();
  const size_t count = pages_.end - pages_.begin;
  switch (next_tensor_) {
    case 1:
      chunk->set_tensor(v1::STATE_TENSOR_PAGE_STEPS);
      chunk->set_offset(pages_.first_page);
      chunk->set_data(pages_.steps.data(), pages_.steps.size() * sizeof(uint64_t));
      break;
    case 2:
      chunk->set_tensor(v1::STATE_TENSOR_PARAMS);
      chunk->set_offset(pages_.begin);
      chunk->set_data(pages_.params.data(), count * sizeof(float));
      break;
    case 3:
      chunk->set_tensor(v1::STATE_TENSOR_EXP_AVG);
      chunk->set_offset(pages_.begin);
      chunk->set_data(pages_.exp_avg.data(), count * sizeof(float));
      break;
    default:
      chunk->set_tensor(v1::STATE_TENSOR_EXP_AVG_SQ);
      chunk->set_offset(pages_.begin);
      chunk->set_data(pages_.exp_avg_sq.data(), count * sizeof(float));
      break;
  }
  next_tensor_ = next_tensor_ == 4 ? 0 : next_tensor_ + 1;
  StartWrite(&response_);
}

}  // namespace optstate
