// ExportState: header first, then runs of whole pages, tensor by tensor.
#include "server/rpc/export_reactor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "optstate/message_limits.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/raw_message.h"

namespace optstate {
namespace {

// Bytes of one tensor per chunk (whole pages, at least one): with the room
// for the other fields, within the least --max_message_bytes, which is
// 1 MiB and at least a float32 page and that room.
constexpr uint64_t kChunkBytes = (1 << 20) - kMessageFieldRoomBytes;

}  // namespace

ExportReactor::ExportReactor(StepEngine* engine, const GroupKey& key, StreamRegistry* streams,
                             const std::string& moved_to, const LeaseClaim& lease, StreamSlot slot)
    : engine_(engine), streams_(streams), slot_(std::move(slot)) {
  if (!streams_->Add(this)) {
    FinishOnce(StreamRegistry::ShuttingDownError());
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    in_registry_ = true;
  }
  // A group whose RegisterGroup upload is unfinished has pages with no
  // values, which the export would give as zeros and an import take as
  // values: refused, before a move seals it. (Pages only ever gain values,
  // so none lacks them at the seal either.)
  absl::StatusOr<std::shared_ptr<Group>> group = engine_->store()->Find(key);
  if (group.ok() && (*group)->PagesAwaitingValues() > 0) {
    group = absl::FailedPreconditionError(absl::StrCat(
        "group '", key.name, "' has ", (*group)->PagesAwaitingValues(),
        " pages with no initial values yet; finish uploading them with RegisterGroup, then "
        "export it"));
  }
  if (group.ok() && !moved_to.empty()) group = engine_->store()->Seal(key, moved_to, lease);
  if (!group.ok()) {
    FinishOnce(group.status());
    return;
  }
  group_ = std::move(*group);
  pages_per_run_ = std::max<uint64_t>(1, kChunkBytes / (group_->page_elements() * sizeof(float)));
  v1::GroupStateHeader* header = response_.mutable_header();
  header->set_name(group_->key().name);
  header->set_num_elements(group_->num_elements());
  HyperparametersToProto(group_->config().hyperparameters, header->mutable_hyperparameters());
  header->set_page_elements(group_->page_elements());
  Write();
}

bool ExportReactor::HoldIfIdleSince(absl::Time idle_since) {
  absl::MutexLock lock(&mu_);
  if (finish_called_ || ending_) return false;
  if (idle_since != absl::InfiniteFuture() &&
      (on_worker_ || !writing_ || write_started_ > idle_since)) {
    return false;
  }
  ending_ = true;
  ++holds_;
  return true;
}

void ExportReactor::EndHeld(absl::Status status) {
  bool finish_now;
  {
    absl::MutexLock lock(&mu_);
    --holds_;
    if (!final_.has_value()) final_ = status;
    // A capture on a worker finishes first and then sees ending_ (Write).
    finish_now = !on_worker_;
  }
  if (finish_now) FinishOnce(std::move(status));
}

void ExportReactor::Write() {
  // Serialized first, while this thread still counts as on the worker
  // (on_worker_): a registry ending the stream meanwhile then leaves the
  // finish to this thread (EndHeld), and StartWrite follows the unlock at
  // once.
  absl::Status status = SerializeRawMessage(response_, &outgoing_);
  bool write;
  {
    absl::MutexLock lock(&mu_);
    on_worker_ = false;
    if (ending_) {
      // Held: EndHeld has set final_, or will, and finishes it then (this
      // FinishOnce returns while the hold lasts).
      status = final_.value_or(StreamRegistry::ShuttingDownError());
    }
    write = status.ok() && !ending_;
    if (write) {
      writing_ = true;
      write_started_ = absl::Now();
    }
  }
  if (write) {
    StartWrite(&outgoing_);
  } else {
    FinishOnce(std::move(status));
  }
}

void ExportReactor::OnWriteDone(bool ok) {
  bool schedule = false;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (finish_called_) return;  // Ended behind this message.
    if (ok && !ending_) on_worker_ = schedule = true;
  }
  if (!ok) {
    FinishOnce(absl::CancelledError("the export stream broke"));
  } else if (schedule) {
    engine_->pool()->Schedule([this] { WriteNext(); });
  }
  // Otherwise held: EndHeld finishes it (it sees no capture on a worker).
}

void ExportReactor::FinishOnce(absl::Status status) {
  bool leave;
  {
    absl::MutexLock lock(&mu_);
    if (finish_called_ || holds_ > 0) return;
    finish_called_ = true;
    leave = in_registry_;
    in_registry_ = false;
  }
  // The registry has nothing more to do with it, though OnDone may wait for
  // a client that does not read; removed before Finish, after which `this`
  // may be deleted.
  if (leave) streams_->Remove(this);
  // Nothing captures any more: let go of the group and the copies (the
  // message in flight was serialized when it was started).
  group_.reset();
  pages_ = CapturedPages();
  slot_.GiveBack();  // Before the status: the client may start its next export at once.
  Finish(ToGrpcStatus(status));
}

void ExportReactor::OnDone() {
  bool leave;
  {
    absl::MutexLock lock(&mu_);
    leave = in_registry_;
  }
  if (leave) streams_->Remove(this);
  delete this;
}

void ExportReactor::WriteNext() {
  if (next_tensor_ == 0) {
    if (next_page_ == group_->num_pages()) {
      {
        absl::MutexLock lock(&mu_);
        on_worker_ = false;
      }
      FinishOnce(absl::OkStatus());
      return;
    }
    const uint64_t end = std::min(group_->num_pages(), next_page_ + pages_per_run_);
    absl::Status captured = CapturePages(*engine_->backend(), *group_, next_page_, end, &pages_);
    if (!captured.ok()) {
      {
        absl::MutexLock lock(&mu_);
        on_worker_ = false;
      }
      FinishOnce(captured);
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
    case 4:
      chunk->set_tensor(v1::STATE_TENSOR_EXP_AVG_SQ);
      chunk->set_offset(pages_.begin);
      chunk->set_data(pages_.exp_avg_sq.data(), count * sizeof(float));
      break;
    default:  // An amsgrad group's fifth tensor.
      chunk->set_tensor(v1::STATE_TENSOR_MAX_EXP_AVG_SQ);
      chunk->set_offset(pages_.begin);
      chunk->set_data(pages_.max_exp_avg_sq.data(), count * sizeof(float));
      break;
  }
  const int last_tensor = pages_.max_exp_avg_sq.empty() ? 4 : 5;
  next_tensor_ = next_tensor_ == last_tensor ? 0 : next_tensor_ + 1;
  Write();
}

}  // namespace optstate
