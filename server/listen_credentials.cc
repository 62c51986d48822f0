// The checks come first, because gRPC's file watcher does not fail on a
// missing or bad file: it logs and serves nothing, and every handshake fails.
#include "server/listen_credentials.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "server/base/log.h"

namespace optstate {

bool IsLocalOnlyAddress(const std::string& listen) {
  if (absl::StartsWith(listen, "unix:")) return true;
  absl::string_view address = listen;
  if (!absl::ConsumePrefix(&address, "ipv4:")) absl::ConsumePrefix(&address, "ipv6:");
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return false;
  const std::string host(address.substr(0, colon));
  if (host == "localhost" || host == "[::1]") return true;
  // A literal address only: a name such as 127.0.0.1.example.org may
  // resolve anywhere.
  // inet_aton: the forms a literal address may take (127.1 too); it would
  // take anything after a blank too, so a blank is none of them.
  in_addr ipv4{};
  return host.find_first_of(" \t\n\r\f\v") == std::string::npos &&
         inet_aton(host.c_str(), &ipv4) != 0 && (ntohl(ipv4.s_addr) >> 24) == 127;
}

absl::Status CheckListenAddress(const std::string& listen) {
  if (absl::StartsWith(listen, "unix:")) {
    if (listen.size() > 5) return absl::OkStatus();
    return absl::InvalidArgumentError("--listen=unix: needs a path (unix:/run/optstate.sock)");
  }
  const size_t colon = listen.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size() ||
      !absl::ascii_isdigit(listen[colon + 1]) ||
      !absl::SimpleAtoi(absl::string_view(listen).substr(colon + 1), &port) || port > 65535) {
    // gRPC takes a port past 65535 modulo 65536, and an empty one for 443.
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen must be HOST:PORT with a port of 0 to 65535 (127.0.0.1:50051, 0.0.0.0:50051, "
        "[::1]:50051; 0 picks a free one) or unix:PATH, got '",
        listen, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ListenSecurity> ListenCredentials(const std::string& listen, const TlsOptions& tls) {
  if (absl::Status s = CheckListenAddress(listen); !s.ok()) return s;
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together: give both or neither");
  }
  if (tls.cert_file.empty()) {
    if (!tls.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca needs --tls_cert and --tls_key (client certificates ride on TLS)");
    }
    if (!IsLocalOnlyAddress(listen)) {
      if (!tls.allow_insecure_remote) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--listen=", listen,
            " is reachable from other hosts and would serve plaintext: give --tls_cert and "
            "--tls_key (docs/security.md), or --allow_insecure_remote on a network you trust"));
      }
      Log(LogLevel::kWarning, "serving plaintext on ", listen,
          " (--allow_insecure_remote): tokens and state cross the network unencrypted");
    }
    ListenSecurity plaintext;
    plaintext.credentials = grpc::InsecureServerCredentials();
    return plaintext;
  }
  if (tls.reload_interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--tls_reload_interval must be at least 1s");
  }
  TlsFilePaths paths;
  paths.cert_file = tls.cert_file;
  paths.key_file = tls.key_file;
  paths.client_ca_file = tls.client_ca_file;
  absl::StatusOr<std::unique_ptr<CheckedTlsFiles>> files =
      CheckedTlsFiles::Open(paths, tls.reload_interval);
  if (!files.ok()) return files.status();
  const auto seconds = static_cast<unsigned int>(absl::ToInt64Seconds(tls.reload_interval));
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      (*files)->key_path(), (*files)->cert_path(), (*files)->client_ca_path(), seconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (tls.client_ca_file.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    // Without watch_root_certs the provider's roots are never used and
    // client certificates would go unverified.
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  ListenSecurity security;
  security.credentials = grpc::experimental::TlsServerCredentials(options);
  if (security.credentials == nullptr) {
    return absl::InvalidArgumentError("gRPC refused the TLS options (--tls_cert, --tls_key)");
  }
  security.tls_files = std::move(*files);
  return security;
}

}  // namespace optstate
