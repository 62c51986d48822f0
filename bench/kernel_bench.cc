// bench/kernel: the CPU AdamW step (CpuBackend::Apply, so sharding is
// included) against two same-run baselines: a memory pass with AdamW's
// traffic (the practical limit) and the textbook AdamW loop; and the step
// that also writes the params out (CpuBackend::ApplyAndEncode, float32, and
// bfloat16 in and out as a bf16 model's step), with plain and with
// streaming stores, as into a reply and into a shared-memory region; and
// the step on each vector path the CPU runs; and the daemon's finite check
// of a gradient (float32 and bfloat16, scaled by 1 and by 2) against a
// read-only pass over the same bytes (what the check costs beside the step
// it guards).
// Arguments of every benchmark: {elements, threads}. Counters: elem/s and
// GB/s at 28 bytes per element (read p, g, m, v; write p, m, v), 32 for the
// step that writes float32 params out too (26 for bfloat16 in and out), the
// gradient's element size for the check, 4 for the read pass.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "bench/kernel_baselines.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/base/segmented_bytes.h"
#include "server/base/thread_pool.h"
#include "server/kernels/adamw_kernel.h"
#include "server/state/group.h"

namespace optstate::bench {
namespace {

constexpr double kBytesPerElement = 28.0;

enum class Kind { kKernel, kMemoryPass, kPlainLoop };

// One group's worth of state and a gradient per size, shared by the three
// benchmark kinds and reset when the kind changes, so no run sees values
// another kind left (e.g. a negative v).
struct State {
  std::shared_ptr<Group> group;
  std::vector<float> grad;
  std::vector<uint16_t> grad_bf16;
  int last_kind = -1;
};

State& StateFor(size_t n, Kind kind) {
  static auto* states = new std::map<size_t, std::unique_ptr<State>>();
  std::unique_ptr<State>& state = (*states)[n];
  if (state == nullptr) {
    state = std::make_unique<State>();
    GroupConfig config;
    config.num_elements = n;
    state->group =
        *Group::Create(GroupKey{"", "bench"}, config, 256 * 1024, AlignedHostAllocator());
    state->grad.resize(n);
    state->grad_bf16.resize(n);
    for (size_t i = 0; i < n; ++i) {
      state->grad[i] = static_cast<float>(static_cast<int>(i % 2001) - 1000) * 1e-3f;
      state->grad_bf16[i] = FloatToBFloat16(state->grad[i]);
    }
  }
  if (state->last_kind != static_cast<int>(kind)) {
    float* p = state->group->params();
    float* m = state->group->exp_avg();
    float* v = state->group->exp_avg_sq();
    for (size_t i = 0; i < n; ++i) {
      p[i] = 0.5f + static_cast<float>(i % 97) * 1e-2f;
      m[i] = 1e-3f;
      v[i] = 1e-4f;
    }
    state->last_kind = static_cast<int>(kind);
  }
  return *state;
}

ThreadPool& PoolFor(int threads) {
  static auto* pools = new std::map<int, std::unique_ptr<ThreadPool>>();
  std::unique_ptr<ThreadPool>& pool = (*pools)[threads];
  if (pool == nullptr) pool = std::make_unique<ThreadPool>(threads);
  return *pool;
}

// `n` zeroed floats on their own pages, as a region's or a reply's params
// are. (A std::vector's large buffer starts 16 bytes into a page: the
// streaming stores' scalar head then shifts the state's vectors off their
// 32-byte alignment, which slowed the step by a third on a Zen 1 EPYC.)
class PageAlignedFloats {
 public:
  explicit PageAlignedFloats(size_t n)
      : data_(static_cast<float*>(
            std::aligned_alloc(4096, (n * sizeof(float) + 4095) / 4096 * 4096))) {
    if (data_ == nullptr) std::abort();
    std::memset(data_, 0, n * sizeof(float));
  }
  ~PageAlignedFloats() { std::free(data_); }
  PageAlignedFloats(const PageAlignedFloats&) = delete;
  PageAlignedFloats& operator=(const PageAlignedFloats&) = delete;
  float* data() { return data_; }

 private:
  float* const data_;
};

void SetCounters(benchmark::State& bench, size_t n, double bytes_per_element = kBytesPerElement) {
  const double elements = static_cast<double>(n) * static_cast<double>(bench.iterations());
  bench.counters["elem_per_s"] = benchmark::Counter(elements, benchmark::Counter::kIsRate);
  bench.counters["GB_per_s"] =
      benchmark::Counter(elements * bytes_per_element / 1e9, benchmark::Counter::kIsRate);
}

// The baselines split the range into one equal shard per thread, as the
// backend does for large ranges.
template <typename Fn>
void Sharded(ThreadPool& pool, size_t n, int threads, Fn fn) {
  size_t shard = (n + threads - 1) / threads;
  shard = (shard + 63) / 64 * 64;
  const size_t shards = (n + shard - 1) / shard;
  pool.ParallelFor(shards, [&](size_t i) {
    const size_t first = i * shard;
    const size_t last = std::min(n, first + shard);
    fn(first, last - first);
  });
}

void BM_AdamWKernel(benchmark::State& bench, WireType grad_type) {
  const size_t n = static_cast<size_t>(bench.range(0));
  const int threads = static_cast<int>(bench.range(1));
  State& state = StateFor(n, Kind::kKernel);
  ThreadPool& pool = PoolFor(threads);
  CpuBackend backend(&pool);
  const void* grad = grad_type == WireType::kFloat32 ? static_cast<const void*>(state.grad.data())
                                                     : state.grad_bf16.data();
  AdamWStepInputs inputs;
  uint64_t step = 1;
  for (auto _ : bench) {
    inputs.step = step++;
    const AdamWConstants constants = ComputeAdamWConstants(inputs);
    benchmark::DoNotOptimize(backend.Apply(*state.group, 0, n, grad, grad_type, constants));
    benchmark::ClobberMemory();
  }
  SetCounters(bench, n);
}

void BM_AdamWKernel_fp32(benchmark::State& bench) { BM_AdamWKernel(bench, WireType::kFloat32); }

// The step with its params written out to memory in plain pages (as a
// reply's buffer or a client's region is), the gradient and the params in
// `type`: float32, or bfloat16 as a bf16 model's own tensors are.
void BM_AdamWKernelWithParamsOut(benchmark::State& bench, ParamsStore store,
                                 WireType type = WireType::kFloat32) {
  const size_t n = static_cast<size_t>(bench.range(0));
  const int threads = static_cast<int>(bench.range(1));
  State& state = StateFor(n, Kind::kKernel);
  ThreadPool& pool = PoolFor(threads);
  CpuBackend backend(&pool);
  const size_t size = WireTypeSize(type);
  PageAlignedFloats params_out(n);  // Room for either type.
  const void* grad = type == WireType::kFloat32 ? static_cast<const void*>(state.grad.data())
                                                : state.grad_bf16.data();
  const SegmentedBytes gradient(absl::string_view(static_cast<const char*>(grad), n * size));
  AdamWStepInputs inputs;
  uint64_t step = 1;
  for (auto _ : bench) {
    inputs.step = step++;
    const AdamWConstants constants = ComputeAdamWConstants(inputs);
    benchmark::DoNotOptimize(backend.ApplyAndEncode(*state.group, 0, n, gradient, 0, type,
                                                    constants, params_out.data(), type, store));
    benchmark::ClobberMemory();
  }
  // 28 bytes of float32 state and gradient, less what a 16-bit gradient
  // saves, plus the params out.
  SetCounters(bench, n, kBytesPerElement - 4.0 + 2.0 * static_cast<double>(size));
}

void BM_AdamWKernelParamsOut_cached(benchmark::State& bench) {
  BM_AdamWKernelWithParamsOut(bench, ParamsStore::kCached);
}
void BM_AdamWKernelParamsOut_streaming(benchmark::State& bench) {
  BM_AdamWKernelWithParamsOut(bench, ParamsStore::kStreaming);
}
void BM_AdamWKernel_bf16(benchmark::State& bench) { BM_AdamWKernel(bench, WireType::kBFloat16); }
// A bf16 model's step on a shared buffer: bf16 gradient in, bf16 params out.
void BM_AdamWKernelParamsOut_bf16_streaming(benchmark::State& bench) {
  BM_AdamWKernelWithParamsOut(bench, ParamsStore::kStreaming, WireType::kBFloat16);
}

// The step on one named path (scalar, AVX2, AVX-512: each this CPU runs),
// sharded as the baselines are: the paths side by side in one run.
void BM_AdamWKernelOnPath(benchmark::State& bench, KernelIsa isa) {
  const size_t n = static_cast<size_t>(bench.range(0));
  const int threads = static_cast<int>(bench.range(1));
  State& state = StateFor(n, Kind::kKernel);
  ThreadPool& pool = PoolFor(threads);
  Group& g = *state.group;
  AdamWStepInputs inputs;
  uint64_t step = 1;
  for (auto _ : bench) {
    inputs.step = step++;
    const AdamWConstants c = ComputeAdamWConstants(inputs);
    Sharded(pool, n, threads, [&](size_t at, size_t count) {
      AdamWUpdateOn(isa, c, g.params() + at, g.exp_avg() + at, g.exp_avg_sq() + at,
                    state.grad.data() + at, WireType::kFloat32, count);
    });
    benchmark::ClobberMemory();
  }
  SetCounters(bench, n);
}

void BM_MemoryPass(benchmark::State& bench) {
  const size_t n = static_cast<size_t>(bench.range(0));
  const int threads = static_cast<int>(bench.range(1));
  State& state = StateFor(n, Kind::kMemoryPass);
  ThreadPool& pool = PoolFor(threads);
  Group& g = *state.group;
  for (auto _ : bench) {
    Sharded(pool, n, threads, [&](size_t at, size_t count) {
      MemoryPass(g.params() + at, g.exp_avg() + at, g.exp_avg_sq() + at, state.grad.data() + at,
                 count);
    });
    benchmark::ClobberMemory();
  }
  SetCounters(bench, n);
}

void BM_PlainAdamWLoop(benchmark::State& bench) {
  const size_t n = static_cast<size_t>(bench.range(0));
  const int threads = static_cast<int>(bench.range(1));
  State& state = StateFor(n, Kind::kPlainLoop);
  ThreadPool& pool = PoolFor(threads);
  Group& g = *state.group;
  PlainAdamWParams h{1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, 1};
  for (auto _ : bench) {
    Sharded(pool, n, threads, [&](size_t at, size_t count) {
      PlainAdamW(h, g.params() + at, g.exp_avg() + at, g.exp_avg_sq() + at, state.grad.data() + at,
                 count);
    });
    ++h.step;
    benchmark::ClobberMemory();
  }
  SetCounters(bench, n);
}

// The daemon's finite check (FindNonFiniteGradient, as Validate and a
// spread message's check run it) over a gradient of `type`, scaled by
// `grad_scale`: at most 1 in magnitude (as a GradScaler's unscale is) the
// check reads bits alone, above 1 it multiplies each element first.
void FiniteCheck(benchmark::State& bench, WireType type, float grad_scale) {
  const size_t n = static_cast<size_t>(bench.range(0));
  const int threads = static_cast<int>(bench.range(1));
  State& state = StateFor(n, Kind::kKernel);
  ThreadPool& pool = PoolFor(threads);
  const size_t size = WireTypeSize(type);
  const auto* grad = type == WireType::kFloat32
                         ? reinterpret_cast<const unsigned char*>(state.grad.data())
                         : reinterpret_cast<const unsigned char*>(state.grad_bf16.data());
  for (auto _ : bench) {
    Sharded(pool, n, threads, [&](size_t at, size_t count) {
      benchmark::DoNotOptimize(FindNonFiniteGradient(grad + at * size, type, count, grad_scale));
    });
  }
  SetCounters(bench, n, static_cast<double>(size));
}

void BM_FiniteCheck(benchmark::State& bench) { FiniteCheck(bench, WireType::kFloat32, 1.0f); }
void BM_FiniteCheck_scaled(benchmark::State& bench) {
  FiniteCheck(bench, WireType::kFloat32, 2.0f);
}
void BM_FiniteCheck_bf16(benchmark::State& bench) {
  FiniteCheck(bench, WireType::kBFloat16, 1.0f);
}
void BM_FiniteCheck_bf16_scaled(benchmark::State& bench) {
  FiniteCheck(bench, WireType::kBFloat16, 2.0f);
}

// Its baseline: the same bytes read once, OR-ed together (what any check of
// every element must at least do).
void BM_ReadPass(benchmark::State& bench) {
  const size_t n = static_cast<size_t>(bench.range(0));
  const int threads = static_cast<int>(bench.range(1));
  State& state = StateFor(n, Kind::kKernel);
  ThreadPool& pool = PoolFor(threads);
  for (auto _ : bench) {
    Sharded(pool, n, threads, [&](size_t at, size_t count) {
      uint32_t bits = 0;
      for (size_t i = 0; i < count; ++i) {
        uint32_t word;
        std::memcpy(&word, &state.grad[at + i], sizeof(word));
        bits |= word;
      }
      benchmark::DoNotOptimize(bits);
    });
  }
  SetCounters(bench, n, 4.0);
}

// The finite check and the step with params streamed out, as the daemon runs
// them on a zero-copy message, three ways (each thread takes one shard):
// kSeparate, the whole range checked before any of it is stepped (today's
// whole-message refusal); kReverse, the same, but each shard stepped from its
// end back, so the gradient checked last is stepped first while it may still
// be in cache; kByBlock, each block of 64 Ki elements checked and then
// stepped at once, while it is in L2 (refusal before a block's first write);
// kAhead, block k+1 checked in pieces of 4 Ki elements between the pieces of
// block k's step, so the check's loads run among the update's (block k+1
// still wholly checked before its first write).
// kPrefetchAhead, block k+1's gradient prefetched into the caches among the
// pieces of block k's step, then checked there just before its own step.
enum class CheckOrder { kSeparate, kReverse, kByBlock, kAhead, kPrefetchAhead };

void BM_CheckAndStep(benchmark::State& bench, CheckOrder order) {
  const size_t n = static_cast<size_t>(bench.range(0));
  const int threads = static_cast<int>(bench.range(1));
  constexpr size_t kBlock = 64 * 1024;
  State& state = StateFor(n, Kind::kKernel);
  ThreadPool& pool = PoolFor(threads);
  Group& g = *state.group;
  PageAlignedFloats params_out(n);
  AdamWStepInputs inputs;
  uint64_t step = 1;
  auto step_block = [&](const AdamWConstants& c, size_t at, size_t count) {
    AdamWUpdateAndEncode(c, g.params() + at, g.exp_avg() + at, g.exp_avg_sq() + at,
                         state.grad.data() + at, WireType::kFloat32, count, params_out.data() + at,
                         WireType::kFloat32, ParamsStore::kStreaming);
  };
  auto check = [&](size_t at, size_t count) {
    if (FindNonFiniteGradient(state.grad.data() + at, WireType::kFloat32, count, 1.0f) != count) {
      std::abort();  // The gradient is finite by construction.
    }
  };
  for (auto _ : bench) {
    inputs.step = step++;
    const AdamWConstants c = ComputeAdamWConstants(inputs);
    if (order == CheckOrder::kSeparate || order == CheckOrder::kReverse) {
      Sharded(pool, n, threads, check);
    }
    Sharded(pool, n, threads, [&](size_t at, size_t count) {
      const size_t blocks = (count + kBlock - 1) / kBlock;
      if (order == CheckOrder::kAhead || order == CheckOrder::kPrefetchAhead) {
        constexpr size_t kPiece = 4096;
        check(at, std::min(kBlock, count));
        for (size_t k = 0; k < blocks; ++k) {
          const size_t first = at + k * kBlock;
          const size_t len = std::min(kBlock, at + count - first);
          const size_t next = first + len;
          const size_t next_len = k + 1 < blocks ? std::min(kBlock, at + count - next) : 0;
          if (order == CheckOrder::kAhead) {
            for (size_t piece = 0; piece < std::max(len, next_len); piece += kPiece) {
              if (piece < len) step_block(c, first + piece, std::min(kPiece, len - piece));
              if (piece < next_len) check(next + piece, std::min(kPiece, next_len - piece));
            }
            continue;
          }
          // Block k+1's gradient lines, spread over block k's pieces.
          const size_t pieces = (len + kPiece - 1) / kPiece;
          const size_t lines = (next_len * 4 + 63) / 64;
          const size_t lines_per_piece = (lines + pieces - 1) / std::max<size_t>(pieces, 1);
          const char* next_bytes = reinterpret_cast<const char*>(state.grad.data() + next);
          size_t line = 0;
          for (size_t piece = 0; piece < len; piece += kPiece) {
            for (size_t end = std::min(lines, line + lines_per_piece); line < end; ++line) {
              __builtin_prefetch(next_bytes + line * 64, 0, 2);
            }
            step_block(c, first + piece, std::min(kPiece, len - piece));
          }
          if (next_len != 0) check(next, next_len);
        }
        return;
      }
      for (size_t b = 0; b < blocks; ++b) {
        const size_t k = order == CheckOrder::kReverse ? blocks - 1 - b : b;
        const size_t first = at + k * kBlock;
        const size_t len = std::min(kBlock, at + count - first);
        if (order == CheckOrder::kByBlock) check(first, len);
        step_block(c, first, len);
      }
    });
    benchmark::ClobberMemory();
  }
  SetCounters(bench, n, kBytesPerElement + 4);
}
void BM_CheckAndStep_separate(benchmark::State& bench) {
  BM_CheckAndStep(bench, CheckOrder::kSeparate);
}
void BM_CheckAndStep_reverse(benchmark::State& bench) {
  BM_CheckAndStep(bench, CheckOrder::kReverse);
}
void BM_CheckAndStep_by_block(benchmark::State& bench) {
  BM_CheckAndStep(bench, CheckOrder::kByBlock);
}
void BM_CheckAndStep_ahead(benchmark::State& bench) {
  BM_CheckAndStep(bench, CheckOrder::kAhead);
}
void BM_CheckAndStep_prefetch_ahead(benchmark::State& bench) {
  BM_CheckAndStep(bench, CheckOrder::kPrefetchAhead);
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {int64_t{1} << 20, int64_t{16} << 20, int64_t{64} << 20}) {
    for (int64_t threads : {1, 2}) b->Args({n, threads});
  }
  b->ArgNames({"elems", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_AdamWKernel_fp32)->Apply(Sizes);
BENCHMARK(BM_MemoryPass)->Apply(Sizes);
BENCHMARK(BM_PlainAdamWLoop)->Apply(Sizes);
BENCHMARK(BM_AdamWKernelParamsOut_cached)->Apply(Sizes);
BENCHMARK(BM_AdamWKernelParamsOut_streaming)->Apply(Sizes);
BENCHMARK(BM_AdamWKernelParamsOut_bf16_streaming)->Apply(Sizes);
BENCHMARK(BM_FiniteCheck)->Apply(Sizes);
BENCHMARK(BM_FiniteCheck_scaled)->Apply(Sizes);
BENCHMARK(BM_FiniteCheck_bf16)->Apply(Sizes);
BENCHMARK(BM_FiniteCheck_bf16_scaled)->Apply(Sizes);
BENCHMARK(BM_ReadPass)->Apply(Sizes);
BENCHMARK(BM_CheckAndStep_separate)->Apply(Sizes);
BENCHMARK(BM_CheckAndStep_reverse)->Apply(Sizes);
BENCHMARK(BM_CheckAndStep_by_block)->Apply(Sizes);
BENCHMARK(BM_CheckAndStep_ahead)->Apply(Sizes);
BENCHMARK(BM_CheckAndStep_prefetch_ahead)->Apply(Sizes);
// BM_AdamWKernelOnPath_avx2, _avx512, ...: the vector paths this CPU runs.
const bool kPathBenchmarksRegistered = [] {
  for (KernelIsa isa : SupportedKernelIsas()) {
    if (isa == KernelIsa::kScalar) continue;
    const std::string name = std::string("BM_AdamWKernelOnPath_") + KernelIsaName(isa);
    benchmark::RegisterBenchmark(name.c_str(), BM_AdamWKernelOnPath, isa)->Apply(Sizes);
  }
  return true;
}();
BENCHMARK(BM_AdamWKernel_bf16)
    ->Args({int64_t{64} << 20, 2})
    ->ArgNames({"elems", "threads"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace optstate::bench

BENCHMARK_MAIN();
