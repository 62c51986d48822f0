// CPU backend: the range is cut into cache-friendly shards run on the pool.
#include "server/backends/cpu/cpu_backend.h"

#include <algorithm>

namespace optstate {
namespace {

// The kernel over the group's elements [at, at + n), their gradient at
// `grad`, the updated params narrowed into `out` (null: not written). With
// `ahead` (and `out`), the update also checks it, and the answer is whether
// every element of it is finite (AdamWUpdateAndEncodeCheckingAhead); true
// otherwise.
bool UpdatePiece(Group& group, uint64_t at, size_t n, const char* grad, WireType grad_type,
                 const AdamWConstants& constants, unsigned char* out, WireType params_type,
                 ParamsStore store, const GradientRange* ahead = nullptr) {
  float* const max_exp_avg_sq = group.max_exp_avg_sq();  // Null without amsgrad.
  float* const vmax = max_exp_avg_sq == nullptr ? nullptr : max_exp_avg_sq + at;
  float* const p = group.params() + at;
  float* const m = group.exp_avg() + at;
  float* const v = group.exp_avg_sq() + at;
  if (out == nullptr) {
    AdamWUpdate(constants, p, m, v, grad, grad_type, n, vmax);
    return true;
  }
  if (ahead != nullptr) {
    return AdamWUpdateAndEncodeCheckingAhead(constants, p, m, v, grad, grad_type, n, out,
                                             params_type, store, vmax, *ahead);
  }
  AdamWUpdateAndEncode(constants, p, m, v, grad, grad_type, n, out, params_type, store, vmax);
  return true;
}

}  // namespace

absl::Status CpuBackend::AttachGroup(Group& group) {
  group.set_placement(Placement::kHost);
  return absl::OkStatus();
}

absl::Status CpuBackend::Apply(Group& group, uint64_t begin, uint64_t end, const void* grad,
                               WireType grad_type, const AdamWConstants& constants) {
  const SegmentedBytes whole(
      absl::string_view(static_cast<const char*>(grad), (end - begin) * WireTypeSize(grad_type)));
  Run(group, begin, end, whole, 0, grad_type, constants, nullptr, WireType::kFloat32,
      ParamsStore::kCached);
  return absl::OkStatus();
}

absl::Status CpuBackend::ApplyAndEncode(Group& group, uint64_t begin, uint64_t end,
                                        const SegmentedBytes& gradient, size_t grad_offset,
                                        WireType grad_type, const AdamWConstants& constants,
                                        void* params_out, WireType params_type, ParamsStore store) {
  Run(group, begin, end, gradient, grad_offset, grad_type, constants, params_out, params_type,
      store);
  return absl::OkStatus();
}

absl::Status CpuBackend::ApplyAndEncodeCheckingAhead(
    Group& group, uint64_t begin, uint64_t end, const SegmentedBytes& gradient, size_t grad_offset,
    WireType grad_type, const AdamWConstants& constants, void* params_out, WireType params_type,
    ParamsStore store, const GradientRange& ahead, bool* ahead_finite) {
  const size_t params_size = WireTypeSize(params_type);
  auto* out_bytes = static_cast<unsigned char*>(params_out);
  const GradientRange* unread = &ahead;  // Read by the first piece's update.
  bool finite = true;
  gradient.ForEachElementRun(grad_offset, WireTypeSize(grad_type), end - begin,
                             [&](size_t first, size_t n, const char* grad) {
                               const bool piece_finite = UpdatePiece(
                                   group, begin + first, n, grad, grad_type, constants,
                                   out_bytes + first * params_size, params_type, store, unread);
                               if (unread != nullptr) finite = piece_finite;
                               unread = nullptr;
                               return true;
                             });
  if (unread != nullptr) {  // An empty range.
    finite =
        FindNonFiniteGradient(ahead.data, ahead.type, ahead.count, ahead.grad_scale) == ahead.count;
  }
  *ahead_finite = finite;
  return absl::OkStatus();
}

void CpuBackend::Run(Group& group, uint64_t begin, uint64_t end, const SegmentedBytes& gradient,
                     size_t grad_offset, WireType grad_type, const AdamWConstants& constants,
                     void* params_out, WireType params_type, ParamsStore store) {
  // Shards are multiples of 64 elements so every shard but the last keeps
  // the kernel on its vector path; small ranges stay on one thread. Within a
  // shard, the kernel runs once per piece of the gradient (an element split
  // between pieces on its own); it gives the same bits however a range is cut.
  constexpr uint64_t kMinShard = 16384;
  const uint64_t count = end - begin;
  const uint64_t threads = static_cast<uint64_t>(pool_->size());
  uint64_t shard = (count + threads - 1) / threads;
  shard = std::max<uint64_t>(kMinShard, (shard + 63) / 64 * 64);
  const uint64_t shards = (count + shard - 1) / shard;
  const size_t grad_size = WireTypeSize(grad_type);
  const size_t params_size = WireTypeSize(params_type);
  auto* out_bytes = static_cast<unsigned char*>(params_out);
  pool_->ParallelFor(shards, [&](size_t i) {
    const uint64_t first = i * shard;
    const uint64_t last = std::min(count, first + shard);
    gradient.ForEachElementRun(
        grad_offset + first * grad_size, grad_size, last - first,
        [&](size_t run_first, size_t n, const char* grad) {
          UpdatePiece(
              group, begin + first + run_first, n, grad, grad_type, constants,
              out_bytes == nullptr ? nullptr : out_bytes + (first + run_first) * params_size,
              params_type, store);
          return true;
        });
  });
}

BackendStats CpuBackend::Stats() const {
  BackendStats stats;
  stats.strategy = "host";
  return stats;
}

}  // namespace optstate
