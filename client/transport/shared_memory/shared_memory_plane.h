// The client's side of the same-host data plane: one region (a sealed memfd
// shared with the daemon over its region socket) holding each group's
// gradient and params, and Step streams whose chunks name slices of it.
// Not API.
#ifndef OPTSTATE_CLIENT_TRANSPORT_SHARED_MEMORY_SHARED_MEMORY_PLANE_H_
#define OPTSTATE_CLIENT_TRANSPORT_SHARED_MEMORY_SHARED_MEMORY_PLANE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/step/plan_chunks.h"
#include "grpcpp/grpcpp.h"
#include "optstate/client.h"

namespace optstate::client_internal {

// A SharedBuffer's memory: a sealed memfd mapped here. Unmapped and closed
// when the last reference goes (the buffer's, or a step's using it).
struct SharedMapping {
  SharedMapping(int memfd, char* base, uint64_t bytes) : memfd(memfd), base(base), bytes(bytes) {}
  ~SharedMapping();
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;
  const int memfd;
  char* const base;
  const uint64_t bytes;
};

// On the client side:
// 1. Open asks the daemon (DataPlane.GetDataPlane) for its region socket,
//    connects, and checks the socket's greeting names the same daemon.
// 2. A step lays out any group not yet in the region (a region sized from
//    the live layout replaces the old one when it does not fit), copies each gradient into
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
  // Client::Step; `*layout_failed` says the status is EnsureAreas' (nothing
  // was sent: kAuto takes the wire then).
  absl::Status Step(grpc::Channel* channel, const grpc::internal::RpcMethod& method,
                    const ClientOptions& client_options, absl::Span<const GroupStep> groups,
                    absl::Span<const ChunkGroup> layouts, uint64_t step, const StepOptions& options,
                    bool* layout_failed);

  // A SharedBuffer's mapping of `bytes` (rounded up to 4096), registered
  // with the daemon; its refusal (RESOURCE_EXHAUSTED) or UNAVAILABLE.
  absl::StatusOr<std::shared_ptr<SharedMapping>> AllocateShared(grpc::Channel* channel,
                                                                const ClientOptions& options,
                                                                uint64_t bytes);

  // The region's size. Bounded by the live layout whatever sequence of
  // steps (dtypes, 16-bit or float buffers, groups) it sees: at most
  // max(1 MiB, 2 x the bytes of the areas live when it was last replaced),
  // rounded up to a page. An area is live while its group was stepped in
  // the last kAreaLifetimeSteps steps, and takes at most
  // AlignUp(4 n, 64) + AlignUp(4 n, 64) bytes for n elements.
  uint64_t region_bytes() const { return size_; }
  static constexpr uint64_t kAreaLifetimeSteps = 64;

  // Lays out every group given (a new region when they do not fit); Step
  // calls it for the groups not wholly in SharedBuffers. The region socket's refusal
  // (RESOURCE_EXHAUSTED past the daemon's limits) or the memfd's failure.
  absl::Status EnsureAreas(absl::Span<const GroupStep> groups, const StepOptions& options);

 private:
  // Where one group's gradient and params lie in the region. The capacities
  // are the bytes reserved for each (the largest a step has needed), so a
  // group whose dtypes change from step to step keeps its place.
  struct Area {
    uint64_t elements = 0;
    uint64_t gradient_offset = 0;
    uint64_t gradient_capacity = 0;
    uint64_t params_offset = 0;
    uint64_t params_capacity = 0;
    uint64_t last_used = 0;  // The value of steps_ when a step last used it.
  };

  SharedMemoryPlane() = default;
  // Connects to the daemon's region socket (after GetDataPlane).
  absl::Status Connect(grpc::Channel* channel, const ClientOptions& options);
  // Registers memfd_ on the current connection.
  absl::Status RegisterRegion();
  // Registers `fd` on the current connection: its region id.
  absl::StatusOr<uint64_t> RegisterFd(int fd);
  // After a lost connection: connects again and registers memfd_ (if any)
  // and every live SharedBuffer anew.
  absl::Status Reconnect(grpc::Channel* channel, const ClientOptions& options);
  // Unregisters the SharedBuffers the caller destroyed.
  void ForgetDestroyed();
  // Whether the region socket connection has been closed by the daemon.
  bool ConnectionLost() const;
  int socket_ = -1;
  std::string session_key_;
  int memfd_ = -1;
  char* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t region_id_ = 0;
  uint64_t used_ = 0;   // Bytes laid out, from the region's start.
  uint64_t steps_ = 0;  // Step calls so far.
  absl::flat_hash_map<std::string, Area> areas_;
  // The SharedBuffers made here (the caller owns them), and their ids.
  struct SharedRegion {
    std::weak_ptr<SharedMapping> mapping;
    const char* base;
    uint64_t bytes;
    uint64_t id;
  };
  std::vector<SharedRegion> shared_;
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
  // Client::AllocateSharedBuffer: FAILED_PRECONDITION without a plane.
  absl::StatusOr<std::shared_ptr<SharedMapping>> AllocateShared(grpc::Channel* channel,
                                                                const ClientOptions& options,
                                                                uint64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Opens the plane the first time it can be decided. A status when the
  // caller should return it (the daemon did not answer, for kSharedMemory).
  std::optional<absl::Status> Decide(grpc::Channel* channel, const ClientOptions& options)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Mutex mu_;
  bool decided_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status why_not_ ABSL_GUARDED_BY(mu_);  // When decided without a plane.
  std::unique_ptr<SharedMemoryPlane> plane_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_TRANSPORT_SHARED_MEMORY_SHARED_MEMORY_PLANE_H_
