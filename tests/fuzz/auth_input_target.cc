// Each branch checks what its unit's contract says against an independent
// reading of the input (the splitting and comparisons here are the test's own).
#include "tests/fuzz/auth_input_target.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/auth/authenticator.h"
#include "server/auth/tokens_file.h"
#include "tests/testing/security_files.h"

namespace optstate::fuzz {

AuthInputTarget::AuthInputTarget() {
  dir_ = testing::MakeTempDir("auth-fuzz");
  const std::string path = dir_ + "/tokens";
  testing::WriteFile(path, absl::StrCat("tenant ", testing::DigestHex(kToken), " max_groups=3\n"));
  AuthOptions options;
  options.tokens_file = path;
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create(options);
  if (!auth.ok()) {
    std::fprintf(stderr, "auth fuzz: %s\n", auth.status().ToString().c_str());
    std::abort();
  }
  authenticator_ = std::move(*auth);
  unlink(path.c_str());
  rmdir(dir_.c_str());
}

AuthInputTarget::~AuthInputTarget() = default;

namespace {

std::string CheckTokensFile(const std::string& text) {
  absl::StatusOr<TokensTable> table = ParseTokensFile(text);
  const std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  if (!table.ok()) {
    const std::string message(table.status().message());
    size_t line = 0;
    if (table.status().code() != absl::StatusCode::kInvalidArgument ||
        !absl::StartsWith(message, "line ") ||
        !absl::SimpleAtoi(message.substr(5, message.find(':') - 5), &line) || line == 0 ||
        line > lines.size()) {
      return "a refusal must be INVALID_ARGUMENT naming an existing line: " + message;
    }
    for (absl::string_view field : absl::StrSplit(text, absl::ByAnyChar(" \t\r\n"))) {
      if (field.size() >= 24 && absl::StrContains(message, field)) {
        return "a refusal quotes a field of the file: " + message;
      }
    }
    return "";
  }
  for (size_t i = 0; i < table->entries.size(); ++i) {
    const TokensTable::Entry& entry = table->entries[i];
    if (!IsValidTenantName(entry.tenant) || !table->tenants.contains(entry.tenant)) {
      return "an entry's tenant is invalid or not in the table";
    }
    for (size_t j = 0; j < i; ++j) {
      if (SameDigest(table->entries[j].digest, entry.digest)) return "a digest twice";
    }
  }
  return "";
}

std::string CheckAuthorization(const Authenticator& auth, const std::string& value) {
  const std::optional<absl::string_view> token = BearerToken(value);
  if (token && (token->empty() || !absl::EndsWith(value, *token))) {
    return "BearerToken's token is not a non-empty suffix of the value";
  }
  // The test's own reading: "bearer" in any case, one space or more, the rest.
  bool expect = false;
  if (value.size() > 7 && absl::EqualsIgnoreCase(value.substr(0, 6), "bearer") &&
      value[6] == ' ') {
    size_t at = 6;
    while (at < value.size() && value[at] == ' ') ++at;
    expect = value.substr(at) == AuthInputTarget::kToken;
  }
  absl::StatusOr<Caller> caller = auth.Authenticate(absl::string_view(value), {});
  if (caller.ok() != expect) return "the token was " + std::string(expect ? "refused" : "taken");
  if (caller.ok() && caller->tenant != "tenant") return "the wrong tenant";
  if (!caller.ok()) {
    if (caller.status().code() != absl::StatusCode::kUnauthenticated) return "not UNAUTHENTICATED";
    // The refusal of a token says the same whatever the token: it cannot
    // hold it (a token that happens to be a piece of the message is fine).
    if (token) {
      absl::StatusOr<Caller> other =
          auth.Authenticate(absl::string_view("Bearer another-token-entirely"), {});
      if (other.ok() || other.status().message() != caller.status().message()) {
        return "the refusal depends on the token sent: " + std::string(caller.status().message());
      }
    }
  }
  return "";
}

std::string CheckSpiffe(const std::string& uri) {
  const std::optional<std::string> tenant = TenantOfSpiffeId(uri, "fuzz.example");
  if (tenant && (uri != "spiffe://fuzz.example/tenant/" + *tenant || !IsValidTenantName(*tenant))) {
    return "a tenant from a URI that is not exactly spiffe://fuzz.example/tenant/NAME";
  }
  return "";
}

}  // namespace

std::string AuthInputTarget::Run(const uint8_t* data, size_t size) {
  if (size == 0) return "";
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      return CheckTokensFile(rest);
    case 1:
      return CheckAuthorization(*authenticator_, rest);
    default:
      return CheckSpiffe(rest);
  }
}

std::vector<std::string> AuthInputSeeds() {
  const std::string kToken = AuthInputTarget::kToken;
  const std::string digest = testing::DigestHex(kToken);
  return {
      std::string(1, '\0') + "# c\n\na " + digest + " max_host_bytes=10 max_groups=2 admin\n",
      std::string(1, '\0') + "a " + digest + "\nb " + digest + "\n",
      std::string(1, '\0') + "a\t" + digest + " max_groups=x\n",
      std::string(1, '\0') + "a " + digest.substr(1) + "Z\n",
      std::string(1, '\0') + "a " + digest + " max_groups=1\na " + digest.substr(0, 63) +
          "0 max_groups=2\n",
      std::string(1, '\1') + "Bearer " + kToken,
      std::string(1, '\1') + "bEaReR   " + kToken,
      std::string(1, '\1') + "Basic " + kToken,
      std::string(1, '\1') + "Bearer " + kToken + "x",
      std::string(1, '\2') + "spiffe://fuzz.example/tenant/team-a",
      std::string(1, '\2') + "spiffe://fuzz.example/tenant/team-a/x",
      std::string(1, '\2') + "spiffe://fuzz.example.evil/tenant/a",
  };
}

}  // namespace optstate::fuzz
