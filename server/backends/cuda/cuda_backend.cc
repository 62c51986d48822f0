// CudaBackend: placement at attach, eager promotion after a delete (pages move
// in lazily with their next step), steps through the piece pipeline.
#include "server/backends/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "server/backends/cuda/cuda_status.h"
#include "server/backends/cuda/paging/step_plan.h"
#include "server/backends/cuda/pinned_host_allocator.h"
#include "server/backends/cuda/step_pipeline.h"
#include "server/base/log.h"

namespace optstate {

// Per-group backend state. `residency` entries follow the page mutexes; the
// device arrays change only under `mu` (promotion), together with the
// group's placement (Group::placement(), its one record), and stay valid
// while any page mutex of the group is held (they are freed only by
// DetachGroup, which runs with all of them held).
class CudaBackend::GroupState : public BackendGroupState {
 public:
  GroupState(uint64_t id, uint64_t num_pages) : id(id), residency(num_pages) {}

  const uint64_t id;
  PageResidency residency;
  absl::Mutex mu;
  float* device_p ABSL_GUARDED_BY(mu) = nullptr;
  float* device_m ABSL_GUARDED_BY(mu) = nullptr;
  float* device_v ABSL_GUARDED_BY(mu) = nullptr;
};

namespace {

PageGeometry GeometryOf(const Group& group) {
  return PageGeometry{group.page_elements(), group.num_elements()};
}

// The calling thread's current device; every entry point sets it, since
// steps arrive on any pool thread.
absl::Status UseDevice(int ordinal) { return CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice"); }

// Copies the element `ranges` from each array of `from` to the array of `to`
// at the same index (`kind` says which way) on one staging slot's stream and
// waits for them; adds the wait and, when every copy succeeded, `traffic` to
// the group's paging counters. `what` names the copy in an error. The one
// copy loop of ParamsWritten, ReadStateToHost and StateWritten.
absl::Status CopyRanges(StagingPool& pool, Group& group, absl::Span<const ElementRange> ranges,
                        const StepTraffic& traffic, absl::Span<float* const> from,
                        absl::Span<float* const> to, cudaMemcpyKind kind, const char* what) {
  if (ranges.empty()) return absl::OkStatus();
  uint64_t wait_us = 0;
  absl::Status s = RunCopiesOnSlot(
      pool,
      [&](cudaStream_t stream) {
        for (const ElementRange& r : ranges) {
          for (size_t k = 0; k < from.size(); ++k) {
            if (absl::Status c =
                    CudaStatus(cudaMemcpyAsync(to[k] + r.begin, from[k] + r.begin,
                                               (r.end - r.begin) * sizeof(float), kind, stream),
                               what);
                !c.ok()) {
              return c;
            }
          }
        }
        return absl::OkStatus();
      },
      &wait_us);
  PagingCounters& counters = group.counters().paging;
  counters.copy_wait_us.fetch_add(wait_us, std::memory_order_relaxed);
  if (!s.ok()) return s;
  AddTraffic(traffic, &counters);
  return absl::OkStatus();
}

// "group 'x' elements [b, e)": where a copy outside a step failed.
std::string RangeName(const Group& group, uint64_t begin, uint64_t end) {
  return absl::StrCat("group '", group.key().name, "' elements [", begin, ", ", end, ")");
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const CudaOptions& options,
                                                                 ThreadPool* threads) {
  absl::StatusOr<PagingStrategy> strategy = ParsePagingStrategy(options.paging);
  if (!strategy.ok()) return strategy.status();
  if (absl::Status s = CheckCudaOptions(options); !s.ok()) return s;
  absl::StatusOr<CudaDeviceInfo> device = ProbeCudaDevice(options.device);
  if (!device.ok()) return device.status();

  const uint64_t total =
      options.vram_total_bytes != 0 ? options.vram_total_bytes : device->total_bytes;
  const VramBudget budget(total, options.vram_reserved_bytes, options.vram_target_utilization);
  if (budget.target_utilization() != options.vram_target_utilization) {
    Log(LogLevel::kWarning, "--vram_target_utilization=", options.vram_target_utilization,
        " clamped to ", budget.target_utilization());
  }
  const uint64_t pool_bytes =
      static_cast<uint64_t>(options.staging_slots) * options.staging_slot_bytes;
  if (!budget.fits(pool_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the staging pool (", options.staging_slots, " x ", options.staging_slot_bytes,
                     " = ", pool_bytes, " bytes) does not fit the VRAM budget (", budget.ToString(),
                     "); lower --staging_slots or --staging_slot_bytes, or raise "
                     "--vram_target_utilization / lower --vram_reserved_bytes"));
  }
  absl::StatusOr<std::unique_ptr<StagingPool>> pool =
      StagingPool::Create(options.staging_slots, options.staging_slot_bytes);
  if (!pool.ok()) return pool.status();
  return std::unique_ptr<CudaBackend>(
      new CudaBackend(*std::move(device), *strategy, budget, *std::move(pool), threads));
}

CudaBackend::CudaBackend(CudaDeviceInfo device, PagingStrategy strategy, VramBudget budget,
                         std::unique_ptr<StagingPool> pool, ThreadPool* threads)
    : device_(std::move(device)),
      policy_(strategy, budget, pool->pool_bytes()),
      pool_(std::move(pool)),
      threads_(threads) {
  SetPinnedHostAllocatorDevice(device_.ordinal);
}

std::string CudaBackend::Describe() const {
  return absl::StrCat(device_.ToString(), ", paging=", PagingStrategyName(policy_.strategy()),
                      ", budget ", policy_.budget().ToString(), ", staging pool ", pool_->slots(),
                      " x ", pool_->slot_bytes(), " bytes");
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_.ordinal);
  pool_.reset();
}

HostAllocator* CudaBackend::host_allocator() { return PinnedHostAllocator(); }

CudaBackend::GroupState& CudaBackend::StateOf(Group& group) const {
  return static_cast<GroupState&>(*group.backend_state);
}

absl::Status CudaBackend::MakeResident(Group& group, GroupState& state, bool zero_fill) {
  const uint64_t bytes = group.num_elements() * sizeof(float);
  float* arrays[3] = {nullptr, nullptr, nullptr};
  for (float*& a : arrays) {
    if (cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&a), bytes); e != cudaSuccess) {
      cudaGetLastError();
      a = nullptr;
      for (float* b : arrays) {
        if (b != nullptr) cudaFree(b);
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          "could not allocate ", ResidentBytesFor(group.num_elements()),
          " bytes of VRAM for group '", group.key().name, "': ", cudaGetErrorString(e)));
    }
  }
  if (zero_fill) {
    uint64_t wait_us = 0;
    absl::Status zeroed = RunCopiesOnSlot(
        *pool_,
        [&](cudaStream_t stream) {
          for (float* a : arrays) {
            if (absl::Status s = CudaStatus(cudaMemsetAsync(a, 0, bytes, stream), "cudaMemset");
                !s.ok()) {
              return s;
            }
          }
          return absl::OkStatus();
        },
        &wait_us);
    if (!zeroed.ok()) {
      for (float* a : arrays) cudaFree(a);
      return zeroed;
    }
  }
  allocated_group_bytes_.fetch_add(ResidentBytesFor(group.num_elements()),
                                   std::memory_order_relaxed);
  absl::MutexLock lock(&state.mu);
  state.device_p = arrays[0];
  state.device_m = arrays[1];
  state.device_v = arrays[2];
  group.set_placement(Placement::kDeviceResident);
  return absl::OkStatus();
}

void CudaBackend::FreeDeviceArrays(Group& group, GroupState& state) {
  float* arrays[3];
  {
    absl::MutexLock lock(&state.mu);
    arrays[0] = std::exchange(state.device_p, nullptr);
    arrays[1] = std::exchange(state.device_m, nullptr);
    arrays[2] = std::exchange(state.device_v, nullptr);
    group.set_placement(Placement::kDevicePaged);
  }
  if (arrays[0] == nullptr) return;
  for (float* a : arrays) cudaFree(a);
  allocated_group_bytes_.fetch_sub(ResidentBytesFor(group.num_elements()),
                                   std::memory_order_relaxed);
}

absl::Status CudaBackend::AttachGroup(Group& group) {
  if (group.config().hyperparameters.amsgrad) {
    // The device kernel and the pager move params, m and v only.
    return absl::InvalidArgumentError(absl::StrCat(
        "group '", group.key().name,
        "': amsgrad=true is not supported by the CUDA backend (it keeps no max_exp_avg_sq on "
        "the device); register it with amsgrad=false, or run optstated with --backend=cpu"));
  }
  if (absl::Status s = UseDevice(device_.ordinal); !s.ok()) return s;
  absl::MutexLock lock(&groups_mu_);
  const uint64_t id = next_id_++;
  auto state = std::make_unique<GroupState>(id, group.num_pages());
  absl::StatusOr<Placement> placement =
      policy_.Admit(id, group.key().name, ResidentBytesFor(group.num_elements()));
  if (!placement.ok()) return placement.status();
  Placement placed = *placement;
  if (placed == Placement::kDeviceResident) {
    // A new group's host state is all zero, so zeroed device arrays hold
    // every page already; initial params follow through ParamsWritten.
    absl::Status resident = MakeResident(group, *state, /*zero_fill=*/true);
    if (resident.ok()) {
      state->residency.MarkOnDevice(0, group.num_pages());
    } else if (policy_.strategy() == PagingStrategy::kNone) {
      policy_.Remove(id);
      return resident;
    } else {
      Log(LogLevel::kWarning, resident.message(), "; the group is paged instead");
      policy_.FallBackToPaged(id);
      placed = Placement::kDevicePaged;
    }
  }
  group.set_placement(placed);
  groups_.emplace(id, &group);
  group.backend_state = std::move(state);
  return absl::OkStatus();
}

void CudaBackend::DetachGroup(Group& group) {
  if (group.backend_state == nullptr) return;
  (void)UseDevice(device_.ordinal);
  GroupState& state = StateOf(group);
  absl::MutexLock lock(&groups_mu_);
  groups_.erase(state.id);
  FreeDeviceArrays(group, state);
  // Promoted groups get their device arrays now; their pages move in with
  // the next step that touches them (see docs/cuda.md), so no page mutex of
  // theirs is needed here.
  for (uint64_t id : policy_.Remove(state.id)) {
    Group* other = groups_.at(id);
    absl::Status s = MakeResident(*other, StateOf(*other), /*zero_fill=*/false);
    if (!s.ok()) {
      Log(LogLevel::kWarning, s.message(), "; group '", other->key().name, "' stays paged");
      policy_.FallBackToPaged(id);
      continue;
    }
    Log(LogLevel::kInfo, "group '", other->key().name, "' moved into VRAM after '",
        group.key().name, "' was deleted");
  }
}

absl::Status CudaBackend::Apply(Group& group, uint64_t begin, uint64_t end, const void* grad,
                                WireType grad_type, const AdamWConstants& constants) {
  if (absl::Status s = UseDevice(device_.ordinal); !s.ok()) return s;
  GroupState& state = StateOf(group);
  StepArrays arrays;
  arrays.host_p = group.params();
  arrays.host_m = group.exp_avg();
  arrays.host_v = group.exp_avg_sq();
  Placement placement;
  {
    absl::MutexLock lock(&state.mu);
    placement = group.placement();
    if (placement == Placement::kDeviceResident) {
      arrays.device_p = state.device_p;
      arrays.device_m = state.device_m;
      arrays.device_v = state.device_v;
    }
  }
  const StepPlan plan =
      PlanStep(placement, state.residency, GeometryOf(group), begin, end, WireTypeSize(grad_type));
  uint64_t wait_us = 0;
  absl::Status s = RunStepPipeline(*pool_, threads_, arrays, begin, end, plan.page_ins, grad,
                                   grad_type, constants, &wait_us);
  PagingCounters& counters = group.counters().paging;
  counters.copy_wait_us.fetch_add(wait_us, std::memory_order_relaxed);
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat("CUDA step of group '", group.key().name,
                                            "' elements [", begin, ", ", end,
                                            ") failed: ", s.message()));
  }
  if (plan.on_device_arrays) state.residency.MarkOnDevice(plan.first_page, plan.end_page);
  AddTraffic(plan.traffic, &counters);
  return absl::OkStatus();
}

absl::Status CudaBackend::ParamsWritten(Group& group, uint64_t begin, uint64_t end) {
  if (absl::Status s = UseDevice(device_.ordinal); !s.ok()) return s;
  GroupState& state = StateOf(group);
  Placement placement;
  float* device_p;
  {
    absl::MutexLock lock(&state.mu);
    placement = group.placement();
    device_p = state.device_p;
  }
  const ParamsUploadPlan plan =
      PlanParamsUpload(placement, state.residency, GeometryOf(group), begin, end);
  float* const host_p = group.params();
  return CopyRanges(*pool_, group, plan.uploads, plan.traffic, absl::MakeConstSpan(&host_p, 1),
                    absl::MakeConstSpan(&device_p, 1), cudaMemcpyHostToDevice,
                    "cudaMemcpyAsync params to device");
}

absl::Status CudaBackend::ReadStateToHost(Group& group, uint64_t begin, uint64_t end) {
  if (group.backend_state == nullptr) return absl::OkStatus();  // Never attached: host only.
  GroupState& state = StateOf(group);
  Placement placement;
  float* device[3];
  {
    absl::MutexLock lock(&state.mu);
    placement = group.placement();
    device[0] = state.device_p;
    device[1] = state.device_m;
    device[2] = state.device_v;
  }
  const ParamsUploadPlan plan =
      PlanStateToHost(placement, state.residency, GeometryOf(group), begin, end);
  if (plan.uploads.empty()) return absl::OkStatus();
  float* const host[3] = {group.params(), group.exp_avg(), group.exp_avg_sq()};
  absl::Status s = UseDevice(device_.ordinal);
  if (s.ok()) {
    s = CopyRanges(*pool_, group, plan.uploads, plan.traffic, device, host, cudaMemcpyDeviceToHost,
                   "cudaMemcpyAsync state to host");
  }
  if (s.ok()) return s;
  return absl::InternalError(absl::StrCat("copying the state of ", RangeName(group, begin, end),
                                          " from the device failed: ", s.message()));
}

absl::Status CudaBackend::StateWritten(Group& group, uint64_t begin, uint64_t end) {
  if (group.backend_state == nullptr) return absl::OkStatus();
  GroupState& state = StateOf(group);
  Placement placement;
  float* device[3];
  {
    absl::MutexLock lock(&state.mu);
    placement = group.placement();
    device[0] = state.device_p;
    device[1] = state.device_m;
    device[2] = state.device_v;
  }
  const StateWrittenPlan plan =
      PlanStateWritten(placement, state.residency, GeometryOf(group), begin, end);
  state.residency.MarkOffDevice(plan.first_stale_page, plan.end_stale_page);
  if (plan.uploads.empty()) return absl::OkStatus();
  float* const host[3] = {group.params(), group.exp_avg(), group.exp_avg_sq()};
  absl::Status s = UseDevice(device_.ordinal);
  if (s.ok()) {
    s = CopyRanges(*pool_, group, plan.uploads, plan.traffic, host, device, cudaMemcpyHostToDevice,
                   "cudaMemcpyAsync state to device");
  }
  if (s.ok()) return s;
  group.mark_broken();
  return absl::InternalError(absl::StrCat("copying the new state of ", RangeName(group, begin, end),
                                          " to the device failed: ", s.message()));
}

absl::Status CudaBackend::SyncToHost(Group& group) {
  return ReadStateToHost(group, 0, group.num_elements());
}

BackendStats CudaBackend::Stats() const {
  BackendStats stats;
  const VramBudget& budget = policy_.budget();
  stats.strategy = std::string(PagingStrategyName(policy_.strategy()));
  stats.budget_total_bytes = budget.total_bytes();
  stats.budget_reserved_bytes = budget.reserved_bytes();
  stats.budget_target_utilization = budget.target_utilization();
  stats.budget_available_bytes = budget.available_bytes();
  stats.resident_bytes = policy_.resident_bytes();
  stats.staging_pool_bytes = pool_->pool_bytes();
  stats.staging_slots = static_cast<uint64_t>(pool_->slots());
  return stats;
}

}  // namespace optstate
