// Which data plane a Client's steps take (ClientOptions::data_plane),
// chosen at the first step that can decide and kept. Not API.
#ifndef OPTSTATE_CLIENT_DATA_PLANE_CHOICE_H_
#define OPTSTATE_CLIENT_DATA_PLANE_CHOICE_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/transport/shared_memory/shared_memory_plane.h"
#include "grpcpp/grpcpp.h"
#include "optstate/client.h"

namespace optstate::client_internal {

// Thread-safe: steps through shared memory run one at a time.
class DataPlaneChoice {
 public:
  // Runs `step` with the shared-memory plane, holding it for the step, when
  // shared memory is the choice, and returns its status; std::nullopt when
  // the wire should carry this step: kWire, kAuto without a usable region
  // socket, or `step` itself answering std::nullopt (kAuto when the
  // region cannot hold the step's groups). kSharedMemory without a usable
  // socket: FAILED_PRECONDITION saying why, or the daemon's status when it
  // did not answer.
  std::optional<absl::Status> StepOnSharedMemory(
      grpc::Channel* channel, const ClientOptions& options,
      absl::FunctionRef<std::optional<absl::Status>(SharedMemoryPlane&)> step)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A group deleted: its area in the region is not kept when the region is
  // next replaced (SharedMemoryPlane::ForgetArea). Waits for a step in flight.
  void ForgetGroup(const std::string& group) ABSL_LOCKS_EXCLUDED(mu_);
  // Client::AllocateSharedBuffer: FAILED_PRECONDITION without a plane.
  absl::StatusOr<std::shared_ptr<SharedMapping>> AllocateShared(grpc::Channel* channel,
                                                                const ClientOptions& options,
                                                                uint64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Opens the plane the first time it can be decided. A status when the
  // caller should return it (the daemon did not answer).
  std::optional<absl::Status> Decide(grpc::Channel* channel, const ClientOptions& options)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Mutex mu_;
  bool decided_ ABSL_GUARDED_BY(mu_) = false;
  // kAuto, after the daemon refused a region connection for its cap
  // (RESOURCE_EXHAUSTED): steps take the wire without asking again until
  // then (another client may have left by then).
  absl::Time ask_again_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status full_ ABSL_GUARDED_BY(mu_);
  absl::Status why_not_ ABSL_GUARDED_BY(mu_);  // When decided without a plane.
  std::unique_ptr<SharedMemoryPlane> plane_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_DATA_PLANE_CHOICE_H_
