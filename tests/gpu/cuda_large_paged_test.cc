// fully_paged at scale: a 1 G-element group stepped through a 16 MiB staging
// pool under a 16 MiB budget, checked against the CPU backend (every bit) and
// the float64 reference (a sample), while device memory stays at the pool.
#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/backends/cuda/cuda_backend.h"
#include "server/base/thread_pool.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/testing/reference_adamw.h"

namespace optstate {
namespace {

using ::optstate::testing::ReferenceAdamWStep;
using ::optstate::testing::ReferenceHyperparameters;
using ::optstate::testing::ReferenceState;
using ::optstate::testing::RelativeL2Error;
using ::optstate::testing::SplitMix;
using ::optstate::testing::UniformSigned;

constexpr uint64_t kElements = 1ull << 30;
constexpr uint64_t kPage = 1ull << 20;

// Runs fn(begin, end) over [0, n) split across the machine's threads.
template <typename Fn>
void ParallelRange(uint64_t n, Fn fn) {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned k = 0; k < threads; ++k) {
    pool.emplace_back([&, k] { fn(n * k / threads, n * (k + 1) / threads); });
  }
  for (auto& t : pool) t.join();
}

uint64_t UsedDeviceBytes() {
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  return total_bytes - free_bytes;
}

TEST(CudaLargePagedTest, OneGigaElementGroupThroughASixteenMebibytePool) {
  OPTSTATE_REQUIRE_DEVICE();
  ASSERT_CUDA(cudaFree(nullptr));  // Create the context before measuring.
  const uint64_t used_before = UsedDeviceBytes();

  CudaOptions options;
  options.paging = "fully_paged";
  options.vram_total_bytes = 32ull << 20;  // 16 MiB available at 50%.
  options.vram_target_utilization = 0.5;
  options.staging_slots = 4;
  options.staging_slot_bytes = 4ull << 20;
  ThreadPool pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  // Pieces here carry 1 MiB of gradient, under the 4 MiB from which the
  // pool splits a copy: this test covers paging at scale, not that split.
  auto cuda = CudaBackend::Create(options, &pool);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  ASSERT_EQ((*cuda)->Stats().budget_available_bytes, 16ull << 20);
  ASSERT_EQ((*cuda)->Stats().staging_pool_bytes, 16ull << 20);
  CpuBackend cpu(&pool);

  GroupConfig config;
  config.num_elements = kElements;
  auto gpu = Group::Create({"", "huge"}, config, kPage, (*cuda)->host_allocator());
  auto ref = Group::Create({"", "huge"}, config, kPage, cpu.host_allocator());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_TRUE((*cuda)->AttachGroup(**gpu).ok());
  ASSERT_TRUE(cpu.AttachGroup(**ref).ok());
  EXPECT_EQ((*gpu)->placement(), Placement::kDevicePaged);
  ParallelRange(kElements, [&](uint64_t b, uint64_t e) {
    for (uint64_t i = b; i < e; ++i)
      (*gpu)->params()[i] = (*ref)->params()[i] = UniformSigned(1, i);
  });

  // A sample of elements followed in float64.
  std::vector<uint64_t> sample(1 << 16);
  for (size_t k = 0; k < sample.size(); ++k) sample[k] = SplitMix(k) % kElements;
  ReferenceState reference;
  for (uint64_t i : sample) {
    reference.params.push_back((*ref)->params()[i]);
    reference.exp_avg.push_back(0);
    reference.exp_avg_sq.push_back(0);
  }

  std::vector<float> grad(kElements);
  uint64_t used_after_first_step = 0;
  for (uint64_t t = 1; t <= 2; ++t) {
    ParallelRange(kElements, [&](uint64_t b, uint64_t e) {
      for (uint64_t i = b; i < e; ++i) grad[i] = UniformSigned(100 + t, i) * 0.1f;
    });
    AdamWStepInputs in;
    in.step = t;
    const AdamWConstants c = ComputeAdamWConstants(in);
    // No other thread touches the groups: page mutexes are not needed.
    absl::Status s = (*cuda)->Apply(**gpu, 0, kElements, grad.data(), WireType::kFloat32, c);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(cpu.Apply(**ref, 0, kElements, grad.data(), WireType::kFloat32, c).ok());
    if (t == 1) used_after_first_step = UsedDeviceBytes();

    ReferenceHyperparameters h;
    std::vector<double> g;
    for (uint64_t i : sample) g.push_back(grad[i]);
    ReferenceAdamWStep(h, t, g, &reference);
  }
  const uint64_t used_after = UsedDeviceBytes();

  EXPECT_EQ(std::memcmp((*gpu)->params(), (*ref)->params(), kElements * 4), 0);
  EXPECT_EQ(std::memcmp((*gpu)->exp_avg(), (*ref)->exp_avg(), kElements * 4), 0);
  EXPECT_EQ(std::memcmp((*gpu)->exp_avg_sq(), (*ref)->exp_avg_sq(), kElements * 4), 0);
  std::vector<float> p, m, v;
  for (uint64_t i : sample) {
    p.push_back((*gpu)->params()[i]);
    m.push_back((*gpu)->exp_avg()[i]);
    v.push_back((*gpu)->exp_avg_sq()[i]);
  }
  EXPECT_LE(RelativeL2Error(p, reference.params), 1e-6);
  EXPECT_LE(RelativeL2Error(m, reference.exp_avg), 1e-6);
  EXPECT_LE(RelativeL2Error(v, reference.exp_avg_sq), 1e-6);

  // 12 GiB of state moved through 16 MiB of device memory. The context's
  // own allocations (module loading at the first launch) get 32 MiB of slack.
  const uint64_t pool_bytes = (*cuda)->Stats().staging_pool_bytes;
  std::printf(
      "device memory: %llu bytes used by the backend (pool %llu), growth during "
      "steps %lld bytes\n",
      static_cast<unsigned long long>(used_after - used_before),
      static_cast<unsigned long long>(pool_bytes),
      static_cast<long long>(used_after) - static_cast<long long>(used_after_first_step));
  EXPECT_LE(used_after - used_before, pool_bytes + (32ull << 20));
  EXPECT_EQ(used_after, used_after_first_step);
  const PagingCounters& counters = (*gpu)->counters().paging;
  EXPECT_EQ(counters.page_ins.load(), 2 * (*gpu)->num_pages());
  EXPECT_EQ(counters.bytes_host_to_device.load(), 2 * kElements * 16);
  EXPECT_EQ(counters.bytes_device_to_host.load(), 2 * kElements * 12);
  EXPECT_EQ((*cuda)->Stats().resident_bytes, 0u);

  (*cuda)->DetachGroup(**gpu);
}

}  // namespace
}  // namespace optstate
