// The shared-memory data plane: a step whose chunks name slices of memory
// shared with the daemon (the client's region, or the caller's
// SharedBuffers) instead of carrying bytes. Not API.
#ifndef OPTSTATE_CLIENT_TRANSPORT_SHARED_MEMORY_SHARED_MEMORY_TRANSPORT_H_
#define OPTSTATE_CLIENT_TRANSPORT_SHARED_MEMORY_SHARED_MEMORY_TRANSPORT_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "client/step/plan_chunks.h"
#include "client/step/step_input.h"
#include "client/transport/shared_memory/shared_memory_plane.h"
#include "client/transport/shared_memory/step_plan_cache.h"
#include "client/transport/step_transport.h"
#include "grpcpp/grpcpp.h"
#include "optstate/client.h"

namespace optstate::client_internal {

// One step over `plane` (which the caller holds for the step's length):
// 1. Prepare finds which gradients and params_outs lie in a SharedBuffer in
//    the wire type (those are named where they are, their mappings held for
//    the step) and lays the others out in the region (EnsureAreas).
// 2. A step wholly in SharedBuffers goes as one message of whole-group
//    chunks: the daemon checks every chunk's gradient before it applies any
//    (on its threads), which is the whole-step refusal, so the client reads
//    none of them. Otherwise the gradients not in place are copied into
//    their areas (the one copy, narrowed to the wire type), every gradient
//    checked finite where the daemon will read it (a large step on several
//    threads: the daemon has nothing to do meanwhile), and the step planned
//    as on the wire but in messages of up to 64 MiB of gradient (or
//    ClientOptions::chunk_bytes, if larger), each marked gradients_checked
//    (the daemon then checks each small chunk as it applies it). With StepOptions::gradients_checked the one message is
//    marked too, and gradients in place are not read here. The one
//    message defines a step plan (StepPlanCache, StepRequest.plan); a later
//    step of the same chunks sends only the plan's number, its step and the
//    per-step fields that changed, and is answered once. A use the daemon
//    refuses NOT_FOUND (it no longer keeps the plan) is sent again at once
//    as the chunks (ResendAfter).
// 3. Each reply says the daemon wrote the chunk's params where the chunk
//    named; those in the region are copied into params_out at the end of
//    the step (Finish), those of every answered message, on several threads
//    for a large step. Before each attempt a lost region socket is
//    reconnected (the daemon restarted) and the same memfds registered
//    again.
class SharedMemoryTransport : public StepTransport {
 public:
  SharedMemoryTransport(SharedMemoryPlane& plane, grpc::Channel* channel, const StepInput& input,
                        const ClientOptions& options)
      : plane_(plane), channel_(channel), input_(input), options_(options) {}

  absl::StatusOr<size_t> Prepare() override;
  absl::Status BeforeAttempt() override { return plane_.ReconnectIfLost(channel_, options_); }
  grpc::ByteBuffer Request(size_t i) override;
  absl::Status TakeReply(size_t i, grpc::ByteBuffer* reply) override;
  bool ResendAfter(const absl::Status& status) override;
  absl::Status Finish() override;
  // Region messages are small: gRPC's flow control and the daemon's
  // read-ahead bound what is in flight.
  size_t max_in_flight() const override { return SIZE_MAX; }
  absl::string_view name() const override { return "shared memory"; }

  // After a failed Prepare: whether the region could not hold the step's
  // groups (EnsureAreas failed; nothing was sent, DataPlane::kAuto takes
  // the wire then).
  bool layout_refused() const { return layout_refused_; }

 private:
  using InPlace = SharedMemoryPlane::InPlace;
  // Copies elements [begin, end) of group `i`'s gradient into its area,
  // checking them as it goes, or checks them in place; the refusal names
  // the first bad one.
  absl::Status CopyInAndCheck(size_t i, uint64_t begin, uint64_t end) const;
  // The one message's chunks (one_message_), as its step plan holds them.
  std::vector<PlanChunk> OneMessageChunks() const;

  SharedMemoryPlane& plane_;
  grpc::Channel* const channel_;
  const StepInput input_;
  const ClientOptions& options_;
  std::vector<std::shared_ptr<SharedMapping>> held_;  // SharedBuffers the step names.
  std::vector<InPlace> gradient_at_, params_at_;      // One per group.
  std::vector<PlannedPieces> plan_;
  std::vector<bool> answered_;  // Per message: its reply taken (TakeReply).

  // The step goes as one message of SharedBuffer slices (OneMessagePlan),
  // checked by the daemon; false: this client checked every gradient first.
  bool one_message_ = false;
  // The step plan the last Request used (its whole message then being the
  // plan's number), or defined with its chunks; 0: none.
  uint64_t plan_used_ = 0;
  uint64_t plan_defined_ = 0;
  // A use of the plan was refused (ResendAfter): the chunks go instead.
  bool resent_chunks_ = false;
  bool layout_refused_ = false;
  // The step copies enough through the region (kStreamingCopyBytes) that
  // plain copies (no conversion) into and out of it use CopyStreaming.
  bool stream_copies_ = false;
};

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_TRANSPORT_SHARED_MEMORY_SHARED_MEMORY_TRANSPORT_H_
