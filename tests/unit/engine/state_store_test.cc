// StateStore on its own: idempotent and conflicting registration, the
// host-memory budget, find and delete, and tenants kept apart. Budgets are
// worked out by hand at 12 bytes per element (params, m and v in fp32).
#include "server/engine/state_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "server/backends/cpu/cpu_backend.h"
#include "server/base/thread_pool.h"

namespace optstate {
namespace {

constexpr uint64_t kPage = 16;

// The CPU backend, counting attaches and detaches, refusing attaches while
// `refuse_attach` is set.
class CountingBackend : public CpuBackend {
 public:
  explicit CountingBackend(ThreadPool* pool) : CpuBackend(pool) {}
  absl::Status AttachGroup(Group& group) override {
    if (refuse_attach) return absl::ResourceExhaustedError("no room (injected)");
    ++attached;
    return CpuBackend::AttachGroup(group);
  }
  void DetachGroup(Group& group) override {
    ++detached;
    CpuBackend::DetachGroup(group);
  }
  bool refuse_attach = false;
  std::atomic<int> attached{0};
  std::atomic<int> detached{0};
};

GroupConfig Config(uint64_t num_elements, double lr = 1e-3) {
  GroupConfig config;
  config.num_elements = num_elements;
  config.hyperparameters.lr = lr;
  return config;
}

class StateStoreTest : public ::testing::Test {
 protected:
  // 1200 bytes: 100 elements.
  StateStoreTest() : pool_(1), backend_(&pool_), store_(&backend_, 1200, kPage) {}

  ThreadPool pool_;
  CountingBackend backend_;
  StateStore store_;
};

TEST_F(StateStoreTest, RegisterCreatesOnceAndReturnsTheSameGroupForAnEqualConfig) {
  absl::StatusOr<StateStore::Registration> first = store_.Register({"", "g"}, Config(40));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->created);
  EXPECT_EQ(first->group->num_elements(), 40u);
  EXPECT_EQ(first->group->num_pages(), 3u);  // 16 + 16 + 8.
  EXPECT_EQ(store_.host_bytes(), 480u);

  absl::StatusOr<StateStore::Registration> again = store_.Register({"", "g"}, Config(40));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->group.get(), first->group.get());
  EXPECT_EQ(store_.host_bytes(), 480u);  // Counted once.
  EXPECT_EQ(backend_.attached.load(), 1);
}

TEST_F(StateStoreTest, ADifferentConfigIsAlreadyExistsAndLeavesTheGroup) {
  ASSERT_TRUE(store_.Register({"", "g"}, Config(40)).ok());
  for (const GroupConfig& other : {Config(41), Config(40, 2e-3)}) {
    absl::StatusOr<StateStore::Registration> refused = store_.Register({"", "g"}, other);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
    EXPECT_NE(refused.status().message().find("'g'"), absl::string_view::npos);
  }
  absl::StatusOr<std::shared_ptr<Group>> found = store_.Find({"", "g"});
  ASSERT_TRUE(found.ok());
  EXPECT_TRUE((*found)->config() == Config(40));
  EXPECT_EQ(store_.host_bytes(), 480u);
}

TEST_F(StateStoreTest, BadNameSizeOrHyperparametersAreInvalidArgument) {
  EXPECT_EQ(store_.Register({"", ""}, Config(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.Register({"", "a b"}, Config(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.Register({"", std::string(513, 'x')}, Config(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store_.Register({"", std::string(512, 'x')}, Config(1)).ok());
  EXPECT_EQ(store_.Register({"", "zero"}, Config(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.Register({"", "neg"}, Config(1, -1.0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.host_bytes(), 12u);  // Only the 512-character name.
}

TEST_F(StateStoreTest, TheBudgetTakesExactlyWhatFitsAndRefusesTheRest) {
  ASSERT_TRUE(store_.Register({"", "a"}, Config(60)).ok());  // 720 of 1200 bytes.
  absl::StatusOr<StateStore::Registration> refused = store_.Register({"", "b"}, Config(41));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  // The message says what was needed and what is free.
  EXPECT_NE(refused.status().message().find("492 bytes"), absl::string_view::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("480"), absl::string_view::npos) << refused.status();
  EXPECT_EQ(store_.Find({"", "b"}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_.host_bytes(), 720u);
  // 40 elements fill the budget to the byte.
  ASSERT_TRUE(store_.Register({"", "b"}, Config(40)).ok());
  EXPECT_EQ(store_.host_bytes(), 1200u);
  EXPECT_EQ(store_.Register({"", "c"}, Config(1)).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(StateStoreTest, UnregisterKeepsAGroupAnotherRegistrationWasAnsweredWith) {
  absl::StatusOr<StateStore::Registration> created = store_.Register({"", "g"}, Config(10));
  ASSERT_TRUE(created.ok() && created->created);
  absl::StatusOr<StateStore::Registration> joined = store_.Register({"", "g"}, Config(10));
  ASSERT_TRUE(joined.ok());
  EXPECT_FALSE(joined->created);
  EXPECT_EQ(joined->group, created->group);
  // The creating call failed after the second one got OK: the group stays.
  EXPECT_FALSE(store_.Unregister(created->group));
  EXPECT_TRUE(store_.Find({"", "g"}).ok());
  // Without a second registration it goes.
  absl::StatusOr<StateStore::Registration> alone = store_.Register({"", "h"}, Config(10));
  ASSERT_TRUE(alone.ok() && alone->created);
  EXPECT_TRUE(store_.Unregister(alone->group));
  EXPECT_EQ(store_.Find({"", "h"}).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(StateStoreTest, ASizeBeyondAnyBudgetIsRefusedWithoutOverflow) {
  // 12 * n would wrap around 2^64 (to 0, and to 60 bytes): the message says
  // how much it is, not the wrapped product.
  for (uint64_t n : {uint64_t{1} << 62, (uint64_t{1} << 63) + 5}) {
    absl::Status refused = store_.Register({"", "huge"}, Config(n)).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(refused.message().find("needs more than 2^64 bytes"), absl::string_view::npos)
        << refused;
  }
  EXPECT_EQ(store_.host_bytes(), 0u);
}

TEST_F(StateStoreTest, ABackendRefusalReturnsTheBytesAndRecordsNothing) {
  backend_.refuse_attach = true;
  absl::StatusOr<StateStore::Registration> refused = store_.Register({"", "g"}, Config(50));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store_.host_bytes(), 0u);
  EXPECT_EQ(store_.Find({"", "g"}).status().code(), absl::StatusCode::kNotFound);
  backend_.refuse_attach = false;
  ASSERT_TRUE(store_.Register({"", "g"}, Config(100)).ok());  // The whole budget is free.
}

TEST_F(StateStoreTest, FindNamesAMissingGroup) {
  absl::StatusOr<std::shared_ptr<Group>> missing = store_.Find({"", "nope"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("'nope'"), absl::string_view::npos);
}

TEST_F(StateStoreTest, DeleteRemovesMarksDetachesAndFreesTheBudget) {
  absl::StatusOr<StateStore::Registration> reg = store_.Register({"", "g"}, Config(100));
  ASSERT_TRUE(reg.ok());
  std::shared_ptr<Group> held = reg->group;  // An in-flight reference.
  absl::StatusOr<uint64_t> freed = store_.Delete({"", "g"});
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(*freed, 1200u);
  EXPECT_EQ(store_.host_bytes(), 0u);
  EXPECT_TRUE(held->deleted());
  EXPECT_EQ(backend_.detached.load(), 1);
  EXPECT_EQ(store_.Find({"", "g"}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_.Delete({"", "g"}).status().code(), absl::StatusCode::kNotFound);
  // The name is free again, with another size; the old group stays deleted.
  absl::StatusOr<StateStore::Registration> anew = store_.Register({"", "g"}, Config(10));
  ASSERT_TRUE(anew.ok());
  EXPECT_TRUE(anew->created);
  EXPECT_NE(anew->group.get(), held.get());
  EXPECT_FALSE(anew->group->deleted());
  EXPECT_TRUE(held->deleted());
}

TEST_F(StateStoreTest, TenantsAreApart) {
  ASSERT_TRUE(store_.Register({"a", "w"}, Config(10)).ok());
  // The same name in another tenant is another group, of another config.
  absl::StatusOr<StateStore::Registration> b = store_.Register({"b", "w"}, Config(20, 5e-3));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->created);
  ASSERT_TRUE(store_.Register({"a", "v"}, Config(5)).ok());
  EXPECT_EQ(store_.host_bytes(), (10 + 20 + 5) * 12u);  // One budget for all tenants.

  std::vector<std::shared_ptr<Group>> a_groups = store_.List("a");
  ASSERT_EQ(a_groups.size(), 2u);
  EXPECT_EQ(a_groups[0]->key().name, "v");  // Sorted by name.
  EXPECT_EQ(a_groups[1]->key().name, "w");
  EXPECT_EQ(a_groups[1]->num_elements(), 10u);
  std::vector<std::shared_ptr<Group>> b_groups = store_.List("b");
  ASSERT_EQ(b_groups.size(), 1u);
  EXPECT_EQ(b_groups[0]->num_elements(), 20u);
  EXPECT_TRUE(store_.List("c").empty());
  EXPECT_EQ(store_.Find({"c", "w"}).status().code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE(store_.Delete({"a", "w"}).ok());
  EXPECT_EQ(store_.Find({"a", "w"}).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::shared_ptr<Group>> still = store_.Find({"b", "w"});
  ASSERT_TRUE(still.ok());
  EXPECT_FALSE((*still)->deleted());
  EXPECT_EQ(store_.host_bytes(), (20 + 5) * 12u);
}

// One quota for every tenant.
class FixedQuotas : public TenantQuotas {
 public:
  explicit FixedQuotas(TenantQuota quota) : quota_(quota) {}
  TenantQuota QuotaOf(const std::string&) const override { return quota_; }

 private:
  TenantQuota quota_;
};

TEST_F(StateStoreTest, ACopyStagedToReplaceALiveGroupIsNoNewGroupOfItsTenant) {
  FixedQuotas quotas(TenantQuota{.max_host_bytes = 240, .max_groups = 2});
  store_.SetTenantQuotas(&quotas);
  ASSERT_TRUE(store_.Register({"a", "w"}, Config(10)).ok());
  ASSERT_TRUE(store_.Register({"a", "v"}, Config(10)).ok());  // The quota, exactly.
  // A copy of a live group (an import over it, a rewind) fits; the daemon's budget
  // counts its bytes while it is staged.
  absl::StatusOr<StagedGroup> copy = store_.Stage({"a", "w"}, Config(10));
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_TRUE(copy->replaces_live());
  EXPECT_EQ(store_.host_bytes(), 3 * 120u);
  // One copy of a key at a time: what a tenant stages past its quota is bounded by
  // what it holds.
  EXPECT_EQ(store_.Stage({"a", "w"}, Config(10)).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store_.host_bytes(), 3 * 120u);
  EXPECT_EQ(store_.UsageOf("a").groups, 2u);
  EXPECT_EQ(store_.UsageOf("a").host_bytes, 240u);
  // A new group does not.
  EXPECT_EQ(store_.Stage({"a", "x"}, Config(10)).status().code(),
            absl::StatusCode::kResourceExhausted);
  // The live group went meanwhile: publishing the copy makes a new group, held to the
  // quota then.
  ASSERT_TRUE(store_.Delete({"a", "w"}).ok());
  ASSERT_TRUE(store_.Register({"a", "y"}, Config(10)).ok());
  EXPECT_EQ(store_.Publish(*copy).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store_.Delete({"a", "y"}).ok());
  ASSERT_TRUE(store_.Publish(*copy).ok());
  EXPECT_EQ(store_.UsageOf("a").groups, 2u);
  EXPECT_EQ(store_.UsageOf("a").host_bytes, 240u);
  EXPECT_EQ(store_.host_bytes(), 240u);
  // A copy given up gives the daemon's bytes back and leaves the tenant's as they were.
  {
    absl::StatusOr<StagedGroup> dropped = store_.Stage({"a", "v"}, Config(10));
    ASSERT_TRUE(dropped.ok()) << dropped.status();
  }
  EXPECT_EQ(store_.host_bytes(), 240u);
  EXPECT_EQ(store_.UsageOf("a").groups, 2u);
  EXPECT_TRUE(store_.Stage({"a", "v"}, Config(10)).ok());  // Its claim on the key ended.
  store_.SetTenantQuotas(nullptr);
}

}  // namespace
}  // namespace optstate
