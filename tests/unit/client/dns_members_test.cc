// The members behind one DNS name (ClientOptions::members_from_dns), on
// names every machine resolves: a numeric address, localhost.
#include "client/placement/dns_members.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace optstate::client_internal {
namespace {

using ::testing::HasSubstr;

TEST(DnsMembersTest, ANumericAddressIsOneMemberNamedByReverseDnsOrItself) {
  absl::StatusOr<std::vector<ResolvedMember>> members = ResolveMembers("127.0.0.1:50051");
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 1u);
  EXPECT_EQ((*members)[0].target, "127.0.0.1:50051");
  // 127.0.0.1 has a name in every /etc/hosts (localhost, or the host's own).
  EXPECT_THAT((*members)[0].identity, ::testing::EndsWith(":50051"));
}

TEST(DnsMembersTest, LocalhostGivesEachOfItsAddressesOnceSortedWithThePort) {
  absl::StatusOr<std::vector<ResolvedMember>> members = ResolveMembers("dns:///localhost:7");
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_GE(members->size(), 1u);
  for (size_t i = 0; i < members->size(); ++i) {
    EXPECT_THAT((*members)[i].target, ::testing::EndsWith(":7"));
    if (i > 0) {
      EXPECT_LT((*members)[i - 1].target, (*members)[i].target);
    }
  }
}

TEST(DnsMembersTest, WhatIsNotANameAndPortIsRefused) {
  EXPECT_THAT(ResolveMembers("localhost").status().message(), HasSubstr("'name:port'"));
  EXPECT_THAT(ResolveMembers("unix:/tmp/x").status().message(), HasSubstr("'name:port'"));
  EXPECT_EQ(ResolveMembers("no-such-host.invalid:1").status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace optstate::client_internal
