// Token lookup: the digest of the presented token is compared with every
// line's digest in constant time, and every line is compared (no early
// exit), so the time says nothing of which line, if any, matched.
#include "server/auth/authenticator.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/base/log.h"

namespace optstate {
namespace {

absl::StatusOr<std::shared_ptr<const TokensTable>> ReadTable(const std::string& path) {
  if (path.empty()) return std::make_shared<const TokensTable>();
  // A directory opens as a stream that reads nothing: it would read as a
  // file of no tokens, and lock every tenant out.
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::NotFoundError(
        absl::StrCat("--auth_tokens_file=", path, ": cannot be read (it is a directory)"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("--auth_tokens_file=", path, ": cannot be read"));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::NotFoundError(absl::StrCat("--auth_tokens_file=", path, ": read failed"));
  }
  absl::StatusOr<TokensTable> table = ParseTokensFile(text.str());
  if (!table.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_tokens_file=", path, ": ", table.status().message()));
  }
  return std::make_shared<const TokensTable>(std::move(*table));
}

bool IsHostName(absl::string_view name) {
  if (name.empty() || name.size() > 255) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != '_') return false;
  }
  return true;
}

uint64_t OrNoLimit(uint64_t n) { return n == 0 ? TenantQuota().max_host_bytes : n; }

}  // namespace

std::optional<absl::string_view> BearerToken(absl::string_view authorization) {
  constexpr absl::string_view kScheme = "bearer";
  if (authorization.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()), kScheme) ||
      authorization[kScheme.size()] != ' ') {
    return std::nullopt;
  }
  absl::string_view token = authorization.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  if (token.empty()) return std::nullopt;
  return token;
}

std::optional<std::string> TenantOfSpiffeId(absl::string_view uri, absl::string_view trust_domain) {
  const std::string prefix = absl::StrCat("spiffe://", trust_domain, "/tenant/");
  if (trust_domain.empty() || !absl::StartsWith(uri, prefix)) return std::nullopt;
  const absl::string_view name = uri.substr(prefix.size());
  // A SPIFFE ID's path segment: letters, digits, '.', '-' and '_' (no query,
  // no percent-encoding), not "." or "..".
  if (!IsValidTenantName(name) || name == "." || name == "..") return std::nullopt;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != '_') return std::nullopt;
  }
  return std::string(name);
}

namespace {

// An empty tokens file is valid (every token revoked) but locks out every
// caller that has no certificate: worth a warning, at start and on reload.
void WarnIfNoToken(const AuthOptions& options, const TokensTable& table) {
  if (options.tokens_file.empty() || !table.entries.empty()) return;
  Log(LogLevel::kWarning, "--auth_tokens_file ", options.tokens_file,
      " holds no token: every call without a client certificate is refused (UNAUTHENTICATED)");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(const AuthOptions& options) {
  if (!options.spiffe_trust_domain.empty() && !IsHostName(options.spiffe_trust_domain)) {
    return absl::InvalidArgumentError(
        "--tls_trust_domain must be a plain trust domain such as example.org (letters, digits, "
        "'.', '-', '_'), without spiffe:// or a path");
  }
  absl::StatusOr<std::shared_ptr<const TokensTable>> table = ReadTable(options.tokens_file);
  if (!table.ok()) return table.status();
  WarnIfNoToken(options, **table);
  return std::unique_ptr<Authenticator>(new Authenticator(options, std::move(*table)));
}

std::shared_ptr<const TokensTable> Authenticator::table() const {
  absl::MutexLock lock(&mu_);
  return table_;
}

absl::Status Authenticator::Reload() {
  absl::StatusOr<std::shared_ptr<const TokensTable>> table = ReadTable(options_.tokens_file);
  if (!table.ok()) return table.status();
  WarnIfNoToken(options_, **table);
  absl::MutexLock lock(&mu_);
  table_ = std::move(*table);
  return absl::OkStatus();
}

Caller Authenticator::CallerOf(const TokensTable& table, const std::string& tenant) const {
  const auto it = table.tenants.find(tenant);
  return Caller{tenant, it != table.tenants.end() && it->second.admin};
}

std::optional<Caller> Authenticator::FromToken(const TokensTable& table,
                                               absl::string_view token) const {
  const TokenDigest digest = DigestOfToken(token);
  const TokensTable::Entry* found = nullptr;
  for (const TokensTable::Entry& entry : table.entries) {
    const bool same = SameDigest(entry.digest, digest);
    if (same) found = &entry;
  }
  if (found == nullptr) return std::nullopt;
  return CallerOf(table, found->tenant);
}

absl::StatusOr<Caller> Authenticator::Authenticate(
    std::optional<absl::string_view> authorization,
    const std::vector<std::string>& peer_uris) const {
  if (!required_) return Caller();
  const std::shared_ptr<const TokensTable> current = table();
  if (authorization.has_value() && !options_.tokens_file.empty()) {
    std::optional<absl::string_view> token = BearerToken(*authorization);
    if (!token) {
      return absl::UnauthenticatedError(
          "the authorization metadata must be 'Bearer TOKEN' (optstate clients: the token "
          "option, or OPTSTATE_TOKEN)");
    }
    std::optional<Caller> caller = FromToken(*current, *token);
    if (!caller) {
      return absl::UnauthenticatedError(
          "the bearer token is not one this daemon accepts (mistyped, or revoked from its "
          "tokens file); ask the daemon's operator for a token");
    }
    return *caller;
  }
  if (peer_uris.size() > 1) {
    // An X.509-SVID carries exactly one URI SAN: which tenant would be meant?
    return absl::UnauthenticatedError(
        absl::StrCat("the client certificate carries ", peer_uris.size(),
                     " URI SANs; a SPIFFE certificate carries exactly one, spiffe://",
                     options_.spiffe_trust_domain, "/tenant/NAME"));
  }
  for (const std::string& uri : peer_uris) {
    if (std::optional<std::string> tenant = TenantOfSpiffeId(uri, options_.spiffe_trust_domain)) {
      Caller caller = CallerOf(*current, *tenant);
      caller.by_certificate = true;
      return caller;
    }
  }
  // What was sent that names no tenant, and the ways a caller is one.
  const std::string sent = peer_uris.empty()
                               ? std::string()
                               : absl::StrCat("the client certificate's URI SAN '", peer_uris[0],
                                              "' names no tenant of this daemon; ");
  const std::string by_certificate = absl::StrCat("a client certificate whose URI SAN is spiffe://",
                                                  options_.spiffe_trust_domain, "/tenant/NAME");
  const std::string by_token =
      "a token: send the metadata 'authorization: Bearer TOKEN' (optstate clients: the token "
      "option, or OPTSTATE_TOKEN)";
  if (options_.tokens_file.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(sent, "this daemon needs ", by_certificate));
  }
  if (options_.spiffe_trust_domain.empty()) {
    return absl::UnauthenticatedError(absl::StrCat("this daemon needs ", by_token));
  }
  return absl::UnauthenticatedError(
      absl::StrCat(sent, "this daemon needs ", by_token, ", or ", by_certificate));
}

absl::StatusOr<Caller> Authenticator::AuthenticateToken(absl::string_view token) const {
  if (!required_) return Caller();
  const std::shared_ptr<const TokensTable> current = table();
  std::optional<Caller> caller = FromToken(*current, token);
  if (!caller) {
    return absl::UnauthenticatedError(
        "the token is not one this daemon accepts (mistyped, or revoked from its tokens file)");
  }
  return *caller;
}

std::optional<std::string> Authenticator::TenantOfDigest(const TokenDigest& digest) const {
  const std::shared_ptr<const TokensTable> current = table();
  std::optional<std::string> tenant;
  for (const TokensTable::Entry& entry : current->entries) {
    if (SameDigest(entry.digest, digest)) tenant = entry.tenant;
  }
  return tenant;
}

TenantQuota Authenticator::QuotaOf(const std::string& tenant) const {
  const std::shared_ptr<const TokensTable> current = table();
  TenantQuota quota;
  quota.max_host_bytes = OrNoLimit(options_.tenant_max_host_bytes);
  quota.max_groups = OrNoLimit(options_.tenant_max_groups);
  const auto it = current->tenants.find(tenant);
  if (it != current->tenants.end()) {
    // 0 on a line is no limit, as for the flags: a tenant exempt from them.
    if (it->second.max_host_bytes) quota.max_host_bytes = OrNoLimit(*it->second.max_host_bytes);
    if (it->second.max_groups) quota.max_groups = OrNoLimit(*it->second.max_groups);
  }
  return quota;
}

std::vector<std::string> Authenticator::Tenants() const {
  const std::shared_ptr<const TokensTable> current = table();
  std::vector<std::string> out;
  for (const auto& [name, policy] : current->tenants) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace optstate
