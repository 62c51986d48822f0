// Placement by weighted rendezvous hashing: the hash pinned to values an
// independent implementation of its definition gave (Python, from the header's
// wording), the spread over members, what moves when a member comes or goes,
// weights, and the refusals of bad member lists.
#include "client/placement/rendezvous.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace optstate::client_internal {
namespace {

using ::testing::HasSubstr;

std::vector<PlacementMember> Members(int n) {
  std::vector<PlacementMember> members;
  for (int i = 0; i < n; ++i) members.push_back({absl::StrCat("optstated-", i, ".optstated"), 1.0});
  return members;
}

std::vector<std::string> GroupNames(int n) {
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.push_back(absl::StrCat("model.layers.", i / 7, ".w", i % 7));
  return names;
}

// Owner identity of every group.
std::map<std::string, std::string> Place(const std::vector<PlacementMember>& members,
                                         const std::vector<std::string>& groups) {
  std::map<std::string, std::string> owners;
  for (const std::string& g : groups) owners[g] = members[OwnerOf(members, "job", g)].identity;
  return owners;
}

TEST(RendezvousTest, TheHashIsPinnedToItsDefinition) {
  struct Case {
    const char *tenant, *group, *member;
    uint64_t hash;
  };
  const Case cases[] = {
      {"", "", "", 0xc03225d3e04d48a7ULL},
      {"", "w", "10.0.0.1:50051", 0x42ba320382d2cc38ULL},
      {"team-a", "model.layers.0.weight", "optstated-0.optstated", 0x0d224c60f0c0c7cdULL},
      // Fields are length-prefixed: moving a byte across a boundary changes the hash.
      {"a", "bc", "", 0xce2a78993a24bb12ULL},
      {"ab", "c", "", 0xb451a35ca892e44aULL},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(RendezvousHash(c.tenant, c.group, c.member), c.hash)
        << c.tenant << "/" << c.group << "@" << c.member;
  }
  const std::vector<PlacementMember> three = {{"optstated-0", 1}, {"optstated-1", 1},
                                              {"optstated-2", 1}};
  EXPECT_EQ(OwnerOf(three, "", "w"), 0u);
  EXPECT_EQ(OwnerOf(three, "", "b"), 2u);
  EXPECT_EQ(OwnerOf(three, "", "emb"), 0u);
}

TEST(RendezvousTest, GroupsSpreadEvenlyOverMembers) {
  const std::vector<PlacementMember> members = Members(3);
  std::map<std::string, int> count;
  for (const auto& [group, owner] : Place(members, GroupNames(3000))) ++count[owner];
  ASSERT_EQ(count.size(), 3u);
  for (const auto& [owner, n] : count) {
    EXPECT_GT(n, 900) << owner;
    EXPECT_LT(n, 1100) << owner;
  }
}

TEST(RendezvousTest, AnAddedMemberTakesAboutItsShareAndNothingElseMoves) {
  const std::vector<std::string> groups = GroupNames(3000);
  std::vector<PlacementMember> members = Members(3);
  const std::map<std::string, std::string> before = Place(members, groups);
  members.push_back({"optstated-3.optstated", 1.0});
  const std::map<std::string, std::string> after = Place(members, groups);
  int moved = 0;
  for (const std::string& g : groups) {
    if (before.at(g) == after.at(g)) continue;
    ++moved;
    EXPECT_EQ(after.at(g), "optstated-3.optstated") << g << " moved between old members";
  }
  EXPECT_GT(moved, 3000 / 4 - 150);
  EXPECT_LT(moved, 3000 / 4 + 150);
}

TEST(RendezvousTest, ARemovedMembersGroupsAloneMove) {
  const std::vector<std::string> groups = GroupNames(3000);
  std::vector<PlacementMember> members = Members(4);
  const std::map<std::string, std::string> before = Place(members, groups);
  const std::string removed = members[1].identity;
  members.erase(members.begin() + 1);
  const std::map<std::string, std::string> after = Place(members, groups);
  for (const std::string& g : groups) {
    if (before.at(g) == removed) {
      EXPECT_NE(after.at(g), removed);
    } else {
      EXPECT_EQ(after.at(g), before.at(g)) << g;
    }
  }
}

TEST(RendezvousTest, TheOrderOfTheMemberListDoesNotMatter) {
  const std::vector<std::string> groups = GroupNames(500);
  std::vector<PlacementMember> members = Members(5);
  const std::map<std::string, std::string> before = Place(members, groups);
  std::reverse(members.begin(), members.end());
  EXPECT_EQ(Place(members, groups), before);
}

TEST(RendezvousTest, AMemberOfTwiceTheWeightGetsTwiceTheShare) {
  std::vector<PlacementMember> members = Members(3);
  members[2].weight = 2.0;
  std::map<std::string, int> count;
  for (const auto& [group, owner] : Place(members, GroupNames(4000))) ++count[owner];
  EXPECT_GT(count[members[2].identity], 2000 - 150);
  EXPECT_LT(count[members[2].identity], 2000 + 150);
  EXPECT_GT(count[members[0].identity], 1000 - 120);
  EXPECT_LT(count[members[0].identity], 1000 + 120);
}

TEST(RendezvousTest, TenantsArePlacedApart) {
  const std::vector<PlacementMember> members = Members(3);
  int different = 0;
  for (const std::string& g : GroupNames(300)) {
    different += OwnerOf(members, "team-a", g) != OwnerOf(members, "team-b", g);
  }
  EXPECT_GT(different, 150) << "a group's name alone must not decide its owner";
}

TEST(RendezvousTest, BadMemberListsAreRefusedNamingTheFault) {
  EXPECT_THAT(CheckMembers({}).message(), HasSubstr("no daemons"));
  EXPECT_THAT(CheckMembers({{"", 1}}).message(), HasSubstr("empty identity"));
  EXPECT_THAT(CheckMembers({{"a:1", 1}, {"a:1", 1}}).message(), HasSubstr("'a:1' is named twice"));
  EXPECT_THAT(CheckMembers({{"a:1", 0}}).message(), HasSubstr("finite and > 0"));
  EXPECT_THAT(CheckMembers({{"a:1", -1}}).message(), HasSubstr("finite and > 0"));
  EXPECT_THAT(CheckMembers({{"a:1", std::nan("")}}).message(), HasSubstr("finite and > 0"));
  EXPECT_TRUE(CheckMembers({{"a:1", 1}, {"b:1", 0.5}}).ok());
}

}  // namespace
}  // namespace optstate::client_internal
