// The lease metadata's syntax: what a call may say, and each refusal's words.
#include "server/rpc/call_lease.h"

#include "gtest/gtest.h"

namespace optstate {
namespace {

TEST(ParseLeaseClaimTest, NoMetadataIsAClaimOfNoHolder) {
  absl::StatusOr<LeaseClaim> claim = ParseLeaseClaim(std::nullopt, std::nullopt);
  ASSERT_TRUE(claim.ok());
  EXPECT_TRUE(claim->holder.id.empty());
  EXPECT_TRUE(claim->takeovers.empty());
}

TEST(ParseLeaseClaimTest, EveryFieldInAnyOrder) {
  absl::StatusOr<LeaseClaim> claim =
      ParseLeaseClaim("pid=123 job=llama/run3/ holder=abc123  host=node-7", "dead=old-id");
  ASSERT_TRUE(claim.ok()) << claim.status();
  EXPECT_EQ(claim->holder.id, "abc123");
  EXPECT_EQ(claim->holder.job, "llama/run3/");
  EXPECT_EQ(claim->holder.host, "node-7");
  EXPECT_EQ(claim->holder.pid, 123u);
  ASSERT_EQ(claim->takeovers.size(), 1u);
  EXPECT_EQ(claim->takeovers[0].kind, TakeoverKind::kDead);
  EXPECT_EQ(claim->takeovers[0].of, "old-id");
  claim = ParseLeaseClaim("holder=x", "expired=y");
  ASSERT_TRUE(claim.ok());
  ASSERT_EQ(claim->takeovers.size(), 1u);
  EXPECT_EQ(claim->takeovers[0].kind, TakeoverKind::kExpired);
  EXPECT_EQ(claim->holder.pid, 0u);
}

TEST(ParseLeaseClaimTest, MalformedMetadataIsInvalidArgumentSayingWhat) {
  const std::pair<const char*, const char*> cases[] = {
      {"job=j", "names no holder"},
      {"holder=", "empty or over 128"},
      {"holder=a holder=b", "names holder twice"},
      {"holder=a color=red", "other than holder, job, host and pid"},
      {"holder=a pid=12x", "pid that is not a decimal"},
      {"holder=a pid=-1", "pid that is not a decimal"},
      {"holder=a pid=", "pid that is not a decimal"},
      {"holder", "without '='"},
  };
  for (const auto& [value, words] : cases) {
    absl::StatusOr<LeaseClaim> claim = ParseLeaseClaim(value, std::nullopt);
    ASSERT_FALSE(claim.ok()) << value;
    EXPECT_EQ(claim.status().code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_NE(claim.status().message().find(words), absl::string_view::npos)
        << value << ": " << claim.status().message();
  }
  EXPECT_FALSE(ParseLeaseClaim(std::string("holder=") + std::string(129, 'a'), std::nullopt).ok());
  EXPECT_TRUE(ParseLeaseClaim(std::string("holder=") + std::string(128, 'a'), std::nullopt).ok());
  for (const char* takeover : {"", "expired", "expired=", "dead", "now=a", "expired=a b"}) {
    absl::StatusOr<LeaseClaim> claim = ParseLeaseClaim("holder=a", takeover);
    ASSERT_FALSE(claim.ok()) << takeover;
    EXPECT_EQ(claim.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(claim.status().message().find("'expired=ID'"), absl::string_view::npos);
  }
}

// A job whose groups two gone trainers hold is taken over in one call: each
// holder named on its own terms.
TEST(ParseLeaseClaimTest, ATakeoverMayNameSeveralHoldersSeparatedBySpaces) {
  absl::StatusOr<LeaseClaim> claim = ParseLeaseClaim("holder=x", "expired=a  dead=b");
  ASSERT_TRUE(claim.ok()) << claim.status();
  ASSERT_EQ(claim->takeovers.size(), 2u);
  EXPECT_EQ(claim->takeovers[0].kind, TakeoverKind::kExpired);
  EXPECT_EQ(claim->takeovers[0].of, "a");
  EXPECT_EQ(claim->takeovers[1].kind, TakeoverKind::kDead);
  EXPECT_EQ(claim->takeovers[1].of, "b");
  std::string sixteen, seventeen;
  for (int i = 0; i < 16; ++i) sixteen += "dead=h" + std::to_string(i) + " ";
  seventeen = sixteen + "dead=h16";
  EXPECT_TRUE(ParseLeaseClaim("holder=x", sixteen).ok());
  absl::StatusOr<LeaseClaim> many = ParseLeaseClaim("holder=x", seventeen);
  EXPECT_EQ(many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(many.status().message().find("up to 16 of them"), absl::string_view::npos)
      << many.status().message();
}

// A takeover without a holder of its own stepped a group another holder
// leased, and left that holder's lease in place: two writers on one group.
TEST(ParseLeaseClaimTest, ATakeoverNeedsAHolderToMoveTheLeaseTo) {
  for (const char* takeover : {"dead=h1", "expired=h1"}) {
    absl::StatusOr<LeaseClaim> claim = ParseLeaseClaim(std::nullopt, takeover);
    ASSERT_FALSE(claim.ok()) << takeover;
    EXPECT_EQ(claim.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(claim.status().message().find("needs 'optstate-lease' naming the caller"),
              absl::string_view::npos)
        << claim.status().message();
  }
}

}  // namespace
}  // namespace optstate
