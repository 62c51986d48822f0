// The shared-memory data plane's client side: region life cycle, layout,
// copies in and out, and the Step stream of region chunks with resends.
#include "client/transport/shared_memory/shared_memory_plane.h"

#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client_impl.h"
#include "common/region_protocol.h"
#include "optstate/v1/dtype_proto.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "optstate/v1/step_wire_format.h"

namespace optstate::client_internal {
namespace {

namespace rp = region_protocol;

// Region chunks carry no payload, so messages may cover more of a step
// than the wire's chunk_bytes: fewer messages, less gRPC cost per step.
constexpr uint64_t kMinRegionChunkBytes = 4 << 20;
constexpr uint64_t kAlignment = 64;

uint64_t AlignUp(uint64_t value, uint64_t to) { return (value + to - 1) / to * to; }

bool Is16Bit(const ConstBufferView& view) { return view.element_bytes() == 2; }
bool Is16Bit(const BufferView& view) { return view.element_bytes() == 2; }

// INVALID_ARGUMENT naming the first element of `wire` (`count` of `type`)
// that is not finite after `scale`, as Client::Step words it; OK when all are.
absl::Status CheckFinite(const GroupStep& group, WireType type, const char* wire, size_t count,
                         float scale) {
  if (std::fabs(scale) <= 1.0f && AllWireFinite(type, wire, count)) return absl::OkStatus();
  constexpr size_t kBlock = 4096;
  float widened[kBlock];
  const size_t size = WireTypeSize(type);
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t n = std::min(kBlock, count - begin);
    DecodeToFloat(type, wire + begin * size, widened, n);
    for (size_t i = 0; i < n; ++i) {
      if (std::fabs(widened[i] * scale) <= FLT_MAX) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient of group '", group.group, "' at element ", begin + i, " is ", widened[i],
          " as ", WireTypeName(type), ", which is not finite after grad_scale ", scale,
          "; the whole step was refused and nothing was sent"));
    }
  }
  return absl::OkStatus();
}

// Calls prepare(i) for every group, in order within each of up to
// kMaxPrepareThreads contiguous ranges of about equal gradient bytes, the
// first range on this thread and the others on threads of their own (one
// range for a step under kBytesPerPrepareThread a thread). The status of
// the lowest index that failed, so the error names the step's first bad
// element; OK when none did. `prepare` must be safe to call concurrently
// for different groups.
constexpr size_t kMaxPrepareThreads = 4;
constexpr uint64_t kBytesPerPrepareThread = 8 << 20;

absl::Status ForEachGroupSplit(absl::Span<const GroupStep> groups,
                               const std::function<absl::Status(size_t)>& prepare) {
  uint64_t total = 0;
  for (const GroupStep& group : groups) {
    total += group.gradient.size() * group.gradient.element_bytes();
  }
  const size_t cpus = std::max(1u, std::thread::hardware_concurrency());
  const size_t ranges = std::min<uint64_t>(
      {kMaxPrepareThreads, cpus, std::max<uint64_t>(1, total / kBytesPerPrepareThread)});
  // Range r covers groups [bounds[r], bounds[r + 1]).
  std::vector<size_t> bounds = {0};
  uint64_t seen = 0;
  for (size_t i = 0; i < groups.size() && bounds.size() < ranges; ++i) {
    seen += groups[i].gradient.size() * groups[i].gradient.element_bytes();
    if (seen * ranges >= total * bounds.size()) bounds.push_back(i + 1);
  }
  bounds.push_back(groups.size());
  std::vector<absl::Status> first_error(bounds.size() - 1);
  std::vector<size_t> failed_at(bounds.size() - 1, SIZE_MAX);
  auto run = [&](size_t r) {
    for (size_t i = bounds[r]; i < bounds[r + 1]; ++i) {
      absl::Status s = prepare(i);
      if (s.ok()) continue;
      first_error[r] = std::move(s);
      failed_at[r] = i;
      return;
    }
  };
  std::vector<std::thread> helpers;
  for (size_t r = 1; r + 1 < bounds.size(); ++r) helpers.emplace_back(run, r);
  run(0);
  for (std::thread& helper : helpers) helper.join();
  for (size_t r = 0; r < failed_at.size(); ++r) {
    if (failed_at[r] != SIZE_MAX) return first_error[r];  // Ranges are in order.
  }
  return absl::OkStatus();
}

// The step as one message of whole-group chunks, when every gradient and
// params_out lies in a SharedBuffer (`in_place`), the step has at most
// kMaxOneMessageGroups groups, and the message takes at most half of
// max_message_bytes; std::nullopt otherwise.
constexpr size_t kMaxOneMessageGroups = 1024;
static_assert(kMaxOneMessageGroups <= kMaxPackedChunks);
// A chunk's fields beside its group name, generously: ids, offsets, sizes,
// dtypes, lr, grad_scale, the session key and their framing.
constexpr uint64_t kRegionChunkFieldsBytes = 160;

std::optional<std::vector<PlannedPieces>> OneMessagePlan(absl::Span<const ChunkGroup> layouts,
                                                         bool in_place,
                                                         const ClientOptions& options) {
  if (!in_place || layouts.empty() || layouts.size() > kMaxOneMessageGroups) return std::nullopt;
  uint64_t bytes = 0;
  for (const ChunkGroup& group : layouts) bytes += group.name.size() + kRegionChunkFieldsBytes;
  if (bytes > static_cast<uint64_t>(options.max_message_bytes) / 2) return std::nullopt;
  PlannedPieces message;
  for (size_t g = 0; g < layouts.size(); ++g) message.push_back({g, 0, layouts[g].num_elements});
  return std::vector<PlannedPieces>{std::move(message)};
}

// The bytes of a reply, gathered (region replies carry no payload).
bool Gather(grpc::ByteBuffer* buffer, std::string* out) {
  std::vector<grpc::Slice> slices;
  if (!buffer->Dump(&slices).ok()) return false;
  out->clear();
  for (const grpc::Slice& s : slices)
    out->append(reinterpret_cast<const char*>(s.begin()), s.size());
  return true;
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
  SetDeadline(&context, options);
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
        "--region_socket, or runs with --region_socket=none); use DataPlane::kWire or kAuto");
  }
  rp::Reply hello;
  absl::StatusOr<int> socket = rp::Connect(response.region_socket(), &hello);
  if (!socket.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the daemon's region socket ", response.region_socket(), " cannot be reached from here (",
        socket.status().message(),
        "): the daemon runs on another host, or in a container whose socket volume this one "
        "does not mount; use DataPlane::kWire or kAuto"));
  }
  if (std::string(reinterpret_cast<const char*>(hello.daemon_id), rp::kKeyBytes) !=
      response.daemon_id()) {
    close(*socket);
    return absl::FailedPreconditionError(absl::StrCat(
        "the region socket ", response.region_socket(),
        " here belongs to another daemon than the one at the target (a daemon on another host "
        "with the same path?); use DataPlane::kWire or kAuto"));
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
  if (memfd_ >= 0) {
    if (absl::Status s = RegisterRegion(); !s.ok()) return s;
  }
  for (SharedRegion& region : shared_) {
    std::shared_ptr<SharedMapping> mapping = region.mapping.lock();
    if (mapping == nullptr) continue;  // ForgetDestroyed drops it.
    absl::StatusOr<uint64_t> id = RegisterFd(mapping->memfd);
    if (!id.ok()) return id.status();
    region.id = *id;
  }
  return absl::OkStatus();
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
  if (ConnectionLost()) {
    if (absl::Status s = Reconnect(channel, options); !s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the region socket connection was lost: ", s.message()));
    }
  }
  ForgetDestroyed();
  const uint64_t size = AlignUp(bytes, 4096);
  absl::StatusOr<int> memfd = rp::CreateSealedMemfd("optstate-shared-buffer", size);
  if (!memfd.ok()) return memfd.status();
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, *memfd, 0);
  if (base == MAP_FAILED) {
    close(*memfd);
    return absl::ResourceExhaustedError(absl::StrCat("cannot map a buffer of ", size, " bytes"));
  }
  auto mapping = std::make_shared<SharedMapping>(*memfd, static_cast<char*>(base), size);
  absl::StatusOr<uint64_t> id = RegisterFd(mapping->memfd);
  if (!id.ok()) return id.status();
  shared_.push_back({mapping, mapping->base, size, *id});
  return mapping;
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
    absl::StatusOr<int> memfd = rp::CreateSealedMemfd("optstate-region", size);
    if (!memfd.ok()) return memfd.status();
    void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, *memfd, 0);
    if (base == MAP_FAILED) {
      close(*memfd);
      return absl::ResourceExhaustedError(absl::StrCat("cannot map a region of ", size, " bytes"));
    }
    const int old_memfd = memfd_;
    char* const old_base = base_;
    const uint64_t old_size = size_, old_id = region_id_;
    memfd_ = *memfd;
    base_ = static_cast<char*>(base);
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

absl::Status SharedMemoryPlane::Step(grpc::Channel* channel,
                                     const grpc::internal::RpcMethod& method,
                                     const ClientOptions& client_options,
                                     absl::Span<const GroupStep> groups,
                                     absl::Span<const ChunkGroup> layouts, uint64_t step,
                                     const StepOptions& options, bool* layout_failed) {
  *layout_failed = false;
  ++steps_;
  ForgetDestroyed();
  const size_t grad_size = WireTypeSize(options.gradient_dtype);
  const size_t param_size = WireTypeSize(options.param_dtype);
  // 1. Which gradients and params_outs lie in a SharedBuffer, in the wire
  //    type: those are named where they are (their mappings held for the
  //    step); the others go through the groups' areas.
  struct InPlace {
    size_t region = SIZE_MAX;  // Index into shared_; SIZE_MAX: not in place.
    uint64_t offset = 0;
  };
  std::vector<std::shared_ptr<SharedMapping>> held;
  auto find = [&](const void* data, uint64_t bytes) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(data);
    for (size_t r = 0; r < shared_.size(); ++r) {
      const SharedRegion& region = shared_[r];
      const uintptr_t base = reinterpret_cast<uintptr_t>(region.base);
      if (p < base || bytes > region.bytes || p - base > region.bytes - bytes) continue;
      std::shared_ptr<SharedMapping> mapping = region.mapping.lock();
      if (mapping == nullptr) continue;  // Destroyed: its address range may be reused.
      held.push_back(std::move(mapping));
      return InPlace{r, static_cast<uint64_t>(p - base)};
    }
    return InPlace{};
  };
  std::vector<InPlace> grad_at(groups.size()), params_at(groups.size());
  std::vector<GroupStep> through_areas;
  for (size_t i = 0; i < groups.size() && !shared_.empty(); ++i) {
    const GroupStep& group = groups[i];
    const uint64_t n = group.gradient.size();
    if (Is16Bit(group.gradient) || options.gradient_dtype == WireType::kFloat32) {
      grad_at[i] = find(group.gradient.data(), n * grad_size);
    }
    if (!group.params_out.empty() &&
        (Is16Bit(group.params_out) || options.param_dtype == WireType::kFloat32)) {
      params_at[i] = find(group.params_out.data(), n * param_size);
    }
    const InPlace& g = grad_at[i];
    const InPlace& p = params_at[i];
    if (g.region != SIZE_MAX && g.region == p.region && g.offset < p.offset + n * param_size &&
        p.offset < g.offset + n * grad_size) {
      params_at[i] = InPlace{};  // The daemon refuses overlapping slices: copy these out.
    }
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    if (grad_at[i].region == SIZE_MAX || params_at[i].region == SIZE_MAX) {
      through_areas.push_back(groups[i]);
    }
  }
  if (!through_areas.empty()) {
    if (absl::Status s = EnsureAreas(through_areas, options); !s.ok()) {
      *layout_failed = true;
      return s;
    }
  }
  // 2. A step whose gradients and params all lie in SharedBuffers goes as
  //    one message of whole-group chunks: the daemon checks every chunk's
  //    gradient before it applies any (on its threads), which is the
  //    whole-step refusal, so the client reads none of them. Otherwise the
  //    gradients not in place are copied into their areas (the one copy),
  //    every gradient checked finite where the daemon will read it, a large
  //    step on several threads (the daemon has nothing to do meanwhile), and
  //    the step planned as on the wire but in larger messages.
  std::optional<std::vector<PlannedPieces>> one_message =
      OneMessagePlan(layouts, through_areas.empty(), client_options);
  const float scale = options.grad_scale.value_or(1.0f);
  auto prepare = [&](size_t i) -> absl::Status {
    const GroupStep& group = groups[i];
    const size_t n = group.gradient.size();
    if (grad_at[i].region != SIZE_MAX) {
      const char* in_place = static_cast<const char*>(group.gradient.data());
      return CheckFinite(group, options.gradient_dtype, in_place, n, scale);
    }
    // Copied block by block, each checked while it is still in cache (one
    // pass over memory: bench/copy-check-bench measured blocks of 16-256 Ki
    // elements alike, and 1.5-2x faster than a 64 MiB group copied, then
    // checked); CheckFinite names the first bad element if any.
    char* dst = base_ + areas_.at(group.group).gradient_offset;
    bool finite = std::fabs(scale) <= 1.0f;
    constexpr size_t kBlock = 16384;
    for (size_t begin = 0; begin < n; begin += kBlock) {
      const size_t count = std::min(kBlock, n - begin);
      char* block = dst + begin * grad_size;
      if (Is16Bit(group.gradient)) {
        std::memcpy(block, static_cast<const uint16_t*>(group.gradient.data()) + begin, count * 2);
      } else {
        EncodeFromFloat(options.gradient_dtype,
                        static_cast<const float*>(group.gradient.data()) + begin, block, count);
      }
      if (finite) finite = AllWireFinite(options.gradient_dtype, block, count);
    }
    if (finite) return absl::OkStatus();
    return CheckFinite(group, options.gradient_dtype, dst, n, scale);
  };
  absl::StatusOr<std::vector<PlannedPieces>> plan;
  if (one_message.has_value()) {
    plan = *std::move(one_message);
  } else {
    if (absl::Status s = ForEachGroupSplit(groups, prepare); !s.ok()) return s;
    const ChunkLimits limits{std::max(client_options.chunk_bytes, kMinRegionChunkBytes),
                             static_cast<uint64_t>(client_options.max_message_bytes),
                             options.gradient_dtype, options.param_dtype};
    plan = PlanChunks(layouts, limits);
    if (!plan.ok()) return plan.status();
  }
  // 3. The messages.
  std::vector<size_t> pending(plan->size());
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;

  auto build = [&](const PlannedPieces& pieces) {
    v1::StepRequest outer;
    for (size_t k = 0; k < pieces.size(); ++k) {
      const ChunkPiece& piece = pieces[k];
      const GroupStep& group = groups[piece.group];
      v1::StepRequest* fields = k == 0 ? &outer : outer.add_more();
      client_internal::ChunkFields(group, piece, step, options, fields);
      fields->set_region_session(session_key_);
      const InPlace& gi = grad_at[piece.group];
      const InPlace& pi = params_at[piece.group];
      const Area* area =
          gi.region == SIZE_MAX || pi.region == SIZE_MAX ? &areas_[group.group] : nullptr;
      v1::RegionSlice* g = fields->mutable_gradient_region();
      g->set_region(gi.region != SIZE_MAX ? shared_[gi.region].id : region_id_);
      g->set_offset((gi.region != SIZE_MAX ? gi.offset : area->gradient_offset) +
                    piece.offset * grad_size);
      g->set_bytes(piece.count * grad_size);
      v1::RegionSlice* p = fields->mutable_params_region();
      p->set_region(pi.region != SIZE_MAX ? shared_[pi.region].id : region_id_);
      p->set_offset((pi.region != SIZE_MAX ? pi.offset : area->params_offset) +
                    piece.offset * param_size);
      p->set_bytes(piece.count * param_size);
    }
    const std::string bytes = outer.SerializeAsString();
    grpc::Slice slice(bytes);
    return grpc::ByteBuffer(&slice, 1);
  };
  // The reply to message `i`, checked against what it answers; then its
  // params copied out of the region.
  auto take_reply = [&](size_t i, grpc::ByteBuffer* buffer) -> absl::Status {
    const PlannedPieces& pieces = (*plan)[i];
    std::string bytes;
    v1::StepResponse reply;
    if (!Gather(buffer, &bytes) || !reply.ParseFromString(bytes) ||
        static_cast<size_t>(reply.more_size()) + 1 != pieces.size()) {
      return absl::InternalError(absl::StrCat("reply to message ", i, " is not its StepResponse"));
    }
    for (size_t k = 0; k < pieces.size(); ++k) {
      const v1::StepResponse& r = k == 0 ? reply : reply.more(static_cast<int>(k - 1));
      const ChunkPiece& piece = pieces[k];
      const GroupStep& group = groups[piece.group];
      if (r.group() != group.group || r.offset() != piece.offset || !r.params_in_region()) {
        return absl::InternalError(absl::StrCat("reply to message ", i, " is for group '",
                                                r.group(), "' offset ", r.offset(), "; expected '",
                                                group.group, "' offset ", piece.offset,
                                                " with its params in the region"));
      }
    }
    for (const ChunkPiece& piece : pieces) {
      const GroupStep& group = groups[piece.group];
      if (group.params_out.empty() || params_at[piece.group].region != SIZE_MAX) continue;
      const char* src = base_ + areas_[group.group].params_offset + piece.offset * param_size;
      if (Is16Bit(group.params_out)) {
        std::memcpy(static_cast<uint16_t*>(group.params_out.data()) + piece.offset, src,
                    piece.count * 2);
      } else {
        DecodeToFloat(options.param_dtype, src,
                      static_cast<float*>(group.params_out.data()) + piece.offset, piece.count);
      }
    }
    return absl::OkStatus();
  };

  absl::Status last;
  for (int attempt = 0; attempt < client_options.max_attempts && !pending.empty(); ++attempt) {
    if (attempt > 0) absl::SleepFor(Backoff(client_options, attempt));
    if (ConnectionLost()) {
      // The daemon restarted (or closed our session) since the last step or
      // attempt: the same memfds, gradients in them, are registered anew.
      absl::Status s = Reconnect(channel, client_options);
      if (!s.ok()) {
        last = absl::UnavailableError(
            absl::StrCat("the region socket connection was lost: ", s.message()));
        continue;
      }
    }
    grpc::ClientContext context;
    SetDeadline(&context, client_options);
    std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
        grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
            channel, method, &context));
    // Region messages are small: the writer sends them all (gRPC's flow
    // control and the daemon's read-ahead bound what is in flight).
    std::vector<grpc::ByteBuffer> requests;
    requests.reserve(pending.size());
    for (size_t i : pending) requests.push_back(build((*plan)[i]));
    std::thread writer([&] {
      for (grpc::ByteBuffer& request : requests) {
        if (!stream->Write(request)) break;
      }
      stream->WritesDone();
    });
    absl::Status mismatch;
    size_t answered = 0;
    grpc::ByteBuffer reply;
    while (answered < pending.size() && stream->Read(&reply)) {
      mismatch = take_reply(pending[answered], &reply);
      if (!mismatch.ok()) break;
      ++answered;
    }
    if (!mismatch.ok()) context.TryCancel();
    writer.join();
    absl::Status status = FromGrpcStatus(stream->Finish());
    pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(answered));
    if (!mismatch.ok()) return mismatch;
    if (pending.empty()) return absl::OkStatus();
    if (status.ok() || status.code() == absl::StatusCode::kCancelled) {
      status = absl::UnavailableError(
          absl::StrCat("the stream ended after ", answered, " replies: ", status.message()));
    }
    last = status;
    if (!IsRetryable(last)) return last;
  }
  if (pending.empty()) return absl::OkStatus();
  return absl::Status(last.code(),
                      absl::StrCat("step ", step, " failed after ", client_options.max_attempts,
                                   " attempts (shared memory): ", last.message()));
}

std::optional<absl::Status> DataPlaneChoice::Decide(grpc::Channel* channel,
                                                    const ClientOptions& client_options) {
  if (decided_) return std::nullopt;
  absl::StatusOr<std::unique_ptr<SharedMemoryPlane>> plane =
      SharedMemoryPlane::Open(channel, client_options);
  if (plane.ok()) {
    plane_ = std::move(*plane);
    decided_ = true;
  } else if (plane.status().code() == absl::StatusCode::kFailedPrecondition) {
    why_not_ = plane.status();
    decided_ = true;
  } else {
    return plane.status();  // The daemon did not answer: decide next time.
  }
  return std::nullopt;
}

std::optional<absl::Status> DataPlaneChoice::MaybeStep(grpc::Channel* channel,
                                                       const grpc::internal::RpcMethod& method,
                                                       const ClientOptions& client_options,
                                                       absl::Span<const GroupStep> groups,
                                                       absl::Span<const ChunkGroup> layouts,
                                                       uint64_t step, const StepOptions& options) {
  if (client_options.data_plane == DataPlane::kWire) return std::nullopt;
  absl::MutexLock lock(&mu_);
  if (std::optional<absl::Status> unanswered = Decide(channel, client_options)) {
    if (client_options.data_plane == DataPlane::kSharedMemory) return unanswered;
    return std::nullopt;  // The wire step retries, or reports, the same trouble.
  }
  if (plane_ != nullptr) {
    bool layout_failed = false;
    absl::Status s = plane_->Step(channel, method, client_options, groups, layouts, step, options,
                                  &layout_failed);
    if (layout_failed && client_options.data_plane != DataPlane::kSharedMemory) {
      return std::nullopt;  // kAuto: this step takes the wire.
    }
    return s;
  }
  if (client_options.data_plane == DataPlane::kSharedMemory) return why_not_;
  return std::nullopt;
}

absl::StatusOr<std::shared_ptr<SharedMapping>> DataPlaneChoice::AllocateShared(
    grpc::Channel* channel, const ClientOptions& client_options, uint64_t bytes) {
  if (client_options.data_plane == DataPlane::kWire) {
    return absl::FailedPreconditionError(
        "this client's data plane is the wire (ClientOptions::data_plane kWire): shared buffers "
        "need kAuto or kSharedMemory");
  }
  absl::MutexLock lock(&mu_);
  if (std::optional<absl::Status> unanswered = Decide(channel, client_options)) {
    return *unanswered;
  }
  if (plane_ == nullptr) return why_not_;
  return plane_->AllocateShared(channel, client_options, bytes);
}

}  // namespace optstate::client_internal
