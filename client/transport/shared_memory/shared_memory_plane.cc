// The region socket session: connect and greet, register and replace
// regions, lay groups out, find SharedBuffers, reconnect after a restart.
#include "client/transport/shared_memory/shared_memory_plane.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/call/retry.h"
#include "client/call/status.h"
#include "common/region_protocol.h"
#include "optstate/v1/optstate.grpc.pb.h"

namespace optstate::client_internal {
namespace {

namespace rp = region_protocol;

constexpr uint64_t kAlignment = 64;

uint64_t AlignUp(uint64_t value, uint64_t to) { return (value + to - 1) / to * to; }

// A new sealed memfd of `size` bytes (a multiple of the page size) named
// `name`, and its mapping here.
struct MappedMemfd {
  int fd;
  char* base;
};
absl::StatusOr<MappedMemfd> MapNewMemfd(const char* name, uint64_t size) {
  absl::StatusOr<int> memfd = rp::CreateSealedMemfd(name, size);
  if (!memfd.ok()) return memfd.status();
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, *memfd, 0);
  if (base == MAP_FAILED) {
    close(*memfd);
    return absl::ResourceExhaustedError(absl::StrCat("cannot map ", size, " bytes of ", name));
  }
  return MappedMemfd{*memfd, static_cast<char*>(base)};
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedMemoryPlane>> SharedMemoryPlane::Open(
    grpc::Channel* channel, const ClientOptions& options) {
  std::unique_ptr<SharedMemoryPlane> plane(new SharedMemoryPlane());
  if (absl::Status s = plane->Connect(channel, options); !s.ok()) return s;
  return plane;
}

absl::Status SharedMemoryPlane::Connect(grpc::Channel* channel, const ClientOptions& options) {
  std::unique_ptr<v1::DataPlane::Stub> stub =
      v1::DataPlane::NewStub(std::shared_ptr<grpc::Channel>(channel, [](grpc::Channel*) {}));
  grpc::ClientContext context;
  PrepareContext(&context, options);
  v1::GetDataPlaneRequest request;
  v1::GetDataPlaneResponse response;
  absl::Status status = FromGrpcStatus(stub->GetDataPlane(&context, request, &response));
  if (status.code() == absl::StatusCode::kUnimplemented) {
    return absl::FailedPreconditionError(
        "the daemon has no shared-memory data plane (it predates DataPlane.GetDataPlane); use "
        "DataPlane::kWire or kAuto");
  }
  if (!status.ok()) return status;
  if (response.region_socket().empty()) {
    return absl::FailedPreconditionError(
        "the daemon offers no region socket (it listens on a non-loopback address without "
        "--region_socket, or runs with --region_socket=none); step over the wire "
        "(DataPlane::kWire, or kAuto, which falls back to it; Python: data_plane=\"wire\" or "
        "\"auto\", without shared_buffers)");
  }
  rp::Reply hello;
  absl::StatusOr<int> socket = rp::Connect(response.region_socket(), &hello);
  if (!socket.ok() && absl::IsResourceExhausted(socket.status())) {
    return socket.status();  // The daemon's limit of connections, said by it.
  }
  if (!socket.ok()) {
    const bool denied = absl::StrContains(socket.status().message(), "ermission denied");
    return absl::FailedPreconditionError(absl::StrCat(
        "the daemon's region socket ", response.region_socket(), " cannot be reached from here (",
        socket.status().message(), "): ",
        denied ? "this user may not connect to it (the daemon's --socket_mode, 0660 by default, "
                 "lets its own user and group in: run as that user or in that group, or start "
                 "the daemon with another --socket_mode); "
               : "the daemon runs on another host, or in a container whose socket volume this "
                 "one does not mount; ",
        "step over the wire (DataPlane::kWire, or kAuto, which falls back to it; Python: "
        "data_plane=\"wire\" or \"auto\", without shared_buffers)"));
  }
  if (std::string(reinterpret_cast<const char*>(hello.daemon_id), rp::kKeyBytes) !=
      response.daemon_id()) {
    close(*socket);
    return absl::FailedPreconditionError(absl::StrCat(
        "the region socket ", response.region_socket(),
        " here belongs to another daemon than the one at the target (a daemon on another host "
        "with the same path?); step over the wire (DataPlane::kWire, or kAuto, which falls back to "
        "it; Python: data_plane=\"wire\" or \"auto\", without shared_buffers)"));
  }
  if (!options.token.empty()) {
    // The region socket authenticates with the call's token (a daemon
    // without tenants answers OK).
    if (absl::Status s = rp::Authenticate(*socket, options.token); !s.ok()) {
      close(*socket);
      return absl::Status(
          s.code(), absl::StrCat("the daemon's region socket refused the token: ", s.message()));
    }
  }
  if (socket_ >= 0) close(socket_);
  socket_ = *socket;
  session_key_.assign(reinterpret_cast<const char*>(hello.session_key), rp::kKeyBytes);
  return absl::OkStatus();
}

SharedMapping::~SharedMapping() {
  munmap(base, bytes);
  close(memfd);
}

SharedMemoryPlane::~SharedMemoryPlane() {
  if (socket_ >= 0) close(socket_);
  if (base_ != nullptr) munmap(base_, size_);
  if (memfd_ >= 0) close(memfd_);
}

bool SharedMemoryPlane::ConnectionLost() const {
  if (socket_ < 0) return true;
  pollfd p{socket_, POLLIN, 0};
  // The daemon never writes unasked: anything readable is its end closing.
  return poll(&p, 1, 0) != 0;
}

absl::StatusOr<uint64_t> SharedMemoryPlane::RegisterFd(int fd) {
  rp::Request request;
  request.op = static_cast<uint32_t>(rp::Op::kRegister);
  absl::StatusOr<rp::Reply> reply = rp::Call(socket_, request, fd);
  if (!reply.ok()) return reply.status();
  if (absl::Status s = rp::StatusOf(*reply); !s.ok()) return s;
  return reply->region;
}

absl::Status SharedMemoryPlane::RegisterRegion() {
  absl::StatusOr<uint64_t> id = RegisterFd(memfd_);
  if (!id.ok()) return id.status();
  region_id_ = *id;
  return absl::OkStatus();
}

absl::Status SharedMemoryPlane::Reconnect(grpc::Channel* channel, const ClientOptions& options) {
  if (absl::Status s = Connect(channel, options); !s.ok()) return s;
  absl::Status registered = absl::OkStatus();
  if (memfd_ >= 0) registered = RegisterRegion();
  for (SharedRegion& region : shared_) {
    if (!registered.ok()) break;
    std::shared_ptr<SharedMapping> mapping = region.mapping.lock();
    if (mapping == nullptr) continue;  // ForgetDestroyed drops it.
    absl::StatusOr<uint64_t> id = RegisterFd(mapping->memfd);
    if (id.ok()) region.id = *id;
    registered = id.status();
  }
  if (!registered.ok()) {
    // Some region ids are the daemon's before: no step may name them.
    close(socket_);
    socket_ = -1;
  }
  return registered;
}

absl::Status SharedMemoryPlane::ReconnectIfLost(grpc::Channel* channel,
                                                const ClientOptions& options) {
  if (!ConnectionLost()) return absl::OkStatus();
  absl::Status s = Reconnect(channel, options);
  refused_after_reconnect_ = false;
  if (s.ok()) return s;
  switch (s.code()) {
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      refused_after_reconnect_ = true;
      return absl::Status(s.code(), absl::StrCat("the daemon restarted (or closed this client's "
                                                 "region socket connection), and then: ",
                                                 s.message()));
    default:
      return absl::UnavailableError(
          absl::StrCat("the region socket connection was lost: ", s.message()));
  }
}

void SharedMemoryPlane::BeginStep() {
  ++steps_;
  ForgetDestroyed();
}

SharedMemoryPlane::InPlace SharedMemoryPlane::FindInPlace(
    const void* data, uint64_t bytes, std::vector<std::shared_ptr<SharedMapping>>* held) const {
  const uintptr_t p = reinterpret_cast<uintptr_t>(data);
  for (size_t r = 0; r < shared_.size(); ++r) {
    const SharedRegion& region = shared_[r];
    const uintptr_t base = reinterpret_cast<uintptr_t>(region.base);
    if (p < base || bytes > region.bytes || p - base > region.bytes - bytes) continue;
    std::shared_ptr<SharedMapping> mapping = region.mapping.lock();
    if (mapping == nullptr) continue;  // Destroyed: its address range may be reused.
    held->push_back(std::move(mapping));
    return InPlace{r, static_cast<uint64_t>(p - base)};
  }
  return InPlace{};
}

void SharedMemoryPlane::ForgetDestroyed() {
  for (size_t i = shared_.size(); i-- > 0;) {
    if (!shared_[i].mapping.expired()) continue;
    rp::Request unregister;
    unregister.op = static_cast<uint32_t>(rp::Op::kUnregister);
    unregister.region = shared_[i].id;
    (void)rp::Call(socket_, unregister);  // The daemon drops it with the session otherwise.
    shared_.erase(shared_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

absl::StatusOr<std::shared_ptr<SharedMapping>> SharedMemoryPlane::AllocateShared(
    grpc::Channel* channel, const ClientOptions& options, uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("a SharedBuffer needs at least one byte");
  if (absl::Status s = ReconnectIfLost(channel, options); !s.ok()) return s;
  ForgetDestroyed();
  const uint64_t size = AlignUp(bytes, 4096);
  absl::StatusOr<MappedMemfd> memfd = MapNewMemfd("optstate-shared-buffer", size);
  if (!memfd.ok()) return memfd.status();
  auto mapping = std::make_shared<SharedMapping>(memfd->fd, memfd->base, size);
  absl::StatusOr<uint64_t> id = RegisterFd(mapping->memfd);
  if (!id.ok()) return id.status();
  shared_.push_back({mapping, mapping->base, size, *id});
  return mapping;
}

void SharedMemoryPlane::ForgetArea(const std::string& group) {
  auto it = areas_.find(group);
  if (it == areas_.end()) return;
  // Its whole pages go back to the system at once, in this process and in
  // the daemon (the memfd's pages are shared): a hole reads as zeros, and
  // the size (sealed) stays. Best effort: a failure only keeps the pages.
  // Its offsets are not laid out again in this region: a chunk of an
  // abandoned step may still be writing there on the daemon.
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t begin = AlignUp(it->second.gradient_offset, page);
  const uint64_t end = (it->second.params_offset + it->second.params_capacity) / page * page;
  if (memfd_ >= 0 && end > begin) {
    (void)fallocate(memfd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, begin, end - begin);
  }
  areas_.erase(it);
}

absl::Status SharedMemoryPlane::EnsureAreas(absl::Span<const GroupStep> groups,
                                            const StepOptions& options) {
  const size_t grad_size = WireTypeSize(options.gradient_dtype);
  const size_t param_size = WireTypeSize(options.param_dtype);
  // The bytes a group's area must reserve: what this step needs, and at
  // least what it reserved before (same element count), so that steps
  // alternating dtypes settle on one area instead of laying out new ones.
  struct Need {
    uint64_t gradient = 0;
    uint64_t params = 0;
  };
  auto need_of = [&](const GroupStep& group) {
    const uint64_t n = group.gradient.size();
    Need need{AlignUp(n * grad_size, kAlignment), AlignUp(n * param_size, kAlignment)};
    auto it = areas_.find(group.group);
    if (it != areas_.end() && it->second.elements == n) {
      need.gradient = std::max(need.gradient, it->second.gradient_capacity);
      need.params = std::max(need.params, it->second.params_capacity);
    }
    return need;
  };
  auto fits = [&](const GroupStep& group) {
    auto it = areas_.find(group.group);
    if (it == areas_.end() || it->second.elements != group.gradient.size()) return false;
    const uint64_t n = group.gradient.size();
    return n * grad_size <= it->second.gradient_capacity &&
           n * param_size <= it->second.params_capacity;
  };
  absl::flat_hash_map<std::string, Need> misfits;
  for (const GroupStep& group : groups) {
    if (fits(group)) {
      areas_[group.group].last_used = steps_;
    } else {
      misfits[group.group] = need_of(group);
    }
  }
  if (misfits.empty()) return absl::OkStatus();
  uint64_t needed = 0;
  for (const auto& [name, need] : misfits) needed += need.gradient + need.params;
  auto place = [&](const std::string& name, uint64_t elements, const Need& need,
                   uint64_t last_used) {
    Area area{elements, used_, need.gradient, used_ + need.gradient, need.params, last_used};
    used_ += need.gradient + need.params;
    areas_[name] = area;
  };
  if (used_ + needed > size_) {
    // A new region, sized from what is live (never from the old size: space
    // left behind by areas laid out again, or by groups no longer stepped,
    // is not carried over). Live: the areas of this step and those a step
    // used in the last kAreaLifetimeSteps. Their contents need not move:
    // gradients are copied in and params written by every step.
    absl::flat_hash_map<std::string, Area> kept;
    uint64_t total = needed;
    for (const auto& [name, area] : areas_) {
      if (misfits.contains(name) || area.last_used + kAreaLifetimeSteps < steps_) continue;
      kept[name] = area;
      total += area.gradient_capacity + area.params_capacity;
    }
    const uint64_t size = AlignUp(std::max(2 * total, uint64_t{1} << 20), 4096);
    absl::StatusOr<MappedMemfd> memfd = MapNewMemfd("optstate-region", size);
    if (!memfd.ok()) return memfd.status();
    const int old_memfd = memfd_;
    char* const old_base = base_;
    const uint64_t old_size = size_, old_id = region_id_;
    memfd_ = memfd->fd;
    base_ = memfd->base;
    size_ = size;
    if (absl::Status s = RegisterRegion(); !s.ok()) {
      munmap(base_, size_);
      close(memfd_);
      memfd_ = old_memfd;
      base_ = old_base;
      size_ = old_size;
      region_id_ = old_id;
      return s;
    }
    if (old_base != nullptr) {
      rp::Request unregister;
      unregister.op = static_cast<uint32_t>(rp::Op::kUnregister);
      unregister.region = old_id;
      (void)rp::Call(socket_, unregister);  // The daemon drops it with the session otherwise.
      munmap(old_base, old_size);
      close(old_memfd);
    }
    areas_.clear();
    used_ = 0;
    for (const auto& [name, area] : kept) {
      place(name, area.elements, Need{area.gradient_capacity, area.params_capacity},
            area.last_used);
    }
  }
  for (const GroupStep& group : groups) {
    auto it = misfits.find(group.group);
    if (it == misfits.end()) continue;
    place(group.group, group.gradient.size(), it->second, steps_);
    misfits.erase(it);  // A name given twice is laid out once.
  }
  return absl::OkStatus();
}

}  // namespace optstate::client_internal
