// StepEngine against a backend that fails part-way through a chunk: the group
// is refused from then on, so no retry can apply a page twice.
#include "server/engine/step_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "server/backends/cpu/cpu_backend.h"
#include "tests/testing/random_cuts.h"
#include "tests/testing/step_engine_calls.h"
#include "tests/testing/test_seed.h"

namespace optstate {
namespace {

using ::optstate::testing::SeedTrace;
using ::optstate::testing::TestSeed;

// Applies like the CPU backend, except that a range starting at or past
// `fail_from` fails after the ranges before it were applied.
class FailingBackend : public CpuBackend {
 public:
  explicit FailingBackend(ThreadPool* pool) : CpuBackend(pool) {}
  absl::Status Apply(Group& group, uint64_t begin, uint64_t end, const void* grad,
                     WireType grad_type, const AdamWConstants& constants) override {
    if (begin >= fail_from.load()) return absl::InternalError("device fault (injected)");
    return CpuBackend::Apply(group, begin, end, grad, grad_type, constants);
  }
  absl::Status ApplyAndEncode(Group& group, uint64_t begin, uint64_t end,
                              const SegmentedBytes& gradient, size_t grad_offset,
                              WireType grad_type, const AdamWConstants& constants, void* params_out,
                              WireType params_type, ParamsStore store) override {
    if (begin >= fail_from.load()) return absl::InternalError("device fault (injected)");
    return CpuBackend::ApplyAndEncode(group, begin, end, gradient, grad_offset, grad_type,
                                      constants, params_out, params_type, store);
  }
  std::atomic<uint64_t> fail_from{UINT64_MAX};
};

class StepEngineTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kPage = 64;

  StepEngineTest()
      : pool_(2),
        backend_(&pool_),
        store_(&backend_, 1 << 30, kPage),
        engine_(&store_, &backend_, &pool_) {}

  absl::StatusOr<StepChunkResult> Step(uint64_t step, uint64_t offset,
                                       const std::vector<float>& grad) {
    StepChunk chunk;
    chunk.group = GroupKey{"", "g"};
    chunk.step = step;
    chunk.offset = offset;
    chunk.gradient =
        absl::string_view(reinterpret_cast<const char*>(grad.data()), grad.size() * sizeof(float));
    std::string params;
    return testing::ApplyChunk(engine_, chunk, &params);
  }

  ThreadPool pool_;
  FailingBackend backend_;
  StateStore store_;
  StepEngine engine_;
};

TEST_F(StepEngineTest, BackendFailingPartWayMarksTheGroupBrokenAndRefusesLaterChunks) {
  GroupConfig config;
  config.num_elements = 3 * kPage;
  ASSERT_TRUE(store_.Register(GroupKey{"", "g"}, config).ok());
  // Page 1 is already at step 1, so step 1 of the whole group applies pages
  // 0 and 2 as two separate runs; the second run fails.
  ASSERT_TRUE(Step(1, kPage, std::vector<float>(kPage, 0.1f)).ok());
  backend_.fail_from = 2 * kPage;
  absl::StatusOr<StepChunkResult> failed = Step(1, 0, std::vector<float>(3 * kPage, 0.1f));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();

  backend_.fail_from = UINT64_MAX;
  absl::StatusOr<StepChunkResult> retried = Step(1, 0, std::vector<float>(3 * kPage, 0.1f));
  EXPECT_EQ(retried.status().code(), absl::StatusCode::kDataLoss) << retried.status();
  EXPECT_NE(retried.status().message().find("delete it and register it again"), std::string::npos);
  // Deleting and registering again gives a working group.
  ASSERT_TRUE(store_.Delete(GroupKey{"", "g"}).ok());
  ASSERT_TRUE(store_.Register(GroupKey{"", "g"}, config).ok());
  EXPECT_TRUE(Step(1, 0, std::vector<float>(3 * kPage, 0.1f)).ok());
}

// Validate then Apply is testing::ApplyChunk in two halves: Validate touches nothing
// (the page stays at step 0 and its params at 0), Apply does the update, and
// a group deleted in between is NOT_FOUND at Apply.
TEST_F(StepEngineTest, ValidateChangesNothingAndApplyFindsAGroupDeletedMeanwhile) {
  GroupConfig config;
  config.num_elements = kPage;
  auto group = store_.Register(GroupKey{"", "g"}, config);
  ASSERT_TRUE(group.ok());
  std::vector<float> grad(kPage, 0.5f);
  StepChunk chunk;
  chunk.group = GroupKey{"", "g"};
  chunk.step = 1;
  chunk.gradient = absl::string_view(reinterpret_cast<const char*>(grad.data()), kPage * 4);
  absl::StatusOr<ValidatedChunk> validated = engine_.Validate(chunk);
  ASSERT_TRUE(validated.ok()) << validated.status();
  EXPECT_EQ(validated->count, kPage);
  EXPECT_EQ(group->group->page_step(0), 0u);
  EXPECT_EQ(group->group->params()[0], 0.0f);
  std::string params;
  auto reserve = [&params](size_t bytes) {
    params.resize(bytes);
    return params.data();
  };
  absl::StatusOr<StepChunkResult> applied = engine_.Apply(chunk, *validated, reserve);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(applied->pages_applied, 1u);
  EXPECT_EQ(group->group->page_step(0), 1u);
  EXPECT_EQ(params.size(), kPage * 4);

  chunk.step = 2;
  validated = engine_.Validate(chunk);
  ASSERT_TRUE(validated.ok());
  ASSERT_TRUE(store_.Delete(GroupKey{"", "g"}).ok());
  applied = engine_.Apply(chunk, *validated, reserve);
  EXPECT_EQ(applied.status().code(), absl::StatusCode::kNotFound) << applied.status();

  // What Validate refuses: no such group, a non-finite gradient.
  EXPECT_EQ(engine_.Validate(chunk).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store_.Register(GroupKey{"", "g"}, config).ok());
  grad[7] = std::nanf("");
  EXPECT_EQ(engine_.Validate(chunk).status().code(), absl::StatusCode::kInvalidArgument);
}

// A backend left with StepBackend's own ApplyAndEncode: it gathers a
// gradient split across pieces, then applies and encodes.
class GatheringBackend : public CpuBackend {
 public:
  explicit GatheringBackend(ThreadPool* pool) : CpuBackend(pool) {}
  absl::Status ApplyAndEncode(Group& group, uint64_t begin, uint64_t end,
                              const SegmentedBytes& gradient, size_t grad_offset,
                              WireType grad_type, const AdamWConstants& constants, void* params_out,
                              WireType params_type, ParamsStore store) override {
    return StepBackend::ApplyAndEncode(group, begin, end, gradient, grad_offset, grad_type,
                                       constants, params_out, params_type, store);
  }
};

// `bytes` cut into pieces at random (empty pieces included, and cuts inside
// elements).
SegmentedBytes RandomPieces(const std::string& bytes, std::mt19937_64& rng) {
  SegmentedBytes pieces;
  ::optstate::testing::ForEachPiece(bytes, ::optstate::testing::RandomCuts(bytes.size(), 40, rng),
                                    [&](absl::string_view piece) { pieces.Append(piece); });
  return pieces;
}

// Bit-identical state: params, exp_avg and exp_avg_sq.
void ExpectSameState(const Group& a, const Group& b) {
  const size_t bytes = a.num_elements() * sizeof(float);
  ASSERT_EQ(b.num_elements(), a.num_elements());
  EXPECT_EQ(std::memcmp(a.params(), b.params(), bytes), 0);
  EXPECT_EQ(std::memcmp(a.exp_avg(), b.exp_avg(), bytes), 0);
  EXPECT_EQ(std::memcmp(a.exp_avg_sq(), b.exp_avg_sq(), bytes), 0);
}

// Pairs of equal groups stepped with the same gradient, one in a single
// buffer and one in pieces, through the CPU backend (pieces read in place,
// sharded) and through the default gather.
class StepEngineSegmentedTest : public ::testing::Test {
 protected:
  // A store and an engine on `backend`, holding groups "whole" and `other`
  // of `elements` elements each, pages of `page` elements.
  struct TwoGroups {
    TwoGroups(StepBackend* backend, ThreadPool* pool, uint64_t page, uint64_t elements,
              const std::string& other)
        : store(backend, 1 << 30, page), engine(&store, backend, pool) {
      GroupConfig config;
      config.num_elements = elements;
      auto registered_whole = store.Register(GroupKey{"", "whole"}, config);
      auto registered_other = store.Register(GroupKey{"", other}, config);
      EXPECT_TRUE(registered_whole.ok() && registered_other.ok());
      if (registered_whole.ok()) whole = registered_whole->group;
      if (registered_other.ok()) this->other = registered_other->group;
    }
    StateStore store;
    StepEngine engine;
    std::shared_ptr<Group> whole, other;
  };

  StepEngineSegmentedTest() : pool_(2), cpu_(&pool_), gathering_(&pool_), seed_(TestSeed()) {
    rng_.seed(seed_);
  }

  std::vector<StepBackend*> Backends() { return {&cpu_, &gathering_}; }

  // `elements` normal values, encoded as `type`.
  std::string RandomGradient(WireType type, uint64_t elements) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> grad(elements);
    for (float& g : grad) g = normal(rng_);
    std::string bytes(elements * WireTypeSize(type), '\0');
    EncodeFromFloat(type, grad.data(), bytes.data(), elements);
    return bytes;
  }

  ThreadPool pool_;
  CpuBackend cpu_;
  GatheringBackend gathering_;
  const uint64_t seed_;
  std::mt19937_64 rng_;
};

// A gradient in pieces steps the state exactly as the same bytes in one
// buffer do, and gives the same params.
TEST_F(StepEngineSegmentedTest, AGradientInPiecesStepsExactlyAsOneBuffer) {
  SCOPED_TRACE(SeedTrace(seed_));
  constexpr uint64_t kElements = 40000;  // Two shards on two threads.
  for (StepBackend* backend : Backends()) {
    for (WireType grad_type : {WireType::kFloat32, WireType::kBFloat16, WireType::kFloat16}) {
      TwoGroups groups(backend, &pool_, 64, kElements, "cut");
      ASSERT_TRUE(groups.whole && groups.other);
      for (uint64_t step = 1; step <= 3; ++step) {
        const std::string bytes = RandomGradient(grad_type, kElements);
        StepChunk chunk;
        chunk.step = step;
        chunk.gradient_type = grad_type;
        chunk.param_type = step == 2 ? WireType::kBFloat16 : WireType::kFloat32;
        chunk.group = GroupKey{"", "whole"};
        chunk.gradient = bytes;
        std::string whole_params, cut_params;
        ASSERT_TRUE(testing::ApplyChunk(groups.engine, chunk, &whole_params).ok());
        chunk.group = GroupKey{"", "cut"};
        chunk.gradient = RandomPieces(bytes, rng_);
        ASSERT_TRUE(testing::ApplyChunk(groups.engine, chunk, &cut_params).ok());
        ASSERT_EQ(whole_params, cut_params) << "step " << step;
      }
      ExpectSameState(*groups.whole, *groups.other);
    }
  }
}

// A chunk whose first page is replayed applies the rest from the gradient's
// later bytes (a non-zero offset into its pieces): the same state and params
// as one update of the whole chunk.
TEST_F(StepEngineSegmentedTest, AReplayedPageBeforeAnAppliedRunReadsTheGradientAtItsOffset) {
  SCOPED_TRACE(SeedTrace(seed_));
  constexpr uint64_t kPage = 64;
  constexpr uint64_t kElements = 3 * kPage + 5;
  for (StepBackend* backend : Backends()) {
    for (WireType grad_type : {WireType::kFloat32, WireType::kBFloat16}) {
      TwoGroups groups(backend, &pool_, kPage, kElements, "replayed");
      ASSERT_TRUE(groups.whole && groups.other);
      const std::string bytes = RandomGradient(grad_type, kElements);
      StepChunk chunk;
      chunk.step = 1;
      chunk.gradient_type = grad_type;
      chunk.group = GroupKey{"", "whole"};
      chunk.gradient = bytes;
      std::string whole_params;
      ASSERT_TRUE(testing::ApplyChunk(groups.engine, chunk, &whole_params).ok());
      // Page 0 first, then the whole chunk in pieces: page 0 is replayed.
      chunk.group = GroupKey{"", "replayed"};
      chunk.gradient = absl::string_view(bytes).substr(0, kPage * WireTypeSize(grad_type));
      std::string first_page;
      ASSERT_TRUE(testing::ApplyChunk(groups.engine, chunk, &first_page).ok());
      chunk.gradient = RandomPieces(bytes, rng_);
      std::string replayed_params;
      absl::StatusOr<StepChunkResult> result =
          testing::ApplyChunk(groups.engine, chunk, &replayed_params);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->pages_replayed, 1u);
      EXPECT_EQ(result->pages_applied, 3u);
      ASSERT_EQ(replayed_params, whole_params);
      ExpectSameState(*groups.whole, *groups.other);
    }
  }
}

// A non-finite element split across pieces is found, at its own index.
TEST_F(StepEngineTest, ANonFiniteElementSplitAcrossPiecesIsRefusedAtItsIndex) {
  GroupConfig config;
  config.num_elements = kPage;
  ASSERT_TRUE(store_.Register(GroupKey{"", "g"}, config).ok());
  std::vector<uint16_t> grad(kPage, 0x3f80);  // bf16 1.0
  grad[37] = 0x7fc0;                          // bf16 NaN
  const absl::string_view bytes(reinterpret_cast<const char*>(grad.data()), kPage * 2);
  SegmentedBytes pieces;
  pieces.Append(bytes.substr(0, 75));  // Element 37 is bytes 74 and 75.
  pieces.Append(bytes.substr(75));
  StepChunk chunk;
  chunk.group = GroupKey{"", "g"};
  chunk.step = 1;
  chunk.gradient_type = WireType::kBFloat16;
  chunk.gradient = pieces;
  absl::StatusOr<ValidatedChunk> validated = engine_.Validate(chunk);
  EXPECT_EQ(validated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(validated.status().message().find("at element 37 "), std::string::npos)
      << validated.status();
}

TEST_F(StepEngineTest, InitialValuesForADeletedGroupAreRefusedEvenIfTheNameIsReused) {
  GroupConfig config;
  config.num_elements = kPage;
  config.has_initial_values = true;
  auto first = store_.Register(GroupKey{"", "g"}, config);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(store_.Delete(GroupKey{"", "g"}).ok());
  ASSERT_TRUE(store_.Register(GroupKey{"", "g"}, config).ok());
  std::vector<float> values(kPage, 3.0f);
  absl::string_view bytes(reinterpret_cast<const char*>(values.data()), kPage * sizeof(float));
  absl::Status s = engine_.WriteInitialValues(*first->group, 0, WireType::kFloat32, bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  auto now = store_.Find(GroupKey{"", "g"});
  ASSERT_TRUE(now.ok());
  EXPECT_EQ((*now)->params()[0], 0.0f);  // The new group was not written.
  EXPECT_FALSE((*now)->page_has_values(0));
}

}  // namespace
// torch reads every hyperparameter from param_groups at each step: a chunk's
// overrides step exactly as the kernel does with those hyperparameters (the
// bias corrections with this step's betas), and unset ones stay the group's.
TEST_F(StepEngineTest, AChunksHyperparametersOverrideTheGroupsForThatStepOnly) {
  GroupConfig config;
  config.num_elements = kPage + 5;
  config.has_initial_values = false;
  ASSERT_TRUE(store_.Register(GroupKey{"", "g"}, config).ok());
  std::mt19937_64 rng(TestSeed());
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  std::vector<float> p(config.num_elements, 0.0f), m(p), v(p);
  AdamWHyperparameters overridden;
  overridden.lr = 2e-3;
  overridden.beta1 = 0.85;
  overridden.beta2 = 0.98;
  overridden.eps = 1e-7;
  overridden.weight_decay = 0.05;
  overridden.maximize = true;
  for (uint64_t step = 1; step <= 3; ++step) {
    std::vector<float> grad(config.num_elements);
    for (float& g : grad) g = normal(rng);
    StepChunk chunk;
    chunk.group = GroupKey{"", "g"};
    chunk.step = step;
    chunk.gradient = absl::string_view(reinterpret_cast<const char*>(grad.data()),
                                       grad.size() * sizeof(float));
    AdamWStepInputs inputs;
    inputs.step = step;
    if (step == 2) {  // Steps 1 and 3 take the group's own.
      chunk.lr = overridden.lr;
      chunk.beta1 = overridden.beta1;
      chunk.beta2 = overridden.beta2;
      chunk.eps = overridden.eps;
      chunk.weight_decay = overridden.weight_decay;
      chunk.maximize = overridden.maximize;
      inputs.hyperparameters = overridden;
    }
    std::string params;
    absl::StatusOr<StepChunkResult> result = testing::ApplyChunk(engine_, chunk, &params);
    ASSERT_TRUE(result.ok()) << result.status();
    AdamWUpdateScalar(ComputeAdamWConstants(inputs), p.data(), m.data(), v.data(), grad.data(),
                      WireType::kFloat32, p.size());
  }
  absl::StatusOr<std::shared_ptr<Group>> group = store_.Find(GroupKey{"", "g"});
  ASSERT_TRUE(group.ok());
  EXPECT_EQ(std::memcmp((*group)->params(), p.data(), p.size() * 4), 0);
  EXPECT_EQ(std::memcmp((*group)->exp_avg(), m.data(), m.size() * 4), 0);
  EXPECT_EQ(std::memcmp((*group)->exp_avg_sq(), v.data(), v.size() * 4), 0);
  EXPECT_FALSE((*group)->config().hyperparameters.maximize);  // The registration is unchanged.
}

TEST_F(StepEngineTest, AnOverrideOutOfRangeIsRefusedNamingItAndAppliesNothing) {
  GroupConfig config;
  config.num_elements = kPage;
  ASSERT_TRUE(store_.Register(GroupKey{"", "g"}, config).ok());
  std::vector<float> grad(kPage, 0.25f);
  StepChunk chunk;
  chunk.group = GroupKey{"", "g"};
  chunk.step = 1;
  chunk.gradient = absl::string_view(reinterpret_cast<const char*>(grad.data()), kPage * 4);
  chunk.beta2 = 1.0;
  std::string params;
  absl::StatusOr<StepChunkResult> refused = testing::ApplyChunk(engine_, chunk, &params);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("beta2 must be in [0, 1)"), std::string::npos)
      << refused.status();
  chunk.beta2.reset();
  chunk.eps = 0.0;
  refused = testing::ApplyChunk(engine_, chunk, &params);
  EXPECT_NE(refused.status().message().find("eps must be finite and > 0"), std::string::npos)
      << refused.status();
  absl::StatusOr<std::shared_ptr<Group>> group = store_.Find(GroupKey{"", "g"});
  ASSERT_TRUE(group.ok());
  EXPECT_EQ((*group)->page_step(0), 0u);
  EXPECT_EQ((*group)->exp_avg()[0], 0.0f);
}

}  // namespace optstate
