// The tokens file (--auth_tokens_file): which token digests name which
// tenant, and each tenant's quotas and admin right. Parsing only; no I/O.
#ifndef OPTSTATE_SERVER_AUTH_TOKENS_FILE_H_
#define OPTSTATE_SERVER_AUTH_TOKENS_FILE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/auth/token_digest.h"

namespace optstate {

// What the file says of one tenant, over all of its lines.
struct TenantPolicy {
  std::optional<uint64_t> max_host_bytes;  // Unset: the daemon's default.
  std::optional<uint64_t> max_groups;      // Unset: the daemon's default.
  bool admin = false;
};

struct TokensTable {
  struct Entry {
    TokenDigest digest;
    std::string tenant;
  };
  std::vector<Entry> entries;  // One per token line, in file order.
  absl::flat_hash_map<std::string, TenantPolicy> tenants;
};

// Parses the format, exactly:
//   one entry per line; `#` starts a comment (to the end of the line); blank
//   lines are ignored; fields are separated by spaces or tabs:
//   TENANT SHA256HEX [max_host_bytes=N] [max_groups=N] [admin]
// TENANT: 1 to 128 printable ASCII characters, no spaces, no `#`.
// SHA256HEX: the lowercase hex SHA-256 of the token. Several lines may name
// one tenant (tokens rotate): a quota given on any of them is the tenant's
// (two different values are an error), and `admin` on any makes it admin.
// INVALID_ARGUMENT "line N: ..." for the first malformed line; the message
// never quotes a field (a token pasted by mistake is not echoed).
absl::StatusOr<TokensTable> ParseTokensFile(absl::string_view text);

// Tenant names the tokens file accepts (and SPIFFE IDs may carry).
bool IsValidTenantName(absl::string_view name);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_AUTH_TOKENS_FILE_H_
