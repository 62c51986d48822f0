// The Step stream: one reactor per call. Reads messages, hands them to the
// step engine on the worker pool, and writes one reply per message (the
// replies to the chunks packed in a request's `more` packed in the reply's),
// in order.
#ifndef OPTSTATE_SERVER_RPC_STEP_REACTOR_H_
#define OPTSTATE_SERVER_RPC_STEP_REACTOR_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.pb.h"
#include "server/engine/step_engine.h"
#include "server/regions/region_registry.h"
#include "server/rpc/step_request_reader.h"
#include "server/rpc/step_stream_metrics.h"
#include "server/rpc/stream_bytes.h"
#include "server/rpc/stream_registry.h"
#include "server/rpc/tenant_stream_limit.h"

namespace optstate {

// Flow: StartRead -> OnReadDone -> ApplyOnWorker (the engine, on a pool
// worker; it queues the reply) -> Advance -> StartWrite -> OnWriteDone, with
// reads of later messages overlapping the update of earlier ones. Messages of
// different groups are applied concurrently (a model of many tensors uses
// every worker); messages naming one group are applied one after another, in
// stream order, so a stream may carry step k and step k+1 of the same page.
// Replies go out in request order.
// A message may pack chunks of several groups (StepRequest.more): all are
// checked, then applied (ApplyStepMessage: in order on its worker, or, for a
// large message of independent chunks, at once over the pool; see
// MessageStep), and the message waits while a message naming any of its
// groups is applied; its reply packs theirs the same way. A message that
// uses a step plan (step_plan.h) has its plan found as it is read (not
// found, or malformed: refused in its turn) and is, from then on, a message
// of the plan's chunks.
// The first refused chunk ends the call with its status, after the replies to
// every earlier message; it changed nothing, while later messages of other
// groups may already have been applied, and so may, when it was refused for
// its pages' state, the chunks packed before it in its message (or, applied
// at once, the others of its message). Resending those is a harmless replay,
// unless the same stream also carried a later step of their group (then the resend is refused as
// stale): a client that needs resends sends one step per stream, as optstate::Client does. No
// callback blocks: engine work runs on the pool, and gRPC calls are made outside the reactor's
// mutex. Messages are raw: a request that does not parse is refused with INVALID_ARGUMENT in its
// turn, and replies are serialized by StepReplyBuilder, which writes the params into the reply's
// slice directly.
// Ended from outside (StreamRegistry: shutdown, idle timeout), it reads no
// more, drops what it read but has not started, finishes the messages on the
// workers, writes every reply due, then finishes with the registry's status.
// Ended idle because the client stopped reading (a reply in flight since the
// idle timeout began), it drops the replies behind that one and finishes
// behind it at once.
class StepReactor : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                    public ManagedStream {
 public:
  // `max_reply_bytes`: the largest reply gRPC will send on this server.
  // `streams` must outlive the reactor. `regions`: what chunks naming a
  // RegionSlice refer to (null: none). `metrics`: where each message's
  // phases and bytes are recorded (null: not measured).
  // `lease`: the call's lease claim (call_lease.h), held to every chunk.
  // `stream_bytes`: the bytes every Step stream holds, counted and limited
  // together (null: this stream's own limits only); must outlive the reactor.
  StepReactor(StepEngine* engine, std::string tenant, size_t max_reply_bytes,
              StreamRegistry* streams, RegionRegistry* regions = nullptr,
              StepStreamMetrics* metrics = nullptr, StreamSlot slot = StreamSlot(),
              LeaseClaim lease = LeaseClaim(), StreamBytes* stream_bytes = nullptr);

  void OnReadDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_);
  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_);
  // Stops dispatching queued chunks; those already on a worker finish.
  void OnCancel() override ABSL_LOCKS_EXCLUDED(mu_);
  void OnDone() override;

  // ManagedStream. Idle: no message read, applied or written since
  // `idle_since`, and none being applied; a reply still being written then
  // (the client stopped reading) counts as idle, and ending the stream then
  // drops the replies behind it and finishes behind it at once, so a client
  // that does not read holds one reply, not kMaxPinnedChunks messages.
  bool HoldIfIdleSince(absl::Time idle_since) override;
  void EndHeld(absl::Status status) override;

 private:
  // Messages a stream holds at once (each one chunk, or several packed):
  // read ahead, being applied, or replies waiting to be written. Bounds the
  // memory one stream can pin (with kMaxHeldBytes), and stops a client that
  // does not read its replies.
  static constexpr size_t kMaxPinnedChunks = 16;
  // Bytes of those messages (requests as read, replies as built) past which
  // the stream reads no more, unless it holds none: a client that does not
  // read its replies leaves at most this much, plus a message each way, held
  // for it (sixteen messages of 48 MiB were 768 MiB). optstate::Client's
  // window (8 messages of 1 MiB) is far below it.
  static constexpr uint64_t kMaxHeldBytes = 64 << 20;
  // A request as read: parsed, or the reason it did not parse.
  struct QueuedChunk {
    StepMessage message;
    absl::Status parse_status;
    uint64_t bytes = 0;  // As read.
  };
  struct ChunkTask {
    uint64_t seq;
    QueuedChunk chunk;
  };

  // Starts whatever may start now: a read, chunks on the engine, a write, or
  // Finish. Safe to call from any thread. Each action started holds a token
  // (starting_) from the decision until its gRPC call or Schedule has been
  // made, so Finish can never come before, or race with, another call on the
  // stream; the caller passes the tokens it held.
  void Advance(int tokens_released) ABSL_LOCKS_EXCLUDED(mu_);
  // Applies a message (ApplyStepMessage) and queues its reply, or its
  // refusal.
  void ApplyOnWorker(const std::shared_ptr<ChunkTask>& task) ABSL_LOCKS_EXCLUDED(mu_);
  // Adds the region bytes an applied message's chunks (`chunks`, as
  // ChunksOf) named to metrics_ (not null).
  void CountRegionBytes(const v1::StepRequest& chunks);
  // Whether a group of `chunks` (a message's, as ChunksOf) is in flight.
  bool AnyGroupInFlightLocked(const v1::StepRequest& chunks) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (groups_in_flight_.contains(chunks.group())) return true;
    for (const v1::StepRequest& packed : chunks.more()) {
      if (groups_in_flight_.contains(packed.group())) return true;
    }
    return false;
  }
  size_t PinnedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queued_.size() + in_flight_ + completed_.size() + to_write_.size();
  }
  // Their bytes now (kMaxHeldBytes).
  uint64_t HeldBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a further message may be read: none held, or fewer than the
  // stream's and every stream's limits of bytes.
  bool MayReadLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (PinnedLocked() == 0) return true;
    return PinnedLocked() < kMaxPinnedChunks && held_bytes_ < kMaxHeldBytes &&
           (stream_bytes_ == nullptr || !stream_bytes_->Full());
  }

  StepEngine* const engine_;
  const std::string tenant_;
  const LeaseClaim lease_;
  const size_t max_reply_bytes_;
  RegionRegistry* const regions_;
  const int max_in_flight_;  // Messages applied at once: the pool's size.
  StreamRegistry* const streams_;
  StepStreamMetrics* const metrics_;
  StreamBytes* const stream_bytes_;
  // The tenant's stream count: held until Finish (until the reactor goes when
  // a reply it abandoned is still in flight).
  StreamSlot slot_ ABSL_GUARDED_BY(mu_);
  bool registered_ = false;  // streams_->Add took it.

  absl::Mutex mu_;
  grpc::ByteBuffer incoming_;  // Written by gRPC while a read is in flight.
  std::deque<QueuedChunk> queued_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;        // Of the next message dispatched.
  uint64_t next_write_seq_ ABSL_GUARDED_BY(mu_) = 0;  // Of the next reply to queue.
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t in_flight_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // Of the requests on workers.
  // HeldBytesLocked() as last counted in stream_bytes_ (Advance); taken back
  // out of it in OnDone.
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The groups of the messages on workers: views of their names in those
  // messages (or their plans), which their tasks keep until the names are
  // erased; no group is in two such messages (dispatch waits).
  absl::flat_hash_set<absl::string_view> groups_in_flight_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, grpc::ByteBuffer> completed_ ABSL_GUARDED_BY(mu_);  // Out of order.
  std::deque<grpc::ByteBuffer> to_write_ ABSL_GUARDED_BY(mu_);           // Front is in flight.
  bool read_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  int starting_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t error_seq_ ABSL_GUARDED_BY(mu_) = UINT64_MAX;  // Earliest refused message.
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  absl::Time last_activity_ ABSL_GUARDED_BY(mu_);  // Last read, apply, write start or end.
  absl::Time write_started_ ABSL_GUARDED_BY(mu_);  // Of the write in flight (metrics_ only).
  // Ended idle with a reply in flight (HoldIfIdleSince): Finish does not wait
  // for that write, and no later reply is written.
  bool abandon_writes_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_STEP_REACTOR_H_
