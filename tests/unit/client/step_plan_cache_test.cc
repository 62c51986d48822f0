// StepPlanCache: which steps use a kept plan and with which per-step
// fields, and which define one (and under which number).
#include "client/transport/shared_memory/step_plan_cache.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace optstate::client_internal {
namespace {

constexpr WireType kF32 = WireType::kFloat32;

// Chunks of groups "g0", "g1", ... of 1,000 elements, side by side in region 1.
std::vector<PlanChunk> Chunks(size_t n, std::vector<std::string>* names) {
  names->clear();
  for (size_t k = 0; k < n; ++k) names->push_back("g" + std::to_string(k));
  std::vector<PlanChunk> chunks(n);
  for (size_t k = 0; k < n; ++k) {
    PlanChunk& c = chunks[k];
    c.group = (*names)[k];
    c.count = c.group_elements = 1000;
    c.gradient_region = c.params_region = 1;
    c.gradient_offset = k * 4000;
    c.params_offset = (n + k) * 4000;
  }
  return chunks;
}

// Defines a plan of `chunks` and says its reply came: its number.
uint64_t Defined(StepPlanCache& cache, const std::vector<PlanChunk>& chunks,
                 const std::string& session = "s") {
  const uint64_t number = cache.Define(session, kF32, kF32, chunks);
  cache.Defined(number);
  return number;
}

TEST(StepPlanCache, TheSameChunksUseThePlanOnceItsDefinitionWasAnswered) {
  StepPlanCache cache;
  std::vector<std::string> names;
  const std::vector<PlanChunk> chunks = Chunks(3, &names);
  EXPECT_FALSE(cache.Match("s", kF32, kF32, chunks).has_value());
  const uint64_t number = cache.Define("s", kF32, kF32, chunks);
  EXPECT_FALSE(cache.Match("s", kF32, kF32, chunks).has_value()) << "not answered yet";
  cache.Defined(number);
  // The caller's names may live elsewhere: compared by value.
  std::vector<std::string> other_names;
  const std::optional<PlanUse> use = cache.Match("s", kF32, kF32, Chunks(3, &other_names));
  ASSERT_TRUE(use.has_value());
  EXPECT_EQ(use->plan, number);
  EXPECT_FALSE(use->overrides.lr || use->overrides.beta1 || use->overrides.beta2 ||
               use->overrides.eps || use->overrides.weight_decay || use->overrides.maximize ||
               use->overrides.grad_scale);
  // Another session, dtype, size, offset, region, group or chunk count: no plan.
  EXPECT_FALSE(cache.Match("t", kF32, kF32, chunks).has_value());
  EXPECT_FALSE(cache.Match("s", WireType::kBFloat16, kF32, chunks).has_value());
  EXPECT_FALSE(cache.Match("s", kF32, WireType::kBFloat16, chunks).has_value());
  for (int field = 0; field < 6; ++field) {
    std::vector<PlanChunk> changed = chunks;
    PlanChunk& c = changed[1];
    if (field == 0) c.count = 999;
    if (field == 1) c.group_elements = 2000;
    if (field == 2) c.gradient_offset += 4;
    if (field == 3) c.params_region = 2;
    if (field == 4) c.offset = 512;
    if (field == 5) c.group = "h";
    EXPECT_FALSE(cache.Match("s", kF32, kF32, changed).has_value()) << "field " << field;
  }
  EXPECT_FALSE(cache.Match("s", kF32, kF32, Chunks(2, &other_names)).has_value());
}

TEST(StepPlanCache, PerStepFieldsOverrideWhenOneValueForAllElseRedefine) {
  StepPlanCache cache;
  std::vector<std::string> names;
  std::vector<PlanChunk> chunks = Chunks(3, &names);
  chunks[2].fields.weight_decay = 0.0;  // The plan: no decay for g2, the groups' own for the rest.
  Defined(cache, chunks);
  // One lr and one grad_scale for every chunk: overrides; weight decay as the plan's: unset.
  std::vector<PlanChunk> now = chunks;
  for (PlanChunk& c : now) {
    c.fields.lr = 2e-3;
    c.fields.grad_scale = 0.5f;
  }
  std::optional<PlanUse> use = cache.Match("s", kF32, kF32, now);
  ASSERT_TRUE(use.has_value());
  EXPECT_EQ(use->overrides.lr, 2e-3);
  EXPECT_EQ(use->overrides.grad_scale, 0.5f);
  EXPECT_FALSE(use->overrides.weight_decay.has_value());
  // An lr per group, a field set in some chunks only, or unset where the
  // plan had it: the chunks must be sent (defining the plan anew).
  now = chunks;
  now[0].fields.lr = 1e-3;
  now[1].fields.lr = 2e-3;
  now[2].fields.lr = 2e-3;
  EXPECT_FALSE(cache.Match("s", kF32, kF32, now).has_value());
  now = chunks;
  now[1].fields.beta1 = 0.8;
  EXPECT_FALSE(cache.Match("s", kF32, kF32, now).has_value());
  now = chunks;
  now[2].fields.weight_decay.reset();
  EXPECT_FALSE(cache.Match("s", kF32, kF32, now).has_value());
  // One weight decay for all, where the plan had two: an override.
  for (PlanChunk& c : now) c.fields.weight_decay = 0.1;
  use = cache.Match("s", kF32, kF32, now);
  ASSERT_TRUE(use.has_value());
  EXPECT_EQ(use->overrides.weight_decay, 0.1);
}

TEST(StepPlanCache, KeepsFourPlansAndReplacesTheLeastRecentlyUsed) {
  StepPlanCache cache;
  std::vector<std::string> names[5];
  std::vector<PlanChunk> layouts[5];
  for (size_t k = 0; k < 5; ++k) layouts[k] = Chunks(k + 1, &names[k]);
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(Defined(cache, layouts[k]), k + 1);
  // Layout 0 used again: layout 1 is now the least recently used, and the
  // fifth layout takes its number.
  ASSERT_TRUE(cache.Match("s", kF32, kF32, layouts[0]).has_value());
  EXPECT_EQ(Defined(cache, layouts[4]), 2u);
  EXPECT_FALSE(cache.Match("s", kF32, kF32, layouts[1]).has_value());
  for (size_t k : {0, 2, 3, 4}) {
    EXPECT_TRUE(cache.Match("s", kF32, kF32, layouts[k]).has_value()) << k;
  }
  // The same chunks defined again (their per-step fields changed) keep their number.
  std::vector<PlanChunk> changed = layouts[3];
  for (size_t k = 0; k < changed.size(); ++k) changed[k].fields.lr = 1e-4 * static_cast<double>(k);
  EXPECT_EQ(Defined(cache, changed), 4u);
  // Forgotten (the daemon no longer keeps it): the chunks define it again.
  cache.Forget(4);
  EXPECT_FALSE(cache.Match("s", kF32, kF32, changed).has_value());
  EXPECT_EQ(cache.Define("s", kF32, kF32, changed), 4u) << "the free number";
}

}  // namespace
}  // namespace optstate::client_internal
