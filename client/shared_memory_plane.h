// The client's side of the same-host data plane: one region (a sealed memfd
// shared with the daemon over its region socket) holding each group's
// gradient and params, and Step streams whose chunks name slices of it.
// Not API.
#ifndef OPTSTATE_CLIENT_SHARED_MEMORY_PLANE_H_
#define OPTSTATE_CLIENT_SHARED_MEMORY_PLANE_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/plan_chunks.h"
#include "grpcpp/grpcpp.h"
#include "optstate/client.h"

namespace optstate::client_internal {

// On the client side:
// 1. Open asks the daemon (DataPlane.GetDataPlane) for its region socket,
//    connects, and checks the socket's greeting names the same daemon.
// 2. A step lays out any group not yet in the region (a larger region
//    replaces the old one when it does not fit), copies each gradient into
//    it (narrowed to the wire type), checks it finite there, and streams
//    messages of chunks that name (region, offset, bytes) for gradient and
//    params.
// 3. Each reply says the daemon wrote the chunk's params into the region;
//    they are copied into params_out then. Unanswered messages are resent
//    after a transient failure, exactly as on the wire; a daemon that
//    restarted meanwhile gets the same memfd registered again.
// Not thread-safe: DataPlaneChoice runs one step at a time.
class SharedMemoryPlane {
 public:
  // FAILED_PRECONDITION, saying why, when the daemon offers no region socket
  // or it cannot be used from here; the daemon's status (UNAVAILABLE, ...)
  // when GetDataPlane fails otherwise.
  static absl::StatusOr<std::unique_ptr<SharedMemoryPlane>> Open(grpc::Channel* channel,
                                                                 const ClientOptions& options);
  // Closes the region socket (the daemon unregisters the region) and unmaps.
  ~SharedMemoryPlane();
  SharedMemoryPlane(const SharedMemoryPlane&) = delete;
  SharedMemoryPlane& operator=(const SharedMemoryPlane&) = delete;

  // Client::Step through the region, for groups whose layouts the caller
  // checked (`layouts`, one per group). Same contract and codes as
  // Client::Step.
  absl::Status Step(grpc::Channel* channel, const grpc::internal::RpcMethod& method,
                    const ClientOptions& client_options, absl::Span<const GroupStep> groups,
                    absl::Span<const ChunkGroup> layouts, uint64_t step,
                    const StepOptions& options);

  uint64_t region_bytes() const { return size_; }

  // Lays out every group of the step (a new, larger region when needed);
  // Step calls it too. The region socket's refusal (RESOURCE_EXHAUSTED past
  // the daemon's limits) or the memfd's failure.
  absl::Status EnsureAreas(absl::Span<const GroupStep> groups, const StepOptions& options);

 private:
  // Where one group's gradient and params lie in the region.
  struct Area {
    uint64_t elements = 0;
    WireType gradient_type = WireType::kFloat32;
    WireType param_type = WireType::kFloat32;
    uint64_t gradient_offset = 0;
    uint64_t params_offset = 0;
  };

  SharedMemoryPlane() = default;
  // Connects to the daemon's region socket (after GetDataPlane).
  absl::Status Connect(grpc::Channel* channel, const ClientOptions& options);
  // Registers memfd_ on the current connection.
  absl::Status RegisterRegion();
  // Whether the region socket connection has been closed by the daemon.
  bool ConnectionLost() const;
  int socket_ = -1;
  std::string session_key_;
  int memfd_ = -1;
  char* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t region_id_ = 0;
  uint64_t used_ = 0;
  absl::flat_hash_map<std::string, Area> areas_;
};

// Which data plane a Client's steps take (ClientOptions::data_plane),
// chosen at the first step that can decide and kept. Thread-safe.
class DataPlaneChoice {
 public:
  // Steps through shared memory when that is the choice; std::nullopt when
  // the wire should carry this step (kWire, or kAuto without a usable
  // region socket or when the step's groups do not fit a region the daemon
  // accepts). kSharedMemory without one: FAILED_PRECONDITION; when the
  // region is refused: its status (RESOURCE_EXHAUSTED).
  std::optional<absl::Status> MaybeStep(grpc::Channel* channel,
                                        const grpc::internal::RpcMethod& method,
                                        const ClientOptions& client_options,
                                        absl::Span<const GroupStep> groups,
                                        absl::Span<const ChunkGroup> layouts, uint64_t step,
                                        const StepOptions& options) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  bool decided_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status why_not_ ABSL_GUARDED_BY(mu_);  // When decided without a plane.
  std::unique_ptr<SharedMemoryPlane> plane_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_SHARED_MEMORY_PLANE_H_
