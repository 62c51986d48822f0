// The client's session with the daemon's region socket (the same-host data
// plane): its region (a sealed memfd) holding each group's gradient and
// params, and the SharedBuffers the caller allocated. A step over it is a
// SharedMemoryTransport (transport/shared_memory/shared_memory_transport.h).
// Not API.
#ifndef OPTSTATE_CLIENT_TRANSPORT_SHARED_MEMORY_SHARED_MEMORY_PLANE_H_
#define OPTSTATE_CLIENT_TRANSPORT_SHARED_MEMORY_SHARED_MEMORY_PLANE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/transport/shared_memory/step_plan_cache.h"
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

// 1. Open asks the daemon (DataPlane.GetDataPlane) for its region socket,
//    connects, and checks the socket's greeting names the same daemon.
// 2. A step lays out any group not yet in the region (EnsureAreas: a region
//    sized from the live layout replaces the old one when it does not fit);
//    its chunks name (region, offset, bytes) for gradient and params.
// 3. A daemon that restarted meanwhile gets the same memfds registered
//    again (ReconnectIfLost).
// Not thread-safe: DataPlaneChoice (client/data_plane_choice.h) lets one
// step at a time use it.
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
  // Where a buffer lies in a SharedBuffer: the buffer's index (SIZE_MAX:
  // in none) and the offset in it.
  struct InPlace {
    size_t region = SIZE_MAX;
    uint64_t offset = 0;
  };

  // A step begins: counts it (areas unused for kAreaLifetimeSteps steps are
  // not kept when the region is replaced) and unregisters the SharedBuffers
  // the caller destroyed.
  void BeginStep();
  // The SharedBuffer holding all of [data, data + bytes), its mapping held
  // in `held` for the step; InPlace{} when none does.
  InPlace FindInPlace(const void* data, uint64_t bytes,
                      std::vector<std::shared_ptr<SharedMapping>>* held) const;
  bool has_shared_buffers() const { return !shared_.empty(); }
  // The daemon's id of SharedBuffer `index` (from FindInPlace).
  uint64_t shared_region_id(size_t index) const { return shared_[index].id; }
  // A group's area; EnsureAreas laid it out.
  const Area& area(const std::string& group) const { return areas_.at(group); }
  char* base() const { return base_; }
  uint64_t region_id() const { return region_id_; }
  const std::string& session_key() const { return session_key_; }
  // The step plan kept with the daemon for this session's one-message steps
  // (a plan of another session key never matches).
  StepPlanCache& step_plan() { return step_plan_; }
  // When the daemon closed the region socket (it restarted, or closed our
  // session), or the last try to connect again failed: connects again and
  // registers the region and every live SharedBuffer anew, all or nothing
  // (a registration refused leaves no connection, so no step names a region
  // id of the daemon before). UNAVAILABLE when the daemon did not answer;
  // the refusal, saying it came after the daemon restarted, when the daemon
  // answered and no longer offers what this plane needs (no region socket,
  // FAILED_PRECONDITION; a region past its limits, RESOURCE_EXHAUSTED; a
  // token refused): refused_after_reconnect() is then true.
  absl::Status ReconnectIfLost(grpc::Channel* channel, const ClientOptions& options);
  // Whether the last ReconnectIfLost failed with a refusal, not for want of
  // an answer: a kAuto client then steps over the wire.
  bool refused_after_reconnect() const { return refused_after_reconnect_; }

  // A SharedBuffer's mapping of `bytes` (rounded up to 4096), registered
  // with the daemon; its refusal (RESOURCE_EXHAUSTED) or UNAVAILABLE.
  absl::StatusOr<std::shared_ptr<SharedMapping>> AllocateShared(grpc::Channel* channel,
                                                                const ClientOptions& options,
                                                                uint64_t bytes);

  // The region's size. Bounded by the live layout whatever sequence of
  // steps (dtypes, 16-bit or float buffers, groups) it sees: at most
  // max(1 MiB, 2 x the bytes of the areas live when it was last replaced),
  // rounded up to a page. An area is live while its group was stepped in
  // the last kAreaLifetimeSteps steps and not deleted through this client
  // (ForgetArea), and takes at most
  // AlignUp(4 n, 64) + AlignUp(4 n, 64) bytes for n elements.
  uint64_t region_bytes() const { return size_; }
  static constexpr uint64_t kAreaLifetimeSteps = 64;

  // Forgets `group`'s area (the group was deleted): its whole pages are
  // given back to the system (a hole punched in the memfd, for this process
  // and the daemon), and a region replaced later is sized without it. Its
  // offsets are not reused in this region.
  void ForgetArea(const std::string& group);

  // Lays out every group given (a new region when they do not fit); a step
  // calls it for the groups not wholly in SharedBuffers. The region socket's refusal
  // (RESOURCE_EXHAUSTED past the daemon's limits) or the memfd's failure.
  absl::Status EnsureAreas(absl::Span<const GroupStep> groups, const StepOptions& options);

 private:
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
  int socket_ = -1;  // -1 after a reconnection that failed part-way.
  bool refused_after_reconnect_ = false;
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
  StepPlanCache step_plan_;
};

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_TRANSPORT_SHARED_MEMORY_SHARED_MEMORY_PLANE_H_
