// GPU step benchmark, each figure against a baseline measured in the same
// run: the resident kernel vs a device-to-device copy of the same 28 B per
// element, a fully_paged step vs pinned PCIe bandwidth for the bytes it must
// move, and a fully_paged step vs the CPU backend on this host.
//
// Usage: gpu_step_bench [resident_elements] [paged_elements]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "server/backends/cpu/cpu_backend.h"
#include "server/backends/cuda/cuda_backend.h"
#include "server/base/thread_pool.h"
#include "server/kernels/adamw_cuda.h"

namespace optstate {
namespace {

#define CHECK_CUDA(expr)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (expr);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds of `reps` runs of `enqueue` on `stream`, timed with
// events, after two warm-ups.
double TimeDevice(cudaStream_t stream, int reps, const std::function<void()>& enqueue) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 2; ++i) enqueue();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    enqueue();
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaGetLastError());
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return Median(ms);
}

// Median wall milliseconds of `reps` calls of `fn` (which synchronizes),
// after one warm-up.
double TimeHost(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return Median(ms);
}

void FillRandom(float* a, uint64_t n, uint64_t seed) {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned k = 0; k < threads; ++k) {
    pool.emplace_back([=] {
      uint64_t x = seed * 0x9e3779b97f4a7c15ull + k;
      for (uint64_t i = n * k / threads; i < n * (k + 1) / threads; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        a[i] = static_cast<float>(x >> 40) * (1.0f / 16777216.0f) + 0.01f;  // (0, 1]
      }
    });
  }
  for (auto& t : pool) t.join();
}

struct Row {
  const char* figure;
  double ms;
  double baseline_ms;
  const char* baseline;
  const char* target;
};

AdamWConstants Constants(uint64_t step) {
  AdamWStepInputs in;
  in.step = step;
  return ComputeAdamWConstants(in);
}

// The kernel over device-resident arrays vs copying 14 B/element device to
// device (14 read + 14 written = the kernel's 28 B/element).
Row ResidentKernel(uint64_t n) {
  float *p, *m, *v, *g;
  unsigned char *src, *dst;
  for (float** a : {&p, &m, &v, &g}) CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(a), n * 4));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&src), n * 14));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dst), n * 14));
  float* host;
  CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&host), n * 4, cudaHostAllocDefault));
  FillRandom(host, n, 1);
  for (float* a : {p, m, v, g}) CHECK_CUDA(cudaMemcpy(a, host, n * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(src, host, n * 4, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  const AdamWConstants c = Constants(10);
  const double kernel_ms = TimeDevice(stream, 20, [&] {
    CHECK_CUDA(LaunchAdamWUpdate(c, p, m, v, g, WireType::kFloat32, n, stream));
  });
  const double copy_ms = TimeDevice(stream, 20, [&] {
    CHECK_CUDA(cudaMemcpyAsync(dst, src, n * 14, cudaMemcpyDeviceToDevice, stream));
  });
  std::printf(
      "resident kernel: %.3f ms for %llu elements = %.0f GB/s; d2d copy %.3f ms = %.0f GB/s\n",
      kernel_ms, static_cast<unsigned long long>(n), 28.0 * n / kernel_ms / 1e6, copy_ms,
      28.0 * n / copy_ms / 1e6);
  for (void* a : {static_cast<void*>(p), static_cast<void*>(m), static_cast<void*>(v),
                  static_cast<void*>(g), static_cast<void*>(src), static_cast<void*>(dst)}) {
    cudaFree(a);
  }
  cudaFreeHost(host);
  cudaStreamDestroy(stream);
  return {"resident kernel vs d2d copy (28 B/elem)", kernel_ms, copy_ms, "cudaMemcpy d2d",
          ">= 0.7"};
}

// Pinned copies of `in` bytes host to device and `out` bytes device to host
// on two streams at once: the least time a paged step's traffic can take.
double PcieBaseline(uint64_t in, uint64_t out) {
  unsigned char *h_in, *h_out, *d_in, *d_out;
  CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&h_in), in, cudaHostAllocDefault));
  CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&h_out), out, cudaHostAllocDefault));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_in), in));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_out), out));
  std::memset(h_in, 1, in);
  cudaStream_t s1, s2;
  CHECK_CUDA(cudaStreamCreate(&s1));
  CHECK_CUDA(cudaStreamCreate(&s2));
  const double ms = TimeHost(5, [&] {
    CHECK_CUDA(cudaMemcpyAsync(d_in, h_in, in, cudaMemcpyHostToDevice, s1));
    CHECK_CUDA(cudaMemcpyAsync(h_out, d_out, out, cudaMemcpyDeviceToHost, s2));
    CHECK_CUDA(cudaStreamSynchronize(s1));
    CHECK_CUDA(cudaStreamSynchronize(s2));
  });
  const double h2d_ms = TimeHost(5, [&] {
    CHECK_CUDA(cudaMemcpyAsync(d_in, h_in, in, cudaMemcpyHostToDevice, s1));
    CHECK_CUDA(cudaStreamSynchronize(s1));
  });
  const double d2h_ms = TimeHost(5, [&] {
    CHECK_CUDA(cudaMemcpyAsync(h_out, d_out, out, cudaMemcpyDeviceToHost, s2));
    CHECK_CUDA(cudaStreamSynchronize(s2));
  });
  std::printf(
      "pinned PCIe: h2d %.1f GB/s, d2h %.1f GB/s, both at once %.3f ms for %llu + %llu "
      "bytes\n",
      in / h2d_ms / 1e6, out / d2h_ms / 1e6, ms, static_cast<unsigned long long>(in),
      static_cast<unsigned long long>(out));
  cudaFreeHost(h_in);
  cudaFreeHost(h_out);
  cudaFree(d_in);
  cudaFree(d_out);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  return ms;
}

struct PagedFigures {
  Row vs_pcie;
  Row vs_cpu;
  Row resident_step;
};

PagedFigures PagedStep(uint64_t n) {
  CudaOptions options;  // Defaults: 4 slots of 64 MiB.
  options.paging = "fully_paged";
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadPool pool(threads);
  auto cuda = CudaBackend::Create(options, &pool);
  if (!cuda.ok()) {
    std::fprintf(stderr, "%s\n", cuda.status().ToString().c_str());
    std::exit(1);
  }
  CpuBackend cpu(&pool);
  GroupConfig config;
  config.num_elements = n;
  auto gpu = Group::Create({"", "paged"}, config, 1 << 20, (*cuda)->host_allocator());
  auto ref = Group::Create({"", "cpu"}, config, 1 << 20, cpu.host_allocator());
  if (!gpu.ok() || !ref.ok() || !(*cuda)->AttachGroup(**gpu).ok() || !cpu.AttachGroup(**ref).ok()) {
    std::fprintf(stderr, "could not set up the paged group\n");
    std::exit(1);
  }
  FillRandom((*gpu)->params(), n, 2);
  FillRandom((*ref)->params(), n, 2);
  std::vector<float> grad(n);
  FillRandom(grad.data(), n, 3);
  uint64_t step = 0;
  const double paged_ms = TimeHost(5, [&] {
    absl::Status s =
        (*cuda)->Apply(**gpu, 0, n, grad.data(), WireType::kFloat32, Constants(++step));
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      std::exit(1);
    }
  });
  step = 0;
  const double cpu_ms = TimeHost(
      3, [&] { (void)cpu.Apply(**ref, 0, n, grad.data(), WireType::kFloat32, Constants(++step)); });
  const double pcie_ms = PcieBaseline(n * 16, n * 12);
  std::printf(
      "fully_paged step: %.3f ms for %llu elements (%.2f G elem/s); cpu backend (%d "
      "threads) %.3f ms (%.2f G elem/s); copy wait %llu us total\n",
      paged_ms, static_cast<unsigned long long>(n), n / paged_ms / 1e6, threads, cpu_ms,
      n / cpu_ms / 1e6,
      static_cast<unsigned long long>((*gpu)->counters().paging.copy_wait_us.load()));
  (*cuda)->DetachGroup(**gpu);
  gpu->reset();

  // The same size resident (adaptive, fits): gradient in, params out.
  options.paging = "adaptive";
  cuda->reset();
  auto resident = CudaBackend::Create(options, &pool);
  if (!resident.ok()) {
    std::fprintf(stderr, "%s\n", resident.status().ToString().c_str());
    std::exit(1);
  }
  auto rgroup = Group::Create({"", "resident"}, config, 1 << 20, (*resident)->host_allocator());
  if (!rgroup.ok() || !(*resident)->AttachGroup(**rgroup).ok() ||
      (*rgroup)->placement() != Placement::kDeviceResident) {
    std::fprintf(stderr, "could not place the resident group\n");
    std::exit(1);
  }
  step = 0;
  const double resident_ms = TimeHost(5, [&] {
    (void)(*resident)->Apply(**rgroup, 0, n, grad.data(), WireType::kFloat32, Constants(++step));
  });
  const double resident_pcie_ms = PcieBaseline(n * 4, n * 4);
  (*resident)->DetachGroup(**rgroup);

  return {{"fully_paged step vs pinned PCIe (16 in, 12 out B/elem)", paged_ms, pcie_ms,
           "pinned h2d+d2h", ">= 0.7"},
          {"fully_paged step vs CPU backend", paged_ms, cpu_ms, "CPU backend", "(info)"},
          {"resident step (backend) vs pinned PCIe (4 in, 4 out)", resident_ms, resident_pcie_ms,
           "pinned h2d+d2h", "(info)"}};
}

int Main(int argc, char** argv) {
  const uint64_t resident_n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (256ull << 20);
  const uint64_t paged_n = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (256ull << 20);
  absl::StatusOr<CudaDeviceInfo> device = ProbeCudaDevice(0);
  if (!device.ok()) {
    std::fprintf(stderr, "gpu_step_bench: %s\n", device.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", device->ToString().c_str());
  std::vector<Row> rows;
  rows.push_back(ResidentKernel(resident_n));
  PagedFigures paged = PagedStep(paged_n);
  rows.push_back(paged.vs_pcie);
  rows.push_back(paged.vs_cpu);
  rows.push_back(paged.resident_step);
  // ratio = baseline time / our time: 1.0 means as fast as the baseline.
  std::printf("\n%-56s %10s %12s %7s %8s\n", "figure", "ours ms", "baseline ms", "ratio", "target");
  for (const Row& r : rows) {
    std::printf("%-56s %10.3f %12.3f %7.2f %8s\n", r.figure, r.ms, r.baseline_ms,
                r.baseline_ms / r.ms, r.target);
  }
  return 0;
}

}  // namespace
}  // namespace optstate

int main(int argc, char** argv) { return optstate::Main(argc, argv); }
