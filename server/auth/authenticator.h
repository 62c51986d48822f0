// Who is calling: a bearer token looked up in the tokens file, or a client
// certificate's SPIFFE ID, mapped to a tenant; and each tenant's quotas.
#ifndef OPTSTATE_SERVER_AUTH_AUTHENTICATOR_H_
#define OPTSTATE_SERVER_AUTH_AUTHENTICATOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/auth/tokens_file.h"
#include "server/engine/tenant_quotas.h"

namespace optstate {

// An authenticated caller.
struct Caller {
  std::string tenant;  // "" when the daemon has no tenants.
  bool admin = false;  // Sees and may delete every tenant's groups.
  // Named by its client certificate's SPIFFE ID, not by a token (so it
  // cannot authenticate on the region socket, which sees no certificate).
  bool by_certificate = false;
};

struct AuthOptions {
  // The tokens file (tokens_file.h); empty: no tokens.
  std::string tokens_file;
  // With TLS client certificates: a leaf certificate's URI SAN
  // spiffe://TRUST_DOMAIN/tenant/NAME names tenant NAME for a caller with no
  // token; empty: certificates name no tenant.
  std::string spiffe_trust_domain;
  // Quotas of tenants whose lines give none (0: no limit).
  uint64_t tenant_max_host_bytes = 0;
  uint64_t tenant_max_groups = 0;
};

// Thread-safe.
class Authenticator : public TenantQuotas {
 public:
  // Reads and parses the tokens file; INVALID_ARGUMENT naming the file and
  // the line for a malformed one, NOT_FOUND when it cannot be read, and
  // INVALID_ARGUMENT for a trust domain that is not a plain host name.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(const AuthOptions& options);

  // Whether callers must authenticate (a tokens file or a trust domain);
  // else every caller is tenant "".
  bool required() const { return required_; }

  // The caller of a call: `authorization` is the call's authorization
  // metadata (nullopt when absent), `peer_uris` the URI SANs of its TLS
  // client certificate (empty without one). With a token, the token alone
  // decides. UNAUTHENTICATED, saying what to send, when required() and
  // neither names a tenant; the message never holds the token.
  absl::StatusOr<Caller> Authenticate(std::optional<absl::string_view> authorization,
                                      const std::vector<std::string>& peer_uris) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The caller holding `token` (the region socket's authentication):
  // UNAUTHENTICATED when the token is unknown and required().
  absl::StatusOr<Caller> AuthenticateToken(absl::string_view token) const ABSL_LOCKS_EXCLUDED(mu_);
  // The tenant of the token whose digest this is, while the tokens file
  // holds it (a region socket connection's token, asked again after a
  // reload); nullopt once revoked.
  std::optional<std::string> TenantOfDigest(const TokenDigest& digest) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Reads the tokens file again (SIGHUP). A malformed or unreadable file
  // changes nothing and returns why; else the new tokens and quotas hold for
  // every call from now on (streams already open keep their caller).
  absl::Status Reload() ABSL_LOCKS_EXCLUDED(mu_);

  // TenantQuotas.
  TenantQuota QuotaOf(const std::string& tenant) const override ABSL_LOCKS_EXCLUDED(mu_);

  // The tenants the tokens file names, sorted (for per-tenant metrics).
  std::vector<std::string> Tenants() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Authenticator(AuthOptions options, std::shared_ptr<const TokensTable> table)
      : options_(std::move(options)),
        required_(!options_.tokens_file.empty() || !options_.spiffe_trust_domain.empty()),
        table_(std::move(table)) {}
  std::shared_ptr<const TokensTable> table() const ABSL_LOCKS_EXCLUDED(mu_);
  Caller CallerOf(const TokensTable& table, const std::string& tenant) const;
  std::optional<Caller> FromToken(const TokensTable& table, absl::string_view token) const;

  const AuthOptions options_;
  const bool required_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const TokensTable> table_ ABSL_GUARDED_BY(mu_);
};

// The token of an authorization value "Bearer TOKEN" (the scheme in any
// case, one or more spaces); nullopt for anything else.
std::optional<absl::string_view> BearerToken(absl::string_view authorization);

// NAME when `uri` is exactly spiffe://TRUST_DOMAIN/tenant/NAME with a valid
// tenant name made of a SPIFFE path segment's characters (letters, digits,
// '.', '-', '_'; not "." or ".."); else nullopt.
std::optional<std::string> TenantOfSpiffeId(absl::string_view uri,
                                            absl::string_view trust_domain);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_AUTH_AUTHENTICATOR_H_
