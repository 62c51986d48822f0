// GroupLease: who may touch a held group, when a lease lapses, and what a
// takeover needs; each refusal changes nothing.
#include "server/state/group_lease.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace optstate {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'000'000);
const absl::Duration kTerm = absl::Seconds(60);

LeaseClaim Claim(const std::string& id, TakeoverKind takeover = TakeoverKind::kNone,
                 const std::string& of = "") {
  LeaseClaim claim;
  claim.holder.id = id;
  claim.holder.job = id.empty() ? "" : "job-" + id;
  claim.holder.host = "host-a";
  claim.holder.pid = 42;
  if (takeover != TakeoverKind::kNone) claim.takeovers.push_back({takeover, of});
  return claim;
}

TEST(GroupLeaseTest, FirstHolderTakesItAndRenewsIt) {
  GroupLease lease;
  EXPECT_FALSE(lease.View(kStart).has_value());
  ASSERT_TRUE(lease.Admit(Claim("a"), "g", kStart, kTerm).ok());
  ASSERT_TRUE(lease.Admit(Claim("a"), "g", kStart + absl::Seconds(59), kTerm).ok());
  const std::optional<LeaseView> view = lease.View(kStart + absl::Seconds(100));
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->holder.id, "a");
  EXPECT_EQ(view->holder.job, "job-a");
  EXPECT_EQ(view->last_call, kStart + absl::Seconds(59));
  EXPECT_EQ(view->expires, kStart + absl::Seconds(119));
  EXPECT_FALSE(view->expired);
}

TEST(GroupLeaseTest, AnotherHolderIsRefusedWithTheHolderNamedAndNothingChanges) {
  GroupLease lease;
  ASSERT_TRUE(lease.Admit(Claim("a"), "g", kStart, kTerm).ok());
  const absl::Status refused = lease.Admit(Claim("b"), "g", kStart + absl::Seconds(10), kTerm);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  for (const char* part : {"group 'g'", "job 'job-a'", "holder a", "host host-a", "pid 42",
                           "last call was 10.0 s ago", "expires in 50.0 s", "expired=a",
                           "dead=a"}) {
    EXPECT_NE(refused.message().find(part), absl::string_view::npos) << part << ": "
                                                                     << refused.message();
  }
  EXPECT_EQ(lease.View(kStart)->holder.id, "a");
  EXPECT_EQ(lease.View(kStart)->last_call, kStart);
  // A call naming no holder is refused while the lease is live, too.
  EXPECT_EQ(lease.Check(Claim(""), "g", kStart + absl::Seconds(59)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(GroupLeaseTest, AnExpiredLeaseNeedsATakeoverNamingItsHolder) {
  GroupLease lease;
  ASSERT_TRUE(lease.Admit(Claim("a"), "g", kStart, kTerm).ok());
  const absl::Time later = kStart + kTerm + absl::Seconds(1);
  EXPECT_TRUE(lease.View(later)->expired);
  const absl::Status refused = lease.Admit(Claim("b"), "g", later, kTerm);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("expired 1.0 s ago"), absl::string_view::npos)
      << refused.message();
  // Naming another holder breaks nothing.
  EXPECT_FALSE(lease.Admit(Claim("b", TakeoverKind::kExpired, "c"), "g", later, kTerm).ok());
  // No holder: an operator's call passes, taking nothing.
  EXPECT_TRUE(lease.Admit(Claim(""), "g", later, kTerm).ok());
  EXPECT_EQ(lease.View(later)->holder.id, "a");
  ASSERT_TRUE(lease.Admit(Claim("b", TakeoverKind::kExpired, "a"), "g", later, kTerm).ok());
  EXPECT_EQ(lease.View(later)->holder.id, "b");
  EXPECT_FALSE(lease.View(later)->expired);
  // The old holder is refused now.
  EXPECT_EQ(lease.Check(Claim("a"), "g", later).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GroupLeaseTest, ALiveLeaseBreaksOnlyForADeadHolderNamedExactly) {
  GroupLease lease;
  ASSERT_TRUE(lease.Admit(Claim("a"), "g", kStart, kTerm).ok());
  const absl::Time soon = kStart + absl::Seconds(1);
  EXPECT_FALSE(lease.Admit(Claim("b", TakeoverKind::kExpired, "a"), "g", soon, kTerm).ok());
  EXPECT_FALSE(lease.Admit(Claim("b", TakeoverKind::kDead, "ab"), "g", soon, kTerm).ok());
  EXPECT_EQ(lease.View(soon)->holder.id, "a");
  ASSERT_TRUE(lease.Admit(Claim("b", TakeoverKind::kDead, "a"), "g", soon, kTerm).ok());
  EXPECT_EQ(lease.View(soon)->holder.id, "b");
}

TEST(GroupLeaseTest, EachHolderAClaimNamesIsTakenOverOnItsOwnTerms) {
  GroupLease by_a, by_b;
  ASSERT_TRUE(by_a.Admit(Claim("a"), "g0", kStart, kTerm).ok());
  ASSERT_TRUE(by_b.Admit(Claim("b"), "g1", kStart + kTerm, kTerm).ok());
  const absl::Time later = kStart + kTerm + absl::Seconds(1);  // a's lease expired, b's not.
  LeaseClaim claim = Claim("c", TakeoverKind::kExpired, "a");
  claim.takeovers.push_back({TakeoverKind::kExpired, "b"});
  EXPECT_FALSE(by_b.Admit(claim, "g1", later, kTerm).ok());  // b's is live.
  EXPECT_EQ(by_b.View(later)->holder.id, "b");
  claim.takeovers[1].kind = TakeoverKind::kDead;
  ASSERT_TRUE(by_a.Admit(claim, "g0", later, kTerm).ok());
  ASSERT_TRUE(by_b.Admit(claim, "g1", later, kTerm).ok());
  EXPECT_EQ(by_a.View(later)->holder.id, "c");
  EXPECT_EQ(by_b.View(later)->holder.id, "c");
}

TEST(GroupLeaseTest, CheckTakesNothing) {
  GroupLease lease;
  EXPECT_TRUE(lease.Check(Claim("a"), "g", kStart).ok());
  EXPECT_FALSE(lease.View(kStart).has_value());
}

}  // namespace
}  // namespace optstate
