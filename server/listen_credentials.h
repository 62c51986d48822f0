// The credentials the daemon serves --listen with: TLS (and mTLS) from
// certificate files reloaded when they change, or plaintext where that is
// allowed (loopback, unix: sockets, or --allow_insecure_remote).
#ifndef OPTSTATE_SERVER_LISTEN_CREDENTIALS_H_
#define OPTSTATE_SERVER_LISTEN_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/security/server_credentials.h"
#include "server/checked_tls_files.h"

namespace optstate {

struct TlsOptions {
  std::string cert_file;       // PEM certificate chain; empty: plaintext.
  std::string key_file;        // PEM private key of cert_file's leaf.
  std::string client_ca_file;  // PEM roots; set: clients must present a certificate they sign.
  // How often the files are looked at; a change that passes the checks
  // made at start is served to handshakes that start after it (open
  // connections keep theirs), one that does not is logged and the previous
  // files stay served. At least 1 s.
  absl::Duration reload_interval = absl::Seconds(10);
  // Plaintext on an address other than loopback or unix: (else refused).
  bool allow_insecure_remote = false;
};

// Whether `listen` (host:port or unix:path) can be reached only from this
// host: unix:, a literal 127.x.x.x, [::1] and localhost (other names, even
// one that starts "127.", may resolve to any address).
bool IsLocalOnlyAddress(const std::string& listen);

// INVALID_ARGUMENT, saying the form, unless `listen` is HOST:PORT with a
// port of 0 to 65535 or unix:PATH.
absl::Status CheckListenAddress(const std::string& listen);

struct ListenSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // With TLS: the checked copies gRPC's watcher reads; keep it as long as
  // the server. Null for plaintext.
  std::unique_ptr<CheckedTlsFiles> tls_files;
};

// TLS credentials (gRPC's FileWatcherCertificateProvider over the checked
// copies of CheckedTlsFiles; with a client CA it also watches the roots and
// requires and verifies client certificates), or insecure ones.
// INVALID_ARGUMENT, naming the flag, for a cert without a key or the
// reverse, a client CA without a cert, files that fail CheckTlsFiles, a
// malformed `listen` (CheckListenAddress), and plaintext on a remote
// address without allow_insecure_remote (which then logs a warning).
absl::StatusOr<ListenSecurity> ListenCredentials(const std::string& listen, const TlsOptions& tls);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_LISTEN_CREDENTIALS_H_
