// A blocking socket with a deadline, OpenSSL's handshake with SSL_VERIFY_NONE
// (so it goes on past a bad certificate) and SSL_get_verify_result.
#include "client/call/tls_diagnosis.h"

#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace optstate::client_internal {

namespace {

// host and port of a TCP target; false for unix: and anything unparsed.
bool SplitTarget(const std::string& target, std::string* host, std::string* port) {
  if (absl::StartsWith(target, "unix:") || absl::StartsWith(target, "unix-abstract:")) {
    return false;
  }
  absl::string_view rest(target);
  for (absl::string_view prefix : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::ConsumePrefix(&rest, prefix)) break;
  }
  if (absl::ConsumePrefix(&rest, "[")) {
    const size_t end = rest.find(']');
    if (end == absl::string_view::npos || rest.substr(end + 1, 1) != ":") return false;
    *host = std::string(rest.substr(0, end));
    *port = std::string(rest.substr(end + 2));
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == absl::string_view::npos) return false;
    *host = std::string(rest.substr(0, colon));
    *port = std::string(rest.substr(colon + 1));
  }
  int number = 0;
  return !host->empty() && absl::SimpleAtoi(*port, &number) && number > 0 && number < 65536;
}

// A connected TCP socket, or -1.
int ConnectWithin(const std::string& host, const std::string& port, absl::Duration timeout) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    timeval tv{static_cast<time_t>(absl::ToInt64Seconds(timeout)), 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  return fd;
}

std::string Asn1Time(const ASN1_TIME* time) {
  BIO* bio = BIO_new(BIO_s_mem());
  ASN1_TIME_print(bio, time);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  std::string text(data, size);
  BIO_free(bio);
  return text;
}

struct SslFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
  void operator()(SSL* s) const { SSL_free(s); }
  void operator()(X509* x) const { X509_free(x); }
};

}  // namespace

std::string DiagnoseServerCertificate(const std::string& target, const ClientOptions& options,
                                      absl::Duration timeout) {
  std::string host, port;
  if (!SplitTarget(target, &host, &port)) return "";
  std::unique_ptr<SSL_CTX, SslFree> context(SSL_CTX_new(TLS_client_method()));
  if (context == nullptr) return "";
  SSL_CTX_set_verify(context.get(), SSL_VERIFY_NONE, nullptr);
  const bool roots = options.tls_root_ca_file.empty()
                         ? SSL_CTX_set_default_verify_paths(context.get()) == 1
                         : SSL_CTX_load_verify_locations(
                               context.get(), options.tls_root_ca_file.c_str(), nullptr) == 1;
  if (!roots) {
    ERR_clear_error();
    return "";
  }
  const int fd = ConnectWithin(host, port, timeout);
  if (fd < 0) return "";
  std::unique_ptr<SSL, SslFree> ssl(SSL_new(context.get()));
  const std::string name = options.tls_server_name.empty() ? host : options.tls_server_name;
  SSL_set_tlsext_host_name(ssl.get(), name.c_str());
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl.get());
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  // An IP address is checked as one, a name as a name.
  if (X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str()) != 1) {
    ERR_clear_error();
    X509_VERIFY_PARAM_set1_host(param, name.c_str(), 0);
  }
  SSL_set_fd(ssl.get(), fd);
  SSL_connect(ssl.get());  // The verdict is read below, however the handshake ends.
  ERR_clear_error();
  std::string diagnosis;
  std::unique_ptr<X509, SslFree> cert(SSL_get1_peer_certificate(ssl.get()));
  const long result = SSL_get_verify_result(ssl.get());
  if (cert != nullptr && result != X509_V_OK) {
    char subject[256] = "";
    X509_NAME_oneline(X509_get_subject_name(cert.get()), subject, sizeof(subject));
    diagnosis = absl::StrCat(X509_verify_cert_error_string(result), " (the certificate of ",
                             subject, ", valid from ", Asn1Time(X509_get0_notBefore(cert.get())),
                             " until ", Asn1Time(X509_get0_notAfter(cert.get())), ")");
  }
  SSL_shutdown(ssl.get());
  close(fd);
  return diagnosis;
}

absl::Status ExplainCertificateFailure(absl::Status status, const std::string& target,
                                       const ClientOptions& options) {
  if (status.code() != absl::StatusCode::kUnavailable ||
      !absl::StrContains(status.message(), "certificate verify failed")) {
    return status;
  }
  const std::string diagnosis = DiagnoseServerCertificate(target, options, absl::Seconds(5));
  if (diagnosis.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(status.message(), "; the daemon's certificate: ",
                                                  diagnosis));
}

}  // namespace optstate::client_internal
