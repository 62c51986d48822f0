// StateImport and the store's staging below gRPC: memory is counted while an
// import lasts and given back when it is dropped, nothing is visible before
// Commit, and a backend that cannot take the state (a device placement,
// which the default StepBackend hooks refuse) leaves nothing visible and
// nothing changed.
#include "server/durability/state_import.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/backends/cpu/cpu_backend.h"

namespace optstate {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kPage = 64;

// Places groups "on the device": the default ReadStateToHost and
// StateWritten then refuse them, as for any backend that keeps state
// elsewhere and does not override them (the CUDA backend does).
class DevicePlacingBackend : public CpuBackend {
 public:
  explicit DevicePlacingBackend(ThreadPool* pool) : CpuBackend(pool) {}
  absl::Status AttachGroup(Group& group) override {
    group.set_placement(device ? Placement::kDeviceResident : Placement::kHost);
    return absl::OkStatus();
  }
  bool device = false;
};

class StateImportTest : public ::testing::Test {
 protected:
  StateImportTest() : pool_(1), backend_(&pool_), store_(&backend_, 100000, kPage) {}

  std::string Floats(size_t n, float value) {
    std::vector<float> v(n, value);
    return std::string(reinterpret_cast<const char*>(v.data()), n * 4);
  }
  std::string Steps(std::vector<uint64_t> s) {
    return std::string(reinterpret_cast<const char*>(s.data()), s.size() * 8);
  }
  std::unique_ptr<StateImport> BeginWhole(const std::string& name, uint64_t n, float value,
                                          uint64_t step) {
    absl::StatusOr<std::unique_ptr<StateImport>> import =
        StateImport::Begin(&store_, &backend_, StateHeader{{"", name}, n, {}});
    EXPECT_TRUE(import.ok()) << import.status();
    if (!import.ok()) return nullptr;
    EXPECT_TRUE((*import)->AddChunk(StateTensor::kPageSteps, 0, Steps({step})).ok());
    EXPECT_TRUE((*import)->AddChunk(StateTensor::kParams, 0, Floats(n, value)).ok());
    EXPECT_TRUE((*import)->AddChunk(StateTensor::kExpAvg, 0, Floats(n, value / 2)).ok());
    EXPECT_TRUE((*import)->AddChunk(StateTensor::kExpAvgSq, 0, Floats(n, value / 4)).ok());
    return std::move(*import);
  }

  ThreadPool pool_;
  DevicePlacingBackend backend_;
  StateStore store_;
};

TEST_F(StateImportTest, MemoryIsCountedWhileAnImportLastsAndGivenBackWhenDropped) {
  {
    auto import = BeginWhole("g", 1000, 1.0f, 3);
    EXPECT_EQ(store_.host_bytes(), 12000u);
    EXPECT_EQ(store_.Find({"", "g"}).status().code(), absl::StatusCode::kNotFound);
  }
  EXPECT_EQ(store_.host_bytes(), 0u);
  absl::StatusOr<std::unique_ptr<StateImport>> too_big =
      StateImport::Begin(&store_, &backend_, StateHeader{{"", "big"}, 10000, {}});
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(too_big.status().message()), HasSubstr("--max_host_bytes"));
}

TEST_F(StateImportTest, CommitMakesTheWholeStateVisibleAtOnce) {
  auto import = BeginWhole("g", 1000, 1.0f, 3);
  absl::StatusOr<StateImport::Result> result = import->Commit();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->replaced);
  absl::StatusOr<std::shared_ptr<Group>> group = store_.Find({"", "g"});
  ASSERT_TRUE(group.ok());
  EXPECT_EQ((*group)->MinStep(), 3u);
  EXPECT_EQ((*group)->MaxStep(), 3u);
  EXPECT_EQ((*group)->PagesAwaitingValues(), 0u);
  EXPECT_EQ((*group)->params()[999], 1.0f);
  EXPECT_EQ((*group)->exp_avg()[0], 0.5f);
  EXPECT_EQ((*group)->exp_avg_sq()[500], 0.25f);
  import.reset();
  EXPECT_EQ(store_.host_bytes(), 12000u);  // Counted once, by the store now.
}

TEST_F(StateImportTest, AGroupWhoseStateAnImportReplacedStaysWhenItsRegistrationFails) {
  // A RegisterGroup call created "g" (its pages at step 0); an import at step
  // 0 replaced its state; the call then failed: the group stays (nothing of
  // it was ever stepped, but the state is the import's now).
  absl::StatusOr<StateStore::Registration> created = store_.Register({"", "g"}, [] {
    GroupConfig config;
    config.num_elements = 1000;
    config.has_initial_values = true;
    return config;
  }());
  ASSERT_TRUE(created.ok() && created->created);
  auto import = BeginWhole("g", 1000, 1.0f, 0);
  absl::StatusOr<StateImport::Result> result = import->Commit();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->replaced);
  EXPECT_EQ(created->group->MaxStep(), 0u);
  EXPECT_FALSE(store_.Unregister(created->group));
  EXPECT_TRUE(store_.Find({"", "g"}).ok());
}

// An amsgrad group's import needs max_exp_avg_sq (every element, >= 0); one
// without amsgrad refuses it; a replacement carries it over.
TEST_F(StateImportTest, AnAmsgradGroupNeedsItsMaxExpAvgSqAndOthersRefuseIt) {
  AdamWHyperparameters ams;
  ams.amsgrad = true;
  auto begin = [&](const std::string& name, const AdamWHyperparameters& h) {
    absl::StatusOr<std::unique_ptr<StateImport>> import =
        StateImport::Begin(&store_, &backend_, StateHeader{{"", name}, 100, h});
    EXPECT_TRUE(import.ok()) << import.status();
    EXPECT_TRUE((*import)->AddChunk(StateTensor::kPageSteps, 0, Steps({2})).ok());
    EXPECT_TRUE((*import)->AddChunk(StateTensor::kParams, 0, Floats(100, 1.0f)).ok());
    EXPECT_TRUE((*import)->AddChunk(StateTensor::kExpAvg, 0, Floats(100, 0.5f)).ok());
    EXPECT_TRUE((*import)->AddChunk(StateTensor::kExpAvgSq, 0, Floats(100, 0.25f)).ok());
    return std::move(*import);
  };
  auto missing = begin("a", ams);
  EXPECT_EQ(store_.host_bytes(), 1600u);  // 16 bytes per element with amsgrad.
  absl::StatusOr<StateImport::Result> refused = missing->Commit();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("max_exp_avg_sq covering elements [0, 0) of 100"));
  absl::Status negative = missing->AddChunk(StateTensor::kMaxExpAvgSq, 0, Floats(100, -1.0f));
  EXPECT_THAT(std::string(negative.message()), HasSubstr("max_exp_avg_sq is never below 0"));
  ASSERT_TRUE(missing->AddChunk(StateTensor::kMaxExpAvgSq, 0, Floats(100, 0.75f)).ok());
  ASSERT_TRUE(missing->Commit().ok());
  absl::StatusOr<std::shared_ptr<Group>> group = store_.Find({"", "a"});
  ASSERT_TRUE(group.ok());
  EXPECT_EQ((*group)->max_exp_avg_sq()[99], 0.75f);
  // Replaced by a second import of the same group.
  auto again = begin("a", ams);
  ASSERT_TRUE(again->AddChunk(StateTensor::kMaxExpAvgSq, 0, Floats(100, 2.0f)).ok());
  absl::StatusOr<StateImport::Result> replaced = again->Commit();
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_TRUE(replaced->replaced);
  EXPECT_EQ((*group)->max_exp_avg_sq()[0], 2.0f);
  // Without amsgrad: refused by name.
  auto plain = begin("b", AdamWHyperparameters{});
  absl::Status extra = plain->AddChunk(StateTensor::kMaxExpAvgSq, 0, Floats(100, 1.0f));
  EXPECT_EQ(extra.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(extra.message()), HasSubstr("amsgrad=false"));
}

// A step can leave +inf in the squares (a finite gradient of 1e22 squared);
// an import takes it. NaN there, or any non-finite param or exp_avg (what
// only a diverged run leaves), is refused unless the header accepts it, and
// the refused chunk leaves nothing.
TEST_F(StateImportTest, SquaresMayBeInfiniteButNothingElseThatIsNotFinite) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  absl::StatusOr<std::unique_ptr<StateImport>> import =
      StateImport::Begin(&store_, &backend_, StateHeader{{"", "g"}, 100, {}});
  ASSERT_TRUE(import.ok()) << import.status();
  StateImport& chunks = **import;
  ASSERT_TRUE(chunks.AddChunk(StateTensor::kPageSteps, 0, Steps({1})).ok());
  for (StateTensor t : {StateTensor::kParams, StateTensor::kExpAvg}) {
    for (float bad : {inf, -inf, nan}) {
      std::string values = Floats(100, 1.0f);
      std::memcpy(&values[4 * 40], &bad, 4);
      absl::Status refused = chunks.AddChunk(t, 0, values);
      EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << bad;
      EXPECT_THAT(std::string(refused.message()),
                  HasSubstr(absl::StrCat(StateTensorName(t), " element 40 is ", bad,
                                         "; values must be finite")));
      EXPECT_THAT(std::string(refused.message()), HasSubstr("accept_non_finite"));
    }
  }
  ASSERT_TRUE(chunks.AddChunk(StateTensor::kParams, 0, Floats(100, 1.0f)).ok());
  ASSERT_TRUE(chunks.AddChunk(StateTensor::kExpAvg, 0, Floats(100, 0.5f)).ok());
  for (float bad : {nan, -inf, -1.0f}) {
    absl::Status refused = chunks.AddChunk(StateTensor::kExpAvgSq, 0, Floats(100, bad));
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(refused.message()), HasSubstr("exp_avg_sq element 0 is"));
  }
  ASSERT_TRUE(chunks.AddChunk(StateTensor::kExpAvgSq, 0, Floats(100, inf)).ok());
  ASSERT_TRUE(chunks.Commit().ok());
  absl::StatusOr<std::shared_ptr<Group>> group = store_.Find({"", "g"});
  ASSERT_TRUE(group.ok());
  EXPECT_EQ((*group)->exp_avg_sq()[99], inf);
  EXPECT_EQ((*group)->params()[0], 1.0f);
}

// Finite gradients can leave any value in params and exp_avg (3.4e38 then
// -3.4e38: exp_avg -inf, params NaN) and +inf or NaN in the squares; with
// accept_non_finite an import takes it, as a restore does. A square below 0
// is refused still, and the refused chunk leaves nothing.
TEST_F(StateImportTest, ADivergedRunsStateIsTakenWhenAcceptedButASquareBelowZero) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  StateHeader header{{"", "g"}, 100, {}};
  header.accept_non_finite = true;
  absl::StatusOr<std::unique_ptr<StateImport>> import =
      StateImport::Begin(&store_, &backend_, header);
  ASSERT_TRUE(import.ok()) << import.status();
  StateImport& chunks = **import;
  ASSERT_TRUE(chunks.AddChunk(StateTensor::kPageSteps, 0, Steps({1})).ok());
  std::string params = Floats(100, 1.0f), exp_avg = Floats(100, 0.5f);
  std::string squares = Floats(100, 0.25f);
  for (int i = 0; i < 3; ++i) {
    const float odd[] = {inf, -inf, nan};
    std::memcpy(&params[4 * i], &odd[i], 4);
    std::memcpy(&exp_avg[4 * (i + 10)], &odd[i], 4);
  }
  std::memcpy(&squares[4 * 20], &inf, 4);
  std::memcpy(&squares[4 * 21], &nan, 4);
  ASSERT_TRUE(chunks.AddChunk(StateTensor::kParams, 0, params).ok());
  ASSERT_TRUE(chunks.AddChunk(StateTensor::kExpAvg, 0, exp_avg).ok());
  for (float bad : {-inf, -1.0f, -1e-45f}) {
    std::string negative = squares;
    std::memcpy(&negative[4 * 50], &bad, 4);
    absl::Status refused = chunks.AddChunk(StateTensor::kExpAvgSq, 0, negative);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(refused.message()),
                HasSubstr("exp_avg_sq element 50 is " + absl::StrCat(bad)));
    EXPECT_THAT(std::string(refused.message()), HasSubstr("is never below 0"));
  }
  ASSERT_TRUE(chunks.AddChunk(StateTensor::kExpAvgSq, 0, squares).ok());
  ASSERT_TRUE(chunks.Commit().ok());
  absl::StatusOr<std::shared_ptr<Group>> group = store_.Find({"", "g"});
  ASSERT_TRUE(group.ok());
  // Every value as sent, bit for bit (NaN included).
  EXPECT_EQ(std::memcmp((*group)->params(), params.data(), params.size()), 0);
  EXPECT_EQ(std::memcmp((*group)->exp_avg(), exp_avg.data(), exp_avg.size()), 0);
  EXPECT_EQ(std::memcmp((*group)->exp_avg_sq(), squares.data(), squares.size()), 0);
}

TEST_F(StateImportTest, ABackendThatCannotTakeTheStateLeavesNothingVisible) {
  backend_.device = true;
  auto import = BeginWhole("g", 1000, 1.0f, 3);
  absl::StatusOr<StateImport::Result> result = import->Commit();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("--backend=cpu"));
  EXPECT_EQ(store_.Find({"", "g"}).status().code(), absl::StatusCode::kNotFound);
  import.reset();
  EXPECT_EQ(store_.host_bytes(), 0u);
}

TEST_F(StateImportTest, ReplacingAGroupTheBackendCannotTakeChangesNothing) {
  backend_.device = true;
  absl::StatusOr<StateStore::Registration> registered =
      store_.Register({"", "g"}, GroupConfig{1000, {}, false});
  ASSERT_TRUE(registered.ok());
  Group& existing = *registered->group;
  existing.params()[7] = 42.0f;
  auto import = BeginWhole("g", 1000, 1.0f, 3);
  absl::StatusOr<StateImport::Result> result = import->Commit();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(existing.params()[7], 42.0f);
  EXPECT_EQ(existing.params()[8], 0.0f);
  EXPECT_EQ(existing.MaxStep(), 0u);
}

TEST_F(StateImportTest, PublishRefusesANameTakenMeanwhileAndKeepsTheStagedGroup) {
  absl::StatusOr<StagedGroup> staged = store_.Stage({"", "g"}, GroupConfig{100, {}, true});
  ASSERT_TRUE(staged.ok());
  ASSERT_TRUE(store_.Register({"", "g"}, GroupConfig{200, {}, false}).ok());
  EXPECT_EQ(store_.host_bytes(), 1200u + 2400u);
  absl::StatusOr<std::shared_ptr<Group>> published = store_.Publish(*staged);
  EXPECT_EQ(published.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(staged->group().num_elements(), 100u);
  EXPECT_EQ((*store_.Find({"", "g"}))->num_elements(), 200u);
}

TEST_F(StateImportTest, AnImportOfAnotherShapeThanTheExistingGroupIsAlreadyExists) {
  ASSERT_TRUE(store_.Register({"", "g"}, GroupConfig{200, {}, false}).ok());
  absl::StatusOr<std::unique_ptr<StateImport>> import =
      StateImport::Begin(&store_, &backend_, StateHeader{{"", "g"}, 100, {}});
  EXPECT_EQ(import.status().code(), absl::StatusCode::kAlreadyExists);
  AdamWHyperparameters other;
  other.beta2 = 0.95;
  import = StateImport::Begin(&store_, &backend_, StateHeader{{"", "g"}, 200, other});
  EXPECT_EQ(import.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(import.status().message()), HasSubstr("beta2=0.95"));
}

}  // namespace
}  // namespace optstate
