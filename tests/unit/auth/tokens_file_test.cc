// The tokens file's format, token digests against openssl's, bearer values
// and SPIFFE IDs: each rule of docs/security.md, one test each.
#include "server/auth/tokens_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/auth/authenticator.h"

namespace optstate {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Hex(const TokenDigest& d) {
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(d.data()), 32));
}

// The digest as the openssl command prints it (the reference).
std::string OpensslDigest(const std::string& token) {
  FILE* pipe =
      popen(absl::StrCat("printf %s '", token, "' | openssl dgst -sha256 -r").c_str(), "r");
  char out[128] = {};
  const size_t n = pipe != nullptr ? fread(out, 1, sizeof(out) - 1, pipe) : 0;
  if (pipe != nullptr) pclose(pipe);
  return std::string(out, std::min<size_t>(n, 64));
}

TEST(TokenDigestTest, IsOpensslsSha256OfTheTokensBytes) {
  for (const std::string& token :
       std::vector<std::string>{"", "a", "s3cr3t-token_with.punctuation", std::string(300, 'x')}) {
    EXPECT_EQ(Hex(DigestOfToken(token)), OpensslDigest(token)) << token;
  }
}

TEST(TokenDigestTest, HexMustBe64LowercaseDigits) {
  const std::string hex = Hex(DigestOfToken("t"));
  ASSERT_TRUE(ParseDigestHex(hex).has_value());
  EXPECT_TRUE(SameDigest(*ParseDigestHex(hex), DigestOfToken("t")));
  std::string upper = hex;
  upper[0] = 'A';
  upper[1] = 'B';
  EXPECT_FALSE(ParseDigestHex(upper).has_value());
  EXPECT_FALSE(ParseDigestHex(hex.substr(1)).has_value());
  EXPECT_FALSE(ParseDigestHex(hex + "0").has_value());
}

TEST(TokensFileTest, CommentsBlankLinesRotationQuotasAndAdmin) {
  const std::string a = Hex(DigestOfToken("a")), b = Hex(DigestOfToken("b")),
                    c = Hex(DigestOfToken("c"));
  absl::StatusOr<TokensTable> table = ParseTokensFile(
      absl::StrCat("# header\n\n   \nteam-a ", a, " max_host_bytes=1200 # inline\nteam-a\t", b,
                   " max_groups=7\r\nops ", c, " admin\n"));
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->entries.size(), 3u);
  EXPECT_EQ(table->entries[1].tenant, "team-a");
  const TenantPolicy& team = table->tenants.at("team-a");
  EXPECT_EQ(team.max_host_bytes, 1200u);
  EXPECT_EQ(team.max_groups, 7u);
  EXPECT_FALSE(team.admin);
  EXPECT_TRUE(table->tenants.at("ops").admin);
  EXPECT_FALSE(table->tenants.at("ops").max_groups.has_value());
}

TEST(TokensFileTest, EachMalformedLineIsRefusedByNumberWithoutQuotingIt) {
  const std::string a = Hex(DigestOfToken("a")), b = Hex(DigestOfToken("b"));
  const std::string good = "ok " + a + "\n";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"lonely-tenant-field-xyz", "one field"},
      {"team this-is-the-raw-token-pasted", "SHA-256"},
      {"team " + b + " max_groups=-1", "decimal"},
      {"team " + b + " max_host_bytes=12kB", "decimal"},
      {"team " + b + " colour=blue-and-quite-long", "field 3"},
      {"ok " + a, "earlier line"},
      {"t\x01 " + b, "tenant"},
      {"team " + b + " max_groups=1 max_groups=2", "max_groups is given twice on this line"},
      {"team " + b + " max_groups=1 max_groups=1 max_groups=3", "given twice on this line"},
  };
  for (const auto& [line, why] : bad) {
    absl::StatusOr<TokensTable> table = ParseTokensFile(good + "\n" + line + "\n");
    ASSERT_FALSE(table.ok()) << line;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(table.status().message(), HasSubstr("line 3: ")) << line;
    EXPECT_THAT(table.status().message(), HasSubstr(why)) << line;
    EXPECT_THAT(table.status().message(), Not(HasSubstr("this-is-the-raw-token-pasted")));
    EXPECT_THAT(table.status().message(), Not(HasSubstr(b)));
  }
  absl::StatusOr<TokensTable> conflict =
      ParseTokensFile(absl::StrCat("t ", a, " max_groups=1\nt ", b, " max_groups=2\n"));
  ASSERT_FALSE(conflict.ok());
  EXPECT_THAT(conflict.status().message(), HasSubstr("line 2: max_groups differs"));
}

TEST(BearerTokenTest, TakesTheSchemeInAnyCaseAndOneOrMoreSpaces) {
  EXPECT_EQ(BearerToken("Bearer abc"), "abc");
  EXPECT_EQ(BearerToken("bearer   abc"), "abc");
  EXPECT_FALSE(BearerToken("Bearer").has_value());
  EXPECT_FALSE(BearerToken("Bearer   ").has_value());
  EXPECT_FALSE(BearerToken("Basic abc").has_value());
  EXPECT_FALSE(BearerToken("Bearerabc").has_value());
}

TEST(SpiffeIdTest, OnlyTheExactTenantPathOfTheTrustDomain) {
  EXPECT_EQ(TenantOfSpiffeId("spiffe://example.org/tenant/team-a", "example.org"), "team-a");
  EXPECT_FALSE(TenantOfSpiffeId("spiffe://example.org/tenant/team-a/x", "example.org"));
  EXPECT_FALSE(TenantOfSpiffeId("spiffe://example.org.evil/tenant/a", "example.org"));
  EXPECT_FALSE(TenantOfSpiffeId("spiffe://example.org/tenant/", "example.org"));
  EXPECT_FALSE(TenantOfSpiffeId("xspiffe://example.org/tenant/a", "example.org"));
  EXPECT_FALSE(TenantOfSpiffeId("spiffe://example.org/tenants/a", "example.org"));
  EXPECT_FALSE(TenantOfSpiffeId("spiffe://example.org/tenant/a", ""));
  // A SPIFFE path segment's characters only: no query, no percent-encoding.
  EXPECT_FALSE(TenantOfSpiffeId("spiffe://example.org/tenant/team-a?x=1", "example.org"));
  EXPECT_FALSE(TenantOfSpiffeId("spiffe://example.org/tenant/team%2Da", "example.org"));
  EXPECT_FALSE(TenantOfSpiffeId("spiffe://example.org/tenant/..", "example.org"));
  EXPECT_EQ(TenantOfSpiffeId("spiffe://example.org/tenant/a.b_c-9", "example.org"), "a.b_c-9");
}

// An X.509-SVID carries exactly one URI SAN: a certificate with two named
// the tenant of whichever came first.
TEST(SpiffeIdTest, ACertificateWithSeveralUriSansNamesNoTenant) {
  AuthOptions options;
  options.spiffe_trust_domain = "example.org";
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create(options);
  ASSERT_TRUE(auth.ok()) << auth.status();
  absl::StatusOr<Caller> one =
      (*auth)->Authenticate(std::nullopt, {"spiffe://example.org/tenant/a"});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->tenant, "a");
  for (const std::vector<std::string>& uris :
       {std::vector<std::string>{"spiffe://example.org/tenant/a", "spiffe://example.org/tenant/b"},
        std::vector<std::string>{"https://example.org/x", "spiffe://example.org/tenant/a"}}) {
    absl::StatusOr<Caller> two = (*auth)->Authenticate(std::nullopt, uris);
    EXPECT_EQ(two.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(two.status().message(), ::testing::HasSubstr("carries 2 URI SANs"));
  }
}

// 0 on a tenant's line is no limit, as for the flags: it exempts the tenant
// from them (it was a quota of nothing, with advice to delete a group).
TEST(TenantQuotaTest, ALinesZeroIsNoLimitAndItsNumberOverridesTheFlags) {
  char path[] = "/tmp/optstate-tokens-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string text =
      absl::StrCat("free ", Hex(DigestOfToken("f")), " max_groups=0 max_host_bytes=0\nsmall ",
                   Hex(DigestOfToken("s")), " max_groups=3\nplain ", Hex(DigestOfToken("p")), "\n");
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  AuthOptions options;
  options.tokens_file = path;
  options.tenant_max_groups = 10;
  options.tenant_max_host_bytes = 1000;
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create(options);
  std::remove(path);
  ASSERT_TRUE(auth.ok()) << auth.status();
  const TenantQuota none;
  EXPECT_EQ((*auth)->QuotaOf("free").max_groups, none.max_groups);
  EXPECT_EQ((*auth)->QuotaOf("free").max_host_bytes, none.max_host_bytes);
  EXPECT_EQ((*auth)->QuotaOf("small").max_groups, 3u);
  EXPECT_EQ((*auth)->QuotaOf("small").max_host_bytes, 1000u);
  EXPECT_EQ((*auth)->QuotaOf("plain").max_groups, 10u);
}

}  // namespace
}  // namespace optstate
