// A model of many tensors steps in one stream: 300 groups of mixed sizes,
// each exact against the references.
#include <gtest/gtest.h>

#include "optstate/client.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/random_tensors.h"

namespace optstate::testing {
namespace {

TEST(ManyGroupsTest, ThreeHundredGroupsStepInOneStreamAndMatchReferences) {
  auto daemon = DaemonProcess::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Client::Connect((*daemon)->target());
  ASSERT_TRUE(client.ok());
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);

  // Mostly small tensors (biases, norms, LoRA adapters), a few spanning pages.
  std::uniform_int_distribution<size_t> small(1, 70000);
  std::vector<size_t> sizes;
  for (int i = 0; i < 300; ++i) sizes.push_back(i % 50 == 0 ? 262144 * 2 + i : small(rng));
  std::vector<std::string> names;
  std::vector<GroupModel> models;
  std::vector<std::vector<float>> params(sizes.size()), grads(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    names.push_back("layers." + std::to_string(i) + ".weight");
    std::vector<float> initial = RandomNormal(rng, sizes[i], 1.0f);
    ASSERT_TRUE((*client)->RegisterGroup(names[i], initial).ok());
    models.emplace_back(initial, Hyperparameters{});
    params[i].resize(sizes[i]);
  }
  for (uint64_t t = 1; t <= 3; ++t) {
    std::vector<GroupStep> step;
    for (size_t i = 0; i < sizes.size(); ++i) {
      grads[i] = RandomNormal(rng, sizes[i], 1e-2f);
      step.push_back({names[i], grads[i], absl::MakeSpan(params[i])});
    }
    ASSERT_TRUE((*client)->Step(step, t).ok());
    for (size_t i = 0; i < sizes.size(); ++i) models[i].Step(t, grads[i]);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_EQ(params[i], models[i].params_fp32()) << names[i];
    ASSERT_LE(RelativeL2Error(params[i], models[i].params_f64()), 1e-6) << names[i];
  }
  absl::StatusOr<Stats> stats = (*client)->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->num_groups, 300u);
  for (const GroupStats& g : stats->groups) EXPECT_EQ(g.steps_completed, 3u) << g.info.name;
}

}  // namespace
}  // namespace optstate::testing
