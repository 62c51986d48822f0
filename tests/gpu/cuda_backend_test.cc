// CudaBackend under each paging strategy against the CPU backend: the same
// steps (whole groups, page runs, concurrent disjoint chunks, every gradient
// type) give the same params, m and v; placements, refusals, promotion after
// a delete, counters, and the step engine's replies.
#include "server/backends/cuda/cuda_backend.h"

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/base/thread_pool.h"
#include "server/engine/state_store.h"
#include "server/engine/step_engine.h"
#include "server/state/page_range_lock.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/testing/reference_adamw.h"
#include "tests/testing/step_engine_calls.h"

namespace optstate {
namespace {

using ::optstate::testing::CountBitDifferences;
using ::optstate::testing::RelativeL2Error;
using ::optstate::testing::UniformSigned;
using ::testing::HasSubstr;

constexpr uint64_t kPage = 4096;
constexpr int kSlots = 3;
constexpr uint64_t kSlotBytes = 64 * 1024;  // Paged pieces of 4096 elements.

CudaOptions Options(const std::string& paging, uint64_t vram_total_bytes = 0) {
  CudaOptions o;
  o.paging = paging;
  o.vram_total_bytes = vram_total_bytes;
  o.vram_target_utilization = 0.5;
  o.staging_slots = kSlots;
  o.staging_slot_bytes = kSlotBytes;
  return o;
}

// A budget whose resident capacity is `capacity` bytes (target 0.5).
uint64_t TotalForCapacity(uint64_t capacity) { return 2 * (kSlots * kSlotBytes + capacity); }

// Holds the page mutexes of elements [begin, end) as the step engine does.
class RangeLock {
 public:
  RangeLock(Group& g, uint64_t begin, uint64_t end)
      : pages_(g, begin / g.page_elements(), (end + g.page_elements() - 1) / g.page_elements()) {}

 private:
  PageRangeLock pages_;
};

// One group registered on both backends, stepped identically.
class Twin {
 public:
  Twin(CudaBackend* cuda, CpuBackend* cpu, const std::string& name, uint64_t n)
      : cuda_(cuda), cpu_(cpu), n_(n) {
    GroupConfig config;
    config.num_elements = n;
    config.has_initial_values = true;
    gpu_ = *Group::Create({"", name}, config, kPage, cuda->host_allocator());
    ref_ = *Group::Create({"", name}, config, kPage, cpu->host_allocator());
  }

  absl::Status Attach() {
    if (absl::Status s = cuda_->AttachGroup(*gpu_); !s.ok()) return s;
    return cpu_->AttachGroup(*ref_);
  }

  void WriteInitialValues(uint64_t seed) {
    RangeLock lock(*gpu_, 0, n_);
    for (uint64_t i = 0; i < n_; ++i)
      gpu_->params()[i] = ref_->params()[i] = UniformSigned(seed, i);
    ASSERT_TRUE(cuda_->ParamsWritten(*gpu_, 0, n_).ok());
    ASSERT_TRUE(cpu_->ParamsWritten(*ref_, 0, n_).ok());
  }

  // Applies step `t` over [begin, end) on both backends.
  void Step(uint64_t t, uint64_t begin, uint64_t end, WireType type, uint64_t seed) {
    std::vector<unsigned char> grad((end - begin) * WireTypeSize(type));
    for (uint64_t i = 0; i < end - begin; ++i) {
      const float x = UniformSigned(seed, begin + i) * 0.1f;
      if (type == WireType::kFloat32) {
        std::memcpy(grad.data() + 4 * i, &x, 4);
      } else {
        const uint16_t h = type == WireType::kBFloat16 ? FloatToBFloat16(x) : FloatToHalf(x);
        std::memcpy(grad.data() + 2 * i, &h, 2);
      }
    }
    AdamWStepInputs in;
    in.step = t;
    in.hyperparameters.lr = 1e-3 * static_cast<double>(1 + t % 3);
    in.grad_scale = t % 2 == 0 ? 0.5f : 1.0f;
    const AdamWConstants c = ComputeAdamWConstants(in);
    {
      RangeLock lock(*gpu_, begin, end);
      absl::Status s = cuda_->Apply(*gpu_, begin, end, grad.data(), type, c);
      ASSERT_TRUE(s.ok()) << s;
    }
    RangeLock lock(*ref_, begin, end);
    ASSERT_TRUE(cpu_->Apply(*ref_, begin, end, grad.data(), type, c).ok());
  }

  // Host params must be current after every Apply; m and v after a sync.
  void ExpectParamsMatch() {
    EXPECT_LE(RelativeL2Error(Span(gpu_->params()), Span(ref_->params())), 1e-6);
    EXPECT_EQ(CountBitDifferences(gpu_->params(), ref_->params(), n_), 0u);
  }
  void ExpectStateMatches() {
    {
      RangeLock lock(*gpu_, 0, n_);
      ASSERT_TRUE(cuda_->SyncToHost(*gpu_).ok());
    }
    ExpectParamsMatch();
    EXPECT_LE(RelativeL2Error(Span(gpu_->exp_avg()), Span(ref_->exp_avg())), 1e-6);
    EXPECT_LE(RelativeL2Error(Span(gpu_->exp_avg_sq()), Span(ref_->exp_avg_sq())), 1e-6);
    // The kernels are bit-identical, so the moments are too.
    EXPECT_EQ(CountBitDifferences(gpu_->exp_avg(), ref_->exp_avg(), n_), 0u);
    EXPECT_EQ(CountBitDifferences(gpu_->exp_avg_sq(), ref_->exp_avg_sq(), n_), 0u);
  }

  // What StateStore::Delete does.
  void Delete() {
    RangeLock lock(*gpu_, 0, n_);
    gpu_->mark_deleted();
    cuda_->DetachGroup(*gpu_);
  }

  Group& gpu() { return *gpu_; }
  uint64_t n() const { return n_; }

 private:
  std::vector<float> Span(const float* a) const { return std::vector<float>(a, a + n_); }

  CudaBackend* cuda_;
  CpuBackend* cpu_;
  uint64_t n_;
  std::shared_ptr<Group> gpu_, ref_;
};

class CudaBackendStrategyTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { OPTSTATE_REQUIRE_DEVICE(); }
};

// Small groups; also the run compute-sanitizer checks (tests/gpu/run.sh).
TEST_P(CudaBackendStrategyTest, SmallGroupsMatchTheCpuBackend) {
  absl::StatusOr<std::unique_ptr<CudaBackend>> cuda = CudaBackend::Create(Options(GetParam()));
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  ThreadPool pool(2);
  CpuBackend cpu(&pool);
  std::vector<std::unique_ptr<Twin>> twins;
  for (uint64_t n : {uint64_t{1}, uint64_t{100037}, uint64_t{3 * kPage}}) {
    twins.push_back(std::make_unique<Twin>(cuda->get(), &cpu, "g" + std::to_string(n), n));
    ASSERT_TRUE(twins.back()->Attach().ok());
    twins.back()->WriteInitialValues(n);
  }
  const Placement expected =
      GetParam() == "fully_paged" ? Placement::kDevicePaged : Placement::kDeviceResident;
  for (auto& t : twins) EXPECT_EQ(t->gpu().placement(), expected);

  const WireType types[] = {WireType::kFloat32, WireType::kBFloat16, WireType::kFloat16};
  for (uint64_t step = 1; step <= 6; ++step) {
    const WireType type = types[step % 3];
    for (auto& t : twins) {
      const uint64_t n = t->n();
      if (step % 3 == 1) {
        t->Step(step, 0, n, type, 1000 * step);  // Whole group: many pieces.
      } else if (step % 3 == 2) {
        for (uint64_t b = 0; b < n; b += 3 * kPage) {  // Runs of three pages, in order.
          t->Step(step, b, std::min(n, b + 3 * kPage), type, 1000 * step);
        }
      } else {
        // Pages from four threads at once, on disjoint ranges.
        std::vector<std::thread> threads;
        for (int k = 0; k < 4; ++k) {
          threads.emplace_back([&, k] {
            for (uint64_t b = k * kPage; b < n; b += 4 * kPage) {
              t->Step(step, b, std::min(n, b + kPage), type, 1000 * step);
            }
          });
        }
        for (auto& th : threads) th.join();
      }
      t->ExpectParamsMatch();
    }
  }
  for (auto& t : twins) {
    t->ExpectStateMatches();
    const PagingCounters& c = t->gpu().counters().paging;
    const uint64_t pages = t->gpu().num_pages();
    if (expected == Placement::kDevicePaged) {
      EXPECT_EQ(c.page_ins.load(), 6 * pages);
      EXPECT_EQ(c.page_outs.load(), 6 * pages);
      EXPECT_EQ(c.bytes_device_to_host.load(), 6 * t->n() * 12);
    } else {
      EXPECT_EQ(c.page_ins.load(), 0u);
      // Params back after every step, plus the final sync of p, m and v.
      EXPECT_EQ(c.bytes_device_to_host.load(), 6 * t->n() * 4 + t->n() * 12);
    }
  }
  for (auto& t : twins) t->Delete();
  EXPECT_EQ((*cuda)->allocated_group_bytes(), 0u);
  EXPECT_EQ((*cuda)->policy().resident_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Strategies, CudaBackendStrategyTest,
                         ::testing::Values("none", "adaptive", "fully_paged"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override { OPTSTATE_REQUIRE_DEVICE(); }
};

// The device arrays and the pager move params, m and v only: an amsgrad
// group is refused by name, before anything is admitted or allocated.
TEST_F(CudaBackendTest, AnAmsgradGroupIsRefusedByNameAndTakesNoDeviceMemory) {
  auto cuda = CudaBackend::Create(Options("adaptive", TotalForCapacity(1000000)));
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  GroupConfig config;
  config.num_elements = 1000;
  config.hyperparameters.amsgrad = true;
  std::shared_ptr<Group> group = *Group::Create({"", "ams"}, config, kPage,
                                                (*cuda)->host_allocator());
  absl::Status refused = (*cuda)->AttachGroup(*group);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("amsgrad=true is not supported by the CUDA backend"));
  EXPECT_EQ((*cuda)->allocated_group_bytes(), 0u);
  EXPECT_EQ((*cuda)->policy().resident_bytes(), 0u);
}

TEST_F(CudaBackendTest, NoneRefusesWhatDoesNotFitSayingBytesNeededAndAvailable) {
  auto cuda = CudaBackend::Create(Options("none", TotalForCapacity(1000000)));
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  ThreadPool pool(1);
  CpuBackend cpu(&pool);
  Twin big(cuda->get(), &cpu, "big", 100000);  // 1200000 bytes.
  absl::Status refused = big.Attach();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("needs 1200000 bytes"));
  EXPECT_THAT(refused.message(), HasSubstr("only 1000000 of 1000000 bytes are available"));
  Twin fits(cuda->get(), &cpu, "fits", 80000);  // 960000 bytes.
  ASSERT_TRUE(fits.Attach().ok());
  EXPECT_EQ(fits.gpu().placement(), Placement::kDeviceResident);
  EXPECT_EQ((*cuda)->Stats().resident_bytes, 960000u);
  fits.Delete();
}

TEST_F(CudaBackendTest, AdaptivePagesWhatDoesNotFitAndMovesItInAfterADelete) {
  // Room for one group of 100037 elements (1200444 bytes), not two.
  auto cuda = CudaBackend::Create(Options("adaptive", TotalForCapacity(1500000)));
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  ThreadPool pool(2);
  CpuBackend cpu(&pool);
  Twin a(cuda->get(), &cpu, "a", 100037);
  Twin b(cuda->get(), &cpu, "b", 100037);
  ASSERT_TRUE(a.Attach().ok());
  ASSERT_TRUE(b.Attach().ok());
  a.WriteInitialValues(1);
  b.WriteInitialValues(2);
  EXPECT_EQ(a.gpu().placement(), Placement::kDeviceResident);
  EXPECT_EQ(b.gpu().placement(), Placement::kDevicePaged);
  for (uint64_t t = 1; t <= 2; ++t) {
    a.Step(t, 0, a.n(), WireType::kFloat32, 10 + t);
    b.Step(t, 0, b.n(), WireType::kBFloat16, 20 + t);
  }
  const uint64_t pages = b.gpu().num_pages();
  EXPECT_EQ(b.gpu().counters().paging.page_ins.load(), 2 * pages);

  a.Delete();
  EXPECT_EQ(b.gpu().placement(), Placement::kDeviceResident);
  // Step 3 in two halves: each half's pages move in with it.
  const uint64_t half = (pages / 2) * kPage;
  b.Step(3, 0, half, WireType::kFloat32, 33);
  EXPECT_EQ(b.gpu().counters().paging.page_ins.load(), 2 * pages + pages / 2);
  b.ExpectParamsMatch();
  b.Step(3, half, b.n(), WireType::kFloat32, 33);
  EXPECT_EQ(b.gpu().counters().paging.page_ins.load(), 3 * pages);
  // Step 4 finds every page on the device.
  b.Step(4, 0, b.n(), WireType::kFloat16, 44);
  EXPECT_EQ(b.gpu().counters().paging.page_ins.load(), 3 * pages);
  b.ExpectStateMatches();
  b.Delete();
}

TEST_F(CudaBackendTest, StatsReportStrategyBudgetAndPool) {
  auto cuda = CudaBackend::Create(Options("fully_paged", 64ull << 20));
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  const BackendStats s = (*cuda)->Stats();
  EXPECT_EQ(s.strategy, "fully_paged");
  EXPECT_EQ(s.budget_total_bytes, 64ull << 20);
  EXPECT_EQ(s.budget_target_utilization, 0.5);
  EXPECT_EQ(s.budget_available_bytes, 32ull << 20);
  EXPECT_EQ(s.staging_pool_bytes, kSlots * kSlotBytes);
  EXPECT_EQ(s.staging_slots, static_cast<uint64_t>(kSlots));
  EXPECT_EQ(s.resident_bytes, 0u);
}

TEST_F(CudaBackendTest, PoolThatDoesNotFitTheBudgetIsRefused) {
  CudaOptions o = Options("adaptive", 1 << 20);  // 512 KiB available.
  o.staging_slots = 4;
  o.staging_slot_bytes = 256 * 1024;
  auto cuda = CudaBackend::Create(o);
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cuda.status().message(), HasSubstr("does not fit the VRAM budget"));
}

// Through the store and the engine, as the service uses them: replies (the
// encoded params) are byte-identical to the CPU backend's.
TEST_F(CudaBackendTest, StepEngineRepliesMatchTheCpuBackend) {
  for (const char* paging : {"adaptive", "fully_paged"}) {
    SCOPED_TRACE(paging);
    auto cuda = CudaBackend::Create(Options(paging));
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    ThreadPool pool(2);
    CpuBackend cpu(&pool);
    StateStore gpu_store(cuda->get(), 1ull << 30, kPage);
    StateStore cpu_store(&cpu, 1ull << 30, kPage);
    StepEngine gpu_engine(&gpu_store, cuda->get(), &pool);
    StepEngine cpu_engine(&cpu_store, &cpu, &pool);
    const GroupKey key{"", "layer.weight"};
    GroupConfig config;
    config.num_elements = 10 * kPage + 17;
    config.has_initial_values = true;
    ASSERT_TRUE(gpu_store.Register(key, config).ok());
    ASSERT_TRUE(cpu_store.Register(key, config).ok());
    std::vector<float> init(config.num_elements);
    for (uint64_t i = 0; i < init.size(); ++i) init[i] = UniformSigned(77, i);
    const absl::string_view init_bytes(reinterpret_cast<const char*>(init.data()), init.size() * 4);
    ASSERT_TRUE(
        testing::WriteInitialValues(gpu_engine, key, 0, WireType::kFloat32, init_bytes).ok());
    ASSERT_TRUE(
        testing::WriteInitialValues(cpu_engine, key, 0, WireType::kFloat32, init_bytes).ok());
    for (uint64_t step = 1; step <= 4; ++step) {
      std::vector<uint16_t> grad(config.num_elements);
      for (uint64_t i = 0; i < grad.size(); ++i) {
        grad[i] = FloatToBFloat16(UniformSigned(step, i) * 0.1f);
      }
      // Two chunks: pages 0-5, then the rest (a replay of the first too).
      const uint64_t split = 6 * kPage;
      const std::vector<std::pair<uint64_t, uint64_t>> chunks = {
          {0, split}, {split, config.num_elements - split}, {0, split}};
      for (const auto& [offset, count] : chunks) {
        StepChunk chunk;
        chunk.group = key;
        chunk.step = step;
        chunk.offset = offset;
        chunk.gradient_type = WireType::kBFloat16;
        chunk.gradient =
            absl::string_view(reinterpret_cast<const char*>(grad.data() + offset), count * 2);
        chunk.param_type = step % 2 == 0 ? WireType::kBFloat16 : WireType::kFloat32;
        std::string gpu_reply, cpu_reply;
        auto g = testing::ApplyChunk(gpu_engine, chunk, &gpu_reply);
        auto c = testing::ApplyChunk(cpu_engine, chunk, &cpu_reply);
        ASSERT_TRUE(g.ok()) << g.status();
        ASSERT_TRUE(c.ok()) << c.status();
        EXPECT_EQ(g->pages_applied, c->pages_applied);
        EXPECT_EQ(g->pages_replayed, c->pages_replayed);
        EXPECT_TRUE(gpu_reply == cpu_reply) << "step " << step << " offset " << offset;
      }
    }
    ASSERT_TRUE(gpu_store.Delete(key).ok());
    ASSERT_TRUE(cpu_store.Delete(key).ok());
  }
}

}  // namespace
}  // namespace optstate
