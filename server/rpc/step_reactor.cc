// The Step stream's reactor: a small state machine driven by Advance().
#include "server/rpc/step_reactor.h"

#include <algorithm>
#include <vector>

#include "optstate/v1/step_wire_format.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/step_message.h"
#include "server/rpc/step_plan.h"

namespace optstate {

StepReactor::StepReactor(StepEngine* engine, std::string tenant, size_t max_reply_bytes,
                         StreamRegistry* streams, RegionRegistry* regions,
                         StepStreamMetrics* metrics, StreamSlot slot, LeaseClaim lease,
                         StreamBytes* stream_bytes)
    : engine_(engine),
      tenant_(std::move(tenant)),
      lease_(std::move(lease)),
      max_reply_bytes_(max_reply_bytes),
      regions_(regions),
      max_in_flight_(std::max(1, engine->pool()->size())),
      streams_(streams),
      metrics_(metrics),
      stream_bytes_(stream_bytes),
      slot_(std::move(slot)) {
  {
    absl::MutexLock lock(&mu_);
    last_activity_ = absl::Now();
    if (!streams_->Add(this)) {
      error_ = StreamRegistry::ShuttingDownError();
      error_seq_ = 0;
    } else {
      registered_ = true;
    }
  }
  Advance(0);
}

bool StepReactor::HoldIfIdleSince(absl::Time idle_since) {
  absl::MutexLock lock(&mu_);
  if (finish_called_ || !error_.ok()) return false;  // Ending already.
  if (idle_since != absl::InfiniteFuture()) {
    // A reply in flight since before `idle_since` counts as idle: the client
    // stopped reading (the write waits on its flow control), and the replies
    // behind it pin up to kMaxPinnedChunks messages.
    const bool busy = !queued_.empty() || in_flight_ > 0 || !completed_.empty() ||
                      (!to_write_.empty() && !write_in_flight_);
    if (busy || last_activity_ > idle_since) return false;
    abandon_writes_ = write_in_flight_;
  }
  ++starting_;  // Finish waits for EndHeld.
  return true;
}

void StepReactor::EndHeld(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (error_.ok()) {
      // What is on the workers finishes and is answered; nothing more starts.
      error_ = std::move(status);
      error_seq_ = next_seq_;
      queued_.clear();
    }
    if (abandon_writes_) {
      // The client takes no reply: only the one in flight stays (gRPC holds
      // it until the call ends), and Finish goes behind it at once.
      completed_.clear();
      to_write_.erase(to_write_.begin() + (write_in_flight_ ? 1 : 0), to_write_.end());
    }
  }
  Advance(1);
}

uint64_t StepReactor::HeldBytesLocked() const {
  uint64_t bytes = in_flight_bytes_;
  for (const QueuedChunk& chunk : queued_) bytes += chunk.bytes;
  for (const auto& [seq, reply] : completed_) bytes += reply.Length();
  for (const grpc::ByteBuffer& reply : to_write_) bytes += reply.Length();
  return bytes;
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
      const uint64_t held = HeldBytesLocked();
      if (stream_bytes_ != nullptr) {
        if (held > held_bytes_) stream_bytes_->Add(held - held_bytes_);
        if (held < held_bytes_) stream_bytes_->Subtract(held_bytes_ - held);
      }
      held_bytes_ = held;
      const bool failed = !error_.ok();
      if (!failed && !reads_done_ && !read_in_flight_ && MayReadLocked()) {
        read_in_flight_ = start_read = true;
      }
      // In stream order: the head waits while a chunk of one of its groups is applied.
      while (!failed && in_flight_ < max_in_flight_ && !queued_.empty() &&
             !AnyGroupInFlightLocked(ChunksOf(queued_.front().message))) {
        auto task = std::make_shared<ChunkTask>();
        task->seq = next_seq_++;
        task->chunk = std::move(queued_.front());
        queued_.pop_front();
        const v1::StepRequest& chunks = ChunksOf(task->chunk.message);
        groups_in_flight_.insert(chunks.group());
        for (const v1::StepRequest& packed : chunks.more())
          groups_in_flight_.insert(packed.group());
        ++in_flight_;
        in_flight_bytes_ += task->chunk.bytes;
        dispatch.push_back(std::move(task));
      }
      if (!write_in_flight_ && !to_write_.empty()) {
        write_in_flight_ = start_write = true;
        write = &to_write_.front();
        // A write starts the idle time over: the reply is idle only once it
        // has waited for the client this long (HoldIfIdleSince).
        last_activity_ = absl::Now();
        if (metrics_ != nullptr) write_started_ = last_activity_;
      }
      tokens_released = int{start_read} + static_cast<int>(dispatch.size()) + int{start_write};
      starting_ += tokens_released;
      const bool drained =
          in_flight_ == 0 && (abandon_writes_ || (!write_in_flight_ && to_write_.empty()));
      if (starting_ == 0 && drained && (failed || (reads_done_ && queued_.empty()))) {
        finish_called_ = finish = true;
        finish_status = error_;
        // Before the status goes: a client that opens its next stream once it
        // has it finds the place free.
        if (!(abandon_writes_ && write_in_flight_)) slot_.GiveBack();
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
    // (The message takes the buffer's slices: its length is read first.)
    const absl::Time started = metrics_ != nullptr ? absl::Now() : absl::InfinitePast();
    const size_t bytes = incoming_.Length();
    chunk.bytes = bytes;
    chunk.parse_status = ReadStepRequest(&incoming_, kMaxPackedChunks, &chunk.message);
    if (chunk.parse_status.ok() && UsesStepPlan(chunk.message.request)) {
      // Found now: dispatch must know the plan's groups.
      absl::StatusOr<std::shared_ptr<const StepPlan>> plan =
          FindStepPlan(regions_, tenant_, chunk.message);
      if (plan.ok()) {
        chunk.message.plan = *std::move(plan);
      } else {
        chunk.parse_status = plan.status();
      }
    }
    if (metrics_ != nullptr) {
      metrics_->receive.Observe(absl::Now() - started);
      metrics_->wire_bytes_in.fetch_add(bytes, std::memory_order_relaxed);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    read_in_flight_ = false;
    last_activity_ = absl::Now();
    if (ok) {
      queued_.push_back(std::move(chunk));
    } else {
      reads_done_ = true;  // Half-close by the client, or a broken stream.
    }
  }
  Advance(0);
}

void StepReactor::ApplyOnWorker(const std::shared_ptr<ChunkTask>& task) {
  const v1::StepRequest& chunks = ChunksOf(task->chunk.message);
  absl::Status status = task->chunk.parse_status;
  std::vector<grpc::Slice> slices;
  if (status.ok()) {
    const absl::Time started = metrics_ != nullptr ? absl::Now() : absl::InfinitePast();
    status = ApplyStepMessage(engine_, tenant_, max_reply_bytes_, task->chunk.message, &slices,
                              regions_, &lease_);
    if (metrics_ != nullptr) {
      metrics_->compute.Observe(absl::Now() - started);
      if (status.ok()) CountRegionBytes(chunks);
    }
  }
  grpc::ByteBuffer reply;
  if (status.ok()) reply = grpc::ByteBuffer(slices.data(), slices.size());
  {
    absl::MutexLock lock(&mu_);
    --in_flight_;
    in_flight_bytes_ -= task->chunk.bytes;
    last_activity_ = absl::Now();  // Applied: a slow apply is no idle time.
    groups_in_flight_.erase(chunks.group());
    for (const v1::StepRequest& packed : chunks.more()) groups_in_flight_.erase(packed.group());
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

void StepReactor::CountRegionBytes(const v1::StepRequest& chunks) {
  uint64_t in = chunks.gradient_region().bytes();
  uint64_t out = chunks.params_region().bytes();
  for (const v1::StepRequest& packed : chunks.more()) {
    in += packed.gradient_region().bytes();
    out += packed.params_region().bytes();
  }
  metrics_->shared_memory_bytes_in.fetch_add(in, std::memory_order_relaxed);
  metrics_->shared_memory_bytes_out.fetch_add(out, std::memory_order_relaxed);
}

void StepReactor::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    write_in_flight_ = false;
    last_activity_ = absl::Now();
    if (metrics_ != nullptr) {
      metrics_->send.Observe(last_activity_ - write_started_);
      if (ok) {
        metrics_->wire_bytes_out.fetch_add(to_write_.front().Length(), std::memory_order_relaxed);
      }
    }
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

void StepReactor::OnDone() {
  if (stream_bytes_ != nullptr) {
    absl::MutexLock lock(&mu_);
    stream_bytes_->Subtract(held_bytes_);
  }
  if (registered_) streams_->Remove(this);
  delete this;
}

}  // namespace optstate
