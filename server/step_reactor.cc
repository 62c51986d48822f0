// The Step stream's reactor: a small state machine driven by Advance().
#include "server/step_reactor.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "server/proto_convert.h"
#include "server/step_wire.h"

namespace optstate {

StepReactor::StepReactor(StepEngine* engine, std::string tenant, size_t max_reply_bytes)
    : engine_(engine),
      tenant_(std::move(tenant)),
      max_reply_bytes_(max_reply_bytes),
      max_in_flight_(std::max(1, engine->pool()->size())) {
  Advance(0);
}

void StepReactor::Advance(int tokens_released) {
  for (;;) {
    bool start_read = false, start_write = false, finish = false;
    std::vector<std::shared_ptr<ChunkTask>> dispatch;
    const grpc::ByteBuffer* write = nullptr;
    absl::Status finish_status;
    {
      absl::MutexLock lock(&mu_);
      starting_ -= tokens_released;
      if (finish_called_) return;
      const bool failed = !error_.ok();
      if (!failed && !reads_done_ && !read_in_flight_ && PinnedLocked() < kMaxPinnedChunks) {
        read_in_flight_ = start_read = true;
      }
      // In stream order: the head waits while a chunk of one of its groups is applied.
      while (!failed && in_flight_ < max_in_flight_ && !queued_.empty() &&
             !AnyGroupInFlightLocked(queued_.front().message.request)) {
        auto task = std::make_shared<ChunkTask>();
        task->seq = next_seq_++;
        task->chunk = std::move(queued_.front());
        queued_.pop_front();
        groups_in_flight_.insert(task->chunk.message.request.group());
        for (const v1::StepRequest& packed : task->chunk.message.request.more()) {
          groups_in_flight_.insert(packed.group());
        }
        ++in_flight_;
        dispatch.push_back(std::move(task));
      }
      if (!write_in_flight_ && !to_write_.empty()) {
        write_in_flight_ = start_write = true;
        write = &to_write_.front();
      }
      tokens_released =
          int{start_read} + static_cast<int>(dispatch.size()) + int{start_write};
      starting_ += tokens_released;
      const bool drained = in_flight_ == 0 && !write_in_flight_ && to_write_.empty();
      if (starting_ == 0 && drained && (failed || (reads_done_ && queued_.empty()))) {
        finish_called_ = finish = true;
        finish_status = error_;
      }
    }
    if (finish) {
      Finish(ToGrpcStatus(finish_status));  // OnDone may delete `this` from here on.
      return;
    }
    if (tokens_released == 0) return;
    if (start_read) StartRead(&incoming_);
    for (auto& task : dispatch) {
      engine_->pool()->Schedule([this, task = std::move(task)] { ApplyOnWorker(task); });
    }
    if (start_write) StartWrite(write);
    // Loop to release the tokens and see whether Finish is now due.
  }
}

void StepReactor::OnReadDone(bool ok) {
  QueuedChunk chunk;
  if (ok) {
    // As gRPC's own deserializer would, but the gradients stay in the
    // message's slices. Outside the lock: incoming_ is ours until
    // read_in_flight_ is cleared.
    chunk.parse_status = ReadStepRequest(&incoming_, kMaxPackedChunks, &chunk.message);
  }
  {
    absl::MutexLock lock(&mu_);
    read_in_flight_ = false;
    if (ok) {
      queued_.push_back(std::move(chunk));
    } else {
      reads_done_ = true;  // Half-close by the client, or a broken stream.
    }
  }
  Advance(0);
}

absl::Status StepReactor::ToChunk(const v1::StepRequest& request,
                                  const SegmentedBytes& gradient, bool packed,
                                  StepChunk* chunk) const {
  if (packed && !request.more().empty()) {
    return absl::InvalidArgumentError(
        "a chunk packed in StepRequest.more packs chunks itself; put every chunk of the "
        "message in the outer request's more");
  }
  absl::StatusOr<WireType> gradient_type =
      WireTypeFromProto(request.gradient_dtype(), "gradient_dtype");
  if (!gradient_type.ok()) return gradient_type.status();
  absl::StatusOr<WireType> param_type = WireTypeFromProto(request.param_dtype(), "param_dtype");
  if (!param_type.ok()) return param_type.status();
  chunk->group = GroupKey{tenant_, request.group()};
  chunk->step = request.step();
  chunk->offset = request.offset();
  chunk->group_elements = request.group_elements();
  chunk->gradient = gradient;
  if (request.has_lr()) chunk->lr = request.lr();
  if (request.has_grad_scale()) chunk->grad_scale = request.grad_scale();
  chunk->gradient_type = *gradient_type;
  chunk->param_type = *param_type;
  return absl::OkStatus();
}

namespace {

// The chunk at `index` of a message: the message's own (0), or more[index-1].
const v1::StepRequest& PieceOf(const v1::StepRequest& request, size_t index) {
  return index == 0 ? request : request.more(static_cast<int>(index - 1));
}

// `status`, naming the packed chunk it is about.
absl::Status AboutPacked(const absl::Status& status, const v1::StepRequest& request,
                         size_t index, absl::string_view consequence) {
  if (index == 0 || status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("StepRequest.more[", index - 1, "] (group '",
                                   PieceOf(request, index).group(), "'): ", status.message(),
                                   " (", consequence, ")"));
}

// Room a reply takes beyond its params, per chunk: the params' tag and
// length, the other fields (group name aside), and a packed reply's framing.
constexpr uint64_t kReplyFieldsBytes = 128;

// INVALID_ARGUMENT when the reply to a message (its chunks validated) could
// be larger than gRPC will send: it is refused before anything is applied,
// rather than applied and then not answered.
absl::Status CheckReplyFits(const v1::StepRequest& request, absl::Span<const StepChunk> chunks,
                            absl::Span<const ValidatedChunk> validated, size_t max_reply_bytes) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    bytes += validated[i].count * WireTypeSize(chunks[i].param_type) +
             PieceOf(request, i).group().size() + kReplyFieldsBytes;
  }
  if (bytes <= max_reply_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the reply to this message would take up to ", bytes, " bytes (params in the "
      "requested param_dtype), more than the daemon's --max_message_bytes=", max_reply_bytes,
      "; send fewer elements per message or ask for 16-bit params; nothing was applied"));
}

}  // namespace

void StepReactor::ApplyOnWorker(const std::shared_ptr<ChunkTask>& task) {
  const v1::StepRequest& request = task->chunk.message.request;
  const std::vector<SegmentedBytes>& gradients = task->chunk.message.gradients;
  absl::Status status = task->chunk.parse_status;
  // Every chunk of the message is checked before any is applied, so a
  // malformed or non-finite chunk refuses the whole message unchanged; only
  // page state (a step out of order, a deleted group) can refuse a packed
  // chunk after those before it were applied.
  const size_t pieces = status.ok() ? 1 + static_cast<size_t>(request.more_size()) : 0;
  std::vector<StepChunk> chunks(pieces);
  std::vector<ValidatedChunk> validated(pieces);
  for (size_t i = 0; status.ok() && i < pieces; ++i) {
    status = ToChunk(PieceOf(request, i), gradients[i], i > 0, &chunks[i]);
    if (status.ok()) {
      absl::StatusOr<ValidatedChunk> checked = engine_->Validate(chunks[i]);
      if (checked.ok()) {
        validated[i] = std::move(*checked);
      } else {
        status = checked.status();
      }
    }
    status = AboutPacked(status, request, i, "nothing in its message was applied");
  }
  if (status.ok()) status = CheckReplyFits(request, chunks, validated, max_reply_bytes_);
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; status.ok() && i < pieces; ++i) {
    const v1::StepRequest& piece = PieceOf(request, i);
    StepReplyBuilder builder(piece.group().size(), /*packed=*/i > 0);
    absl::StatusOr<StepChunkResult> result =
        engine_->Apply(chunks[i], validated[i],
                       [&builder](size_t bytes) { return builder.ReserveParams(bytes); });
    if (!result.ok()) {
      status = AboutPacked(result.status(), request, i,
                           "the chunks before it in its message were applied");
      break;
    }
    v1::StepResponse response;
    response.set_group(piece.group());
    response.set_step(piece.step());
    response.set_offset(piece.offset());
    response.set_num_elements(result->num_elements);
    response.set_param_dtype(WireTypeToProto(chunks[i].param_type));
    response.set_pages_applied(result->pages_applied);
    response.set_pages_replayed(result->pages_replayed);
    slices.push_back(builder.Finish(response));
  }
  validated.clear();  // Drops the groups before the reply is queued.
  grpc::ByteBuffer reply;
  if (status.ok()) reply = grpc::ByteBuffer(slices.data(), slices.size());
  {
    absl::MutexLock lock(&mu_);
    --in_flight_;
    groups_in_flight_.erase(request.group());
    for (const v1::StepRequest& packed : request.more()) groups_in_flight_.erase(packed.group());
    ++starting_;  // Keeps the call open until this thread is done with it.
    if (task->seq < error_seq_) {
      if (status.ok()) {
        completed_[task->seq].Swap(&reply);  // ByteBuffer has no move: swap, not copy.
      } else {
        // The earliest refusal wins; replies to later chunks are dropped.
        error_seq_ = task->seq;
        error_ = status;
        queued_.clear();
        completed_.erase(completed_.lower_bound(task->seq), completed_.end());
      }
    }
    while (!completed_.empty() && completed_.begin()->first == next_write_seq_) {
      to_write_.emplace_back().Swap(&completed_.begin()->second);
      completed_.erase(completed_.begin());
      ++next_write_seq_;
    }
  }
  Advance(1);
}

void StepReactor::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    write_in_flight_ = false;
    to_write_.pop_front();
    if (!ok && error_.ok()) {
      error_ = absl::CancelledError("the client stopped reading replies");
      error_seq_ = 0;  // Nothing more is written.
      to_write_.clear();
      completed_.clear();
      queued_.clear();
    }
  }
  Advance(0);
}

void StepReactor::OnCancel() {
  {
    absl::MutexLock lock(&mu_);
    if (error_.ok()) {
      error_ = absl::CancelledError("the call was cancelled");
      error_seq_ = 0;  // Nothing more is written.
    }
    queued_.clear();
    completed_.clear();
    // The reply being written stays until OnWriteDone.
    to_write_.erase(write_in_flight_ ? to_write_.begin() + 1 : to_write_.begin(), to_write_.end());
  }
  Advance(0);
}

void StepReactor::OnDone() { delete this; }

}  // namespace optstate
