// Checkpoints, exports, imports and restores of groups the CUDA backend keeps
// on the device (resident, or paged through the staging pool), against the
// same groups on the CPU backend: what is saved equals the host group's state
// bit for bit (also page by page while steps run), and state brought back in
// steps on like the uninterrupted run.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/backends/cuda/cuda_backend.h"
#include "server/base/thread_pool.h"
#include "server/durability/checkpointer.h"
#include "server/durability/page_capture.h"
#include "server/durability/state_import.h"
#include "server/engine/state_store.h"
#include "server/engine/step_engine.h"
#include "server/state/page_range_lock.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/testing/reference_adamw.h"
#include "tests/testing/step_engine_calls.h"

namespace optstate {
namespace {

using ::optstate::testing::CountBitDifferences;
using ::optstate::testing::UniformSigned;

constexpr uint64_t kPage = 4096;
constexpr uint64_t kElements = 10 * kPage + 17;  // 11 pages, the last one short.
const GroupKey kKey{"", "layer.weight"};

CudaOptions Options(const std::string& paging) {
  CudaOptions o;
  o.paging = paging;
  o.vram_target_utilization = 0.5;
  o.staging_slots = 3;
  o.staging_slot_bytes = 64 * 1024;  // Several pieces per step.
  return o;
}

GroupConfig Config() {
  GroupConfig config;
  config.num_elements = kElements;
  config.has_initial_values = true;
  return config;
}

// A store and an engine over one backend, as optstated assembles them.
struct Daemon {
  Daemon(StepBackend* backend, ThreadPool* pool)
      : backend(backend), store(backend, 1ull << 30, kPage), engine(&store, backend, pool) {}

  std::shared_ptr<Group> group(const GroupKey& key = kKey) { return *store.Find(key); }

  StepBackend* backend;
  StateStore store;
  StepEngine engine;
};

void RegisterWithInitialValues(Daemon& d, const GroupKey& key = kKey) {
  ASSERT_TRUE(d.store.Register(key, Config()).ok());
  std::vector<float> init(kElements);
  for (uint64_t i = 0; i < kElements; ++i) init[i] = UniformSigned(77, i);
  ASSERT_TRUE(testing::WriteInitialValues(
                  d.engine, key, 0, WireType::kFloat32,
                  absl::string_view(reinterpret_cast<const char*>(init.data()), kElements * 4))
                  .ok());
}

// Chunks [first_chunk, end_chunk) of step `step` of group `key`, cut in two
// chunks (pages 0-5, then the rest), with bf16 gradients on even steps and
// fp32 on odd ones; returns the replies.
std::string StepChunks(Daemon& d, const GroupKey& key, uint64_t step, uint64_t seed,
                       int first_chunk, int end_chunk) {
  const WireType type = step % 2 == 0 ? WireType::kBFloat16 : WireType::kFloat32;
  const size_t size = WireTypeSize(type);
  std::vector<unsigned char> grad(kElements * size);
  for (uint64_t i = 0; i < kElements; ++i) {
    const float x = UniformSigned(1000 * step + seed, i) * 0.1f;
    if (type == WireType::kFloat32) {
      std::memcpy(grad.data() + 4 * i, &x, 4);
    } else {
      const uint16_t h = FloatToBFloat16(x);
      std::memcpy(grad.data() + 2 * i, &h, 2);
    }
  }
  std::string replies;
  const uint64_t split = 6 * kPage;
  const std::pair<uint64_t, uint64_t> chunks[2] = {{0, split}, {split, kElements - split}};
  for (int c = first_chunk; c < end_chunk; ++c) {
    const auto [offset, count] = chunks[c];
    StepChunk chunk;
    chunk.group = key;
    chunk.step = step;
    chunk.offset = offset;
    chunk.gradient_type = type;
    chunk.gradient =
        absl::string_view(reinterpret_cast<const char*>(grad.data() + offset * size), count * size);
    std::string reply;
    absl::StatusOr<StepChunkResult> r = testing::ApplyChunk(d.engine, chunk, &reply);
    EXPECT_TRUE(r.ok()) << "step " << step << ": " << r.status();
    replies += reply;
  }
  return replies;
}

// The whole step `step` of the test's group.
std::string Step(Daemon& d, uint64_t step, uint64_t seed = 0) {
  return StepChunks(d, kKey, step, seed, 0, 2);
}

// The group's state as ExportState and a checkpoint read it: CapturePages,
// three pages at a time.
CapturedPages CaptureAll(Daemon& d, const GroupKey& key = kKey) {
  std::shared_ptr<Group> g = d.group(key);
  CapturedPages all;
  for (uint64_t first = 0; first < g->num_pages(); first += 3) {
    CapturedPages run;
    const uint64_t end = std::min(g->num_pages(), first + 3);
    absl::Status s = CapturePages(*d.backend, *g, first, end, &run);
    EXPECT_TRUE(s.ok()) << s;
    all.params.insert(all.params.end(), run.params.begin(), run.params.end());
    all.exp_avg.insert(all.exp_avg.end(), run.exp_avg.begin(), run.exp_avg.end());
    all.exp_avg_sq.insert(all.exp_avg_sq.end(), run.exp_avg_sq.begin(), run.exp_avg_sq.end());
    all.steps.insert(all.steps.end(), run.steps.begin(), run.steps.end());
    all.has_values.insert(all.has_values.end(), run.has_values.begin(), run.has_values.end());
  }
  return all;
}

void ExpectSameState(const CapturedPages& got, const CapturedPages& want) {
  ASSERT_EQ(got.params.size(), kElements);
  ASSERT_EQ(want.params.size(), kElements);
  EXPECT_EQ(CountBitDifferences(got.params.data(), want.params.data(), kElements), 0u);
  EXPECT_EQ(CountBitDifferences(got.exp_avg.data(), want.exp_avg.data(), kElements), 0u);
  EXPECT_EQ(CountBitDifferences(got.exp_avg_sq.data(), want.exp_avg_sq.data(), kElements), 0u);
  EXPECT_EQ(got.steps, want.steps);
  EXPECT_EQ(got.has_values, want.has_values);
}

// The float64 reference of the uninterrupted run agrees too (the CPU backend
// is not its own judge).
void ExpectNearFloat64Reference(const CapturedPages& got, uint64_t steps) {
  const AdamWHyperparameters& h = Config().hyperparameters;
  const testing::ReferenceHyperparameters rh{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
  testing::ReferenceState ref{std::vector<double>(kElements), std::vector<double>(kElements, 0.0),
                              std::vector<double>(kElements, 0.0)};
  for (uint64_t i = 0; i < kElements; ++i) ref.params[i] = UniformSigned(77, i);
  std::vector<double> g(kElements);
  for (uint64_t step = 1; step <= steps; ++step) {
    for (uint64_t i = 0; i < kElements; ++i) {
      const float x = UniformSigned(1000 * step, i) * 0.1f;
      g[i] = step % 2 == 0 ? BFloat16ToFloat(FloatToBFloat16(x)) : x;
    }
    testing::ReferenceAdamWStep(rh, step, g, &ref);
  }
  EXPECT_LE(testing::RelativeL2Error(got.params, ref.params), 1e-5);
  EXPECT_LE(testing::RelativeL2Error(got.exp_avg, ref.exp_avg), 1e-5);
  EXPECT_LE(testing::RelativeL2Error(got.exp_avg_sq, ref.exp_avg_sq), 1e-5);
}

// Sends `state` into `d` through StateImport, as ImportState does (1 MiB
// runs per tensor, one step per page).
absl::Status Import(Daemon& d, const CapturedPages& state) {
  absl::StatusOr<std::unique_ptr<StateImport>> import = StateImport::Begin(
      &d.store, d.backend, StateHeader{kKey, kElements, Config().hyperparameters});
  if (!import.ok()) return import.status();
  const absl::string_view steps(reinterpret_cast<const char*>(state.steps.data()),
                                state.steps.size() * 8);
  if (absl::Status s = (*import)->AddChunk(StateTensor::kPageSteps, 0, steps); !s.ok()) return s;
  const std::pair<StateTensor, const std::vector<float>*> tensors[] = {
      {StateTensor::kParams, &state.params},
      {StateTensor::kExpAvg, &state.exp_avg},
      {StateTensor::kExpAvgSq, &state.exp_avg_sq}};
  constexpr uint64_t kRun = 1 << 18;
  for (const auto& [tensor, values] : tensors) {
    for (uint64_t at = 0; at < kElements; at += kRun) {
      const uint64_t n = std::min(kRun, kElements - at);
      absl::Status s = (*import)->AddChunk(
          tensor, at, absl::string_view(reinterpret_cast<const char*>(values->data() + at), n * 4));
      if (!s.ok()) return s;
    }
  }
  return (*import)->Commit().status();
}

std::string MakeTempDir() {
  std::string pattern = ::testing::TempDir() + "cuda_durability_XXXXXX";
  return mkdtemp(pattern.data()) != nullptr ? pattern : "";
}

CheckpointerOptions CheckpointsIn(const std::string& dir) {
  CheckpointerOptions o;
  o.state_dir = dir;
  o.buffer_bytes = 3 * kPage * kStateBytesPerElement;  // Several runs per group.
  return o;
}

absl::StatusOr<CheckpointOutcome> CheckpointAtStep(Checkpointer& checkpointer, uint64_t step) {
  CheckpointCall call;
  call.groups = {kKey};
  call.wait_for_step = step;
  call.deadline = absl::Now() + absl::Seconds(30);
  return checkpointer.Checkpoint(call);
}

// Parameter: the paging strategy, "none" (the group is resident) or
// "fully_paged" (paged through the staging pool).
class CudaDurabilityTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    OPTSTATE_REQUIRE_DEVICE();
    dir_ = MakeTempDir();
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  absl::StatusOr<std::unique_ptr<CudaBackend>> NewCuda() {
    return CudaBackend::Create(Options(GetParam()), &pool_);
  }
  Placement Expected() const {
    return GetParam() == "none" ? Placement::kDeviceResident : Placement::kDevicePaged;
  }

  ThreadPool pool_{2};
  std::string dir_;
};

TEST_P(CudaDurabilityTest, ExportEqualsTheHostGroupBitForBit) {
  auto cuda = NewCuda();
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  CpuBackend cpu(&pool_);
  Daemon gpu(cuda->get(), &pool_), ref(&cpu, &pool_);
  RegisterWithInitialValues(gpu);
  RegisterWithInitialValues(ref);
  ASSERT_EQ(gpu.group()->placement(), Expected());
  for (uint64_t step = 1; step <= 5; ++step) EXPECT_EQ(Step(gpu, step), Step(ref, step));
  const uint64_t outs_before = gpu.group()->counters().paging.page_outs.load();
  ExpectSameState(CaptureAll(gpu), CaptureAll(ref));
  if (Expected() == Placement::kDeviceResident) {
    // Every page came back from the device (m and v live only there).
    EXPECT_EQ(gpu.group()->counters().paging.page_outs.load() - outs_before,
              gpu.group()->num_pages());
  } else {
    // A paged group's host arrays were its state already: nothing copied.
    EXPECT_EQ(gpu.group()->counters().paging.page_outs.load(), outs_before);
  }
  // Reading the state changes nothing on the device: steps go on alike.
  for (uint64_t step = 6; step <= 7; ++step) EXPECT_EQ(Step(gpu, step), Step(ref, step));
  const CapturedPages after = CaptureAll(gpu);
  ExpectSameState(after, CaptureAll(ref));
  ExpectNearFloat64Reference(after, 7);
}

TEST_P(CudaDurabilityTest, CheckpointRestoresToTheHostGroupsStateBitForBit) {
  auto cuda = NewCuda();
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  CpuBackend cpu(&pool_);
  Daemon gpu(cuda->get(), &pool_), ref(&cpu, &pool_);
  {
    auto checkpointer = Checkpointer::OpenAndRestore(CheckpointsIn(dir_), &gpu.store, gpu.backend,
                                                     /*require_state=*/false);
    ASSERT_TRUE(checkpointer.ok()) << checkpointer.status();
    RegisterWithInitialValues(gpu);
    RegisterWithInitialValues(ref);
    ASSERT_EQ(gpu.group()->placement(), Expected());
    for (uint64_t step = 1; step <= 5; ++step) EXPECT_EQ(Step(gpu, step), Step(ref, step));
    absl::StatusOr<CheckpointOutcome> written = CheckpointAtStep(**checkpointer, 5);
    ASSERT_TRUE(written.ok()) << written.status();
    EXPECT_EQ(written->step, 5u);
  }
  // Restored by a daemon on the host: the file holds the host group's state.
  CpuBackend restore_cpu(&pool_);
  Daemon restored(&restore_cpu, &pool_);
  auto checkpointer = Checkpointer::OpenAndRestore(CheckpointsIn(dir_), &restored.store,
                                                   restored.backend, /*require_state=*/true);
  ASSERT_TRUE(checkpointer.ok()) << checkpointer.status();
  ExpectSameState(CaptureAll(restored), CaptureAll(ref));
}

TEST_P(CudaDurabilityTest, RestoreIntoTheDeviceStepsOnLikeTheUninterruptedRun) {
  CpuBackend cpu(&pool_);
  Daemon ref(&cpu, &pool_);
  {
    auto cuda = NewCuda();
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    Daemon before(cuda->get(), &pool_);
    auto checkpointer = Checkpointer::OpenAndRestore(CheckpointsIn(dir_), &before.store,
                                                     before.backend, /*require_state=*/false);
    ASSERT_TRUE(checkpointer.ok()) << checkpointer.status();
    RegisterWithInitialValues(before);
    RegisterWithInitialValues(ref);
    for (uint64_t step = 1; step <= 5; ++step) EXPECT_EQ(Step(before, step), Step(ref, step));
    ASSERT_TRUE(CheckpointAtStep(**checkpointer, 5).ok());
  }  // The first daemon ends: its backend and VRAM are gone.
  auto cuda = NewCuda();
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  Daemon after(cuda->get(), &pool_);
  auto checkpointer = Checkpointer::OpenAndRestore(CheckpointsIn(dir_), &after.store, after.backend,
                                                   /*require_state=*/true);
  ASSERT_TRUE(checkpointer.ok()) << checkpointer.status();
  ASSERT_EQ(after.group()->placement(), Expected());
  ExpectSameState(CaptureAll(after), CaptureAll(ref));
  const uint64_t ins_before = after.group()->counters().paging.page_ins.load();
  for (uint64_t step = 6; step <= 10; ++step) EXPECT_EQ(Step(after, step), Step(ref, step));
  // Each page moved in from the restored host arrays: with the first step
  // (resident), or with every step (paged).
  const uint64_t pages = after.group()->num_pages();
  EXPECT_EQ(after.group()->counters().paging.page_ins.load() - ins_before,
            Expected() == Placement::kDeviceResident ? pages : 5 * pages);
  const CapturedPages state = CaptureAll(after);
  ExpectSameState(state, CaptureAll(ref));
  ExpectNearFloat64Reference(state, 10);
}

TEST_P(CudaDurabilityTest, ImportIntoANewDeviceGroupStepsOnLikeTheUninterruptedRun) {
  auto cuda = NewCuda();
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  CpuBackend cpu(&pool_);
  Daemon gpu(cuda->get(), &pool_), ref(&cpu, &pool_);
  RegisterWithInitialValues(ref);
  for (uint64_t step = 1; step <= 5; ++step) Step(ref, step);
  absl::Status imported = Import(gpu, CaptureAll(ref));
  ASSERT_TRUE(imported.ok()) << imported;
  ASSERT_EQ(gpu.group()->placement(), Expected());
  ExpectSameState(CaptureAll(gpu), CaptureAll(ref));
  for (uint64_t step = 6; step <= 10; ++step) EXPECT_EQ(Step(gpu, step), Step(ref, step));
  ExpectSameState(CaptureAll(gpu), CaptureAll(ref));
}

TEST_P(CudaDurabilityTest, ImportOverASteppedDeviceGroupReplacesWhatTheDeviceHeld) {
  auto cuda = NewCuda();
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  CpuBackend cpu(&pool_);
  Daemon gpu(cuda->get(), &pool_), ref(&cpu, &pool_);
  RegisterWithInitialValues(gpu);
  RegisterWithInitialValues(ref);
  // The device group takes other gradients, so its device copy differs.
  for (uint64_t step = 1; step <= 3; ++step) Step(gpu, step, /*seed=*/555);
  for (uint64_t step = 1; step <= 5; ++step) Step(ref, step);
  absl::Status imported = Import(gpu, CaptureAll(ref));
  ASSERT_TRUE(imported.ok()) << imported;
  ExpectSameState(CaptureAll(gpu), CaptureAll(ref));
  for (uint64_t step = 6; step <= 10; ++step) EXPECT_EQ(Step(gpu, step), Step(ref, step));
  ExpectSameState(CaptureAll(gpu), CaptureAll(ref));
}

// A checkpoint does not stop steps: pages captured while another thread steps
// the group each equal the CPU group's page at the step captured with them.
TEST_P(CudaDurabilityTest, PagesCapturedWhileStepsRunAreEachConsistentWithTheirStep) {
  auto cuda = NewCuda();
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  CpuBackend cpu(&pool_);
  Daemon gpu(cuda->get(), &pool_), ref(&cpu, &pool_);
  RegisterWithInitialValues(gpu);
  RegisterWithInitialValues(ref);
  constexpr uint64_t kSteps = 20;
  std::vector<CapturedPages> at_step;  // The CPU group after each step.
  at_step.push_back(CaptureAll(ref));
  for (uint64_t step = 1; step <= kSteps; ++step) {
    Step(ref, step);
    at_step.push_back(CaptureAll(ref));
  }
  std::atomic<bool> done{false};
  std::thread stepper([&] {
    for (uint64_t step = 1; step <= kSteps; ++step) Step(gpu, step);
    done.store(true);
  });
  std::shared_ptr<Group> g = gpu.group();
  uint64_t captured = 0, mismatched = 0;
  CapturedPages page;
  while (!done.load()) {
    for (uint64_t p = 0; p < g->num_pages(); ++p) {
      absl::Status s = CapturePages(*gpu.backend, *g, p, p + 1, &page);
      ASSERT_TRUE(s.ok()) << s;
      const CapturedPages& want = at_step[page.steps[0]];
      const uint64_t n = page.end - page.begin;
      mismatched +=
          CountBitDifferences(page.params.data(), want.params.data() + page.begin, n) +
          CountBitDifferences(page.exp_avg.data(), want.exp_avg.data() + page.begin, n) +
          CountBitDifferences(page.exp_avg_sq.data(), want.exp_avg_sq.data() + page.begin, n);
      ++captured;
    }
  }
  stepper.join();
  EXPECT_GT(captured, 0u);
  EXPECT_EQ(mismatched, 0u) << "over " << captured << " pages captured";
  ExpectSameState(CaptureAll(gpu), at_step[kSteps]);
}

// Callers write whole pages; a range that cuts pages is copied to the device
// for its partial pages and marked stale for its whole ones.
TEST_P(CudaDurabilityTest, StateWrittenOverARangeThatCutsPagesIsSteppedOn) {
  auto cuda = NewCuda();
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  CpuBackend cpu(&pool_);
  Daemon gpu(cuda->get(), &pool_), ref(&cpu, &pool_);
  RegisterWithInitialValues(gpu);
  RegisterWithInitialValues(ref);
  for (uint64_t step = 1; step <= 3; ++step) EXPECT_EQ(Step(gpu, step), Step(ref, step));
  const uint64_t begin = kPage / 2, end = 4 * kPage + 100;
  for (Daemon* d : {&gpu, &ref}) {
    std::shared_ptr<Group> g = d->group();
    PageRangeLock lock(*g);
    ASSERT_TRUE(d->backend->ReadStateToHost(*g, 0, kElements).ok());
    for (uint64_t i = begin; i < end; ++i) {
      g->params()[i] = UniformSigned(5, i);
      g->exp_avg()[i] = UniformSigned(6, i) * 0.01f;
      g->exp_avg_sq()[i] = UniformSigned(7, i) * UniformSigned(7, i) * 1e-4f;
    }
    absl::Status s = d->backend->StateWritten(*g, begin, end);
    ASSERT_TRUE(s.ok()) << s;
  }
  ExpectSameState(CaptureAll(gpu), CaptureAll(ref));
  for (uint64_t step = 4; step <= 6; ++step) EXPECT_EQ(Step(gpu, step), Step(ref, step));
  ExpectSameState(CaptureAll(gpu), CaptureAll(ref));
}

// adaptive: a paged group promoted after a delete holds some pages in VRAM
// (those stepped since) and the rest on the host; a capture reads each from
// where it is.
TEST(CudaDurabilityPromotionTest, APromotedGroupIsCapturedFromWhereEachPageIs) {
  OPTSTATE_REQUIRE_DEVICE();
  CudaOptions options = Options("adaptive");
  // Room in VRAM for one group of kElements (12 bytes each), not two.
  options.vram_total_bytes =
      2 * (options.staging_slots * options.staging_slot_bytes + kElements * 12 * 3 / 2);
  ThreadPool pool(2);
  auto cuda = CudaBackend::Create(options, &pool);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  CpuBackend cpu(&pool);
  Daemon gpu(cuda->get(), &pool), ref(&cpu, &pool);
  const GroupKey a{"", "a"}, b{"", "b"};
  RegisterWithInitialValues(gpu, a);
  RegisterWithInitialValues(gpu, b);
  RegisterWithInitialValues(ref, b);
  ASSERT_EQ(gpu.group(a)->placement(), Placement::kDeviceResident);
  ASSERT_EQ(gpu.group(b)->placement(), Placement::kDevicePaged);
  for (uint64_t step = 1; step <= 2; ++step) {
    StepChunks(gpu, a, step, 0, 0, 2);
    EXPECT_EQ(StepChunks(gpu, b, step, 0, 0, 2), StepChunks(ref, b, step, 0, 0, 2));
  }
  ASSERT_TRUE(gpu.store.Delete(a).ok());
  std::shared_ptr<Group> promoted = gpu.group(b);
  ASSERT_EQ(promoted->placement(), Placement::kDeviceResident);
  // Step 3 of pages 0-5 only: they move into VRAM; pages 6-10 stay at step 2
  // on the host.
  EXPECT_EQ(StepChunks(gpu, b, 3, 0, 0, 1), StepChunks(ref, b, 3, 0, 0, 1));
  const uint64_t outs = promoted->counters().paging.page_outs.load();
  ExpectSameState(CaptureAll(gpu, b), CaptureAll(ref, b));
  EXPECT_EQ(promoted->counters().paging.page_outs.load() - outs, 6u);
  EXPECT_EQ(StepChunks(gpu, b, 3, 0, 1, 2), StepChunks(ref, b, 3, 0, 1, 2));
  EXPECT_EQ(StepChunks(gpu, b, 4, 0, 0, 2), StepChunks(ref, b, 4, 0, 0, 2));
  ExpectSameState(CaptureAll(gpu, b), CaptureAll(ref, b));
}

INSTANTIATE_TEST_SUITE_P(Placements, CudaDurabilityTest, ::testing::Values("none", "fully_paged"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "none" ? "Resident" : "Paged";
                         });

}  // namespace
}  // namespace optstate
