// The checks come first, because gRPC's file watcher does not fail on a
// missing or bad file: it logs and serves nothing, and every handshake fails.
#include "server/listen_credentials.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "server/base/log.h"

namespace optstate {
namespace {

absl::Status CheckPemFile(const std::string& flag, const std::string& path,
                          absl::string_view block) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": cannot be read"));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN") ||
      (!block.empty() && !absl::StrContains(text.str(), block))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": holds no PEM ", block.empty() ? "block" : block));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsLocalOnlyAddress(const std::string& listen) {
  return absl::StartsWith(listen, "unix:") || absl::StartsWith(listen, "127.") ||
         absl::StartsWith(listen, "[::1]:") || absl::StartsWith(listen, "localhost:") ||
         absl::StartsWith(listen, "ipv4:127.") || absl::StartsWith(listen, "ipv6:[::1]:");
}

namespace {

// A key that is not the certificate's started a daemon that refused every
// handshake; OpenSSL's X509_check_private_key tells at start.
absl::Status CheckKeyMatchesCertificate(const std::string& cert_file, const std::string& key_file) {
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  const std::string cert_pem = read(cert_file);
  const std::string key_pem = read(key_file);
  BIO* cert_bio = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  BIO* key_bio = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  X509* cert =
      cert_bio != nullptr ? PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr) : nullptr;
  EVP_PKEY* key =
      key_bio != nullptr ? PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr) : nullptr;
  absl::Status status;
  if (cert == nullptr) {
    status = absl::InvalidArgumentError(
        absl::StrCat("--tls_cert=", cert_file, ": its first certificate does not parse"));
  } else if (key == nullptr) {
    status = absl::InvalidArgumentError(
        absl::StrCat("--tls_key=", key_file,
                     ": the private key does not parse (an encrypted key is not "
                     "supported)"));
  } else if (X509_check_private_key(cert, key) != 1) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "--tls_key=", key_file, " is not the key of --tls_cert=", cert_file,
        " (its first certificate): every handshake would fail; give the certificate's own key"));
  }
  ERR_clear_error();
  EVP_PKEY_free(key);
  X509_free(cert);
  BIO_free(key_bio);
  BIO_free(cert_bio);
  return status;
}

}  // namespace

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

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ListenCredentials(
    const std::string& listen, const TlsOptions& tls) {
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
    return grpc::InsecureServerCredentials();
  }
  if (tls.reload_interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--tls_reload_interval must be at least 1s");
  }
  if (absl::Status s = CheckPemFile("tls_cert", tls.cert_file, "CERTIFICATE"); !s.ok()) return s;
  if (absl::Status s = CheckPemFile("tls_key", tls.key_file, "PRIVATE KEY"); !s.ok()) return s;
  if (absl::Status s = CheckKeyMatchesCertificate(tls.cert_file, tls.key_file); !s.ok()) return s;
  if (!tls.client_ca_file.empty()) {
    if (absl::Status s = CheckPemFile("tls_client_ca", tls.client_ca_file, "CERTIFICATE");
        !s.ok()) {
      return s;
    }
  }
  const auto seconds = static_cast<unsigned int>(absl::ToInt64Seconds(tls.reload_interval));
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls.key_file, tls.cert_file, tls.client_ca_file, seconds);
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
  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::experimental::TlsServerCredentials(options);
  if (credentials == nullptr) {
    return absl::InvalidArgumentError("gRPC refused the TLS options (--tls_cert, --tls_key)");
  }
  return credentials;
}

}  // namespace optstate
