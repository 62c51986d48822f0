// Line by line: strip the comment, split on blanks, check each field.
#include "server/auth/tokens_file.h"

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace optstate {
namespace {

absl::Status LineError(size_t line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", what));
}

// Sets `*slot` to the N of NAME=N, checking it agrees with an earlier line;
// `on_this_line` holds the options this line gave before.
absl::Status SetQuota(size_t line, absl::string_view name, absl::string_view value,
                      std::optional<uint64_t>* slot, std::set<absl::string_view>* on_this_line) {
  uint64_t n;
  if (value.empty() || value[0] == '+' || value[0] == '-' || !absl::SimpleAtoi(value, &n)) {
    return LineError(line, absl::StrCat(name, "= must be followed by a decimal number of ",
                                        name == "max_groups" ? "groups" : "bytes"));
  }
  if (!on_this_line->insert(name).second && slot->has_value() && **slot != n) {
    return LineError(line, absl::StrCat(name,
                                        " is given twice on this line, with two values; "
                                        "give it once"));
  }
  if (slot->has_value() && **slot != n) {
    return LineError(line, absl::StrCat(name, " differs from an earlier line of the same tenant; "
                                              "give it once, or the same on every line"));
  }
  *slot = n;
  return absl::OkStatus();
}

}  // namespace

bool IsValidTenantName(absl::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    if (c <= ' ' || c > '~' || c == '#') return false;
  }
  return true;
}

absl::StatusOr<TokensTable> ParseTokensFile(absl::string_view text) {
  TokensTable table;
  size_t number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    if (fields.size() < 2) {
      return LineError(number, "expected TENANT SHA256HEX [max_host_bytes=N] [max_groups=N] "
                               "[admin]; found one field");
    }
    if (!IsValidTenantName(fields[0])) {
      return LineError(number, "the tenant (first field) must be 1 to 128 printable ASCII "
                               "characters without spaces or '#'");
    }
    std::optional<TokenDigest> digest = ParseDigestHex(fields[1]);
    if (!digest) {
      return LineError(number,
                       "the second field must be the token's SHA-256 as 64 lowercase hex digits "
                       "(printf %s \"$TOKEN\" | sha256sum), not the token itself");
    }
    for (const TokensTable::Entry& earlier : table.entries) {
      if (SameDigest(earlier.digest, *digest)) {
        return LineError(number, "this digest is on an earlier line too; a token names one "
                                 "tenant, once");
      }
    }
    TenantPolicy& policy = table.tenants[std::string(fields[0])];
    std::set<absl::string_view> on_this_line;
    for (size_t i = 2; i < fields.size(); ++i) {
      const absl::string_view field = fields[i];
      absl::Status status;
      if (field == "admin") {
        policy.admin = true;
      } else if (absl::StartsWith(field, "max_host_bytes=")) {
        status = SetQuota(number, "max_host_bytes", field.substr(15), &policy.max_host_bytes,
                          &on_this_line);
      } else if (absl::StartsWith(field, "max_groups=")) {
        status =
            SetQuota(number, "max_groups", field.substr(11), &policy.max_groups, &on_this_line);
      } else {
        status = LineError(number, absl::StrCat("field ", i + 1,
                                                " is none of max_host_bytes=N, max_groups=N, "
                                                "admin"));
      }
      if (!status.ok()) return status;
    }
    table.entries.push_back(TokensTable::Entry{*digest, std::string(fields[0])});
  }
  return table;
}

}  // namespace optstate
