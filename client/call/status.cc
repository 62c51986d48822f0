// gRPC status codes are absl's, number for number.
#include "client/call/status.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace optstate::client_internal {

namespace {

// What a TLS failure gRPC reports means for ClientOptions (gRPC's own text
// names OpenSSL's reason, not the option to change).
std::string TlsHint(const std::string& message) {
  if (absl::StrContains(message, "certificate verify failed")) {
    return " (TLS: the daemon's certificate is not signed by a CA of "
           "ClientOptions.tls_root_ca_file, or the system's roots when it is empty, or it has "
           "expired or is not yet valid; Python: tls_root_ca=)";
  }
  if (absl::StrContains(message, "is not in peer certificate")) {
    return " (TLS: the daemon's certificate does not carry the name connected to; connect by a "
           "name it carries, or set ClientOptions.tls_server_name to one; Python: "
           "tls_server_name=)";
  }
  if (absl::StrContains(message, "failed to connect to all addresses") &&
      absl::StrContains(message, "Socket closed")) {
    // The daemon closed the connection while it was set up: what a TLS
    // daemon does to a plaintext client, and an mTLS one to a client
    // without a certificate it accepts (the client sees no TLS error).
    return " (the daemon closed the connection while it was being set up: a daemon serving "
           "TLS does so to a plaintext client (set ClientOptions.tls_root_ca_file, or tls for "
           "the system's roots; Python: tls_root_ca= or tls=True), and one requiring client "
           "certificates to a client without one it accepts (tls_cert_file and tls_key_file, "
           "signed by its --tls_client_ca and not expired; Python: tls_cert= and tls_key=))";
  }
  if (absl::StrContains(message, "Ssl handshake failed") ||
      absl::StrContains(message, "Handshake failed")) {
    return " (TLS handshake failed: check ClientOptions.tls_root_ca_file, and for a daemon that "
           "requires client certificates tls_cert_file and tls_key_file; Python: tls_root_ca=, "
           "tls_cert=, tls_key=)";
  }
  return "";
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  if (code == absl::StatusCode::kUnavailable) {
    return absl::Status(code, status.error_message() + TlsHint(status.error_message()));
  }
  if (code == absl::StatusCode::kInternal &&
      absl::StartsWith(status.error_message(), "Received RST_STREAM with error code")) {
    // gRPC's own words for a reset stream, not an answer of the daemon's
    // (whose INTERNAL messages are its own): a transport failure.
    return absl::UnavailableError(absl::StrCat(
        "the daemon's gRPC reset the stream (", status.error_message(),
        "), as it does when its buffers (--grpc_buffer_bytes) are full; nothing was answered on "
        "it"));
  }
  return absl::Status(code, status.error_message());
}

bool IsRetryable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}

}  // namespace optstate::client_internal
