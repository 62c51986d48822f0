// Why a daemon's certificate fails verification, in OpenSSL's words, found by
// a handshake of its own: gRPC reports only "certificate verify failed". A
// diagnosis only: the channel's own verification decides; this never trusts
// anything. Not API.
#ifndef OPTSTATE_CLIENT_CALL_TLS_DIAGNOSIS_H_
#define OPTSTATE_CLIENT_CALL_TLS_DIAGNOSIS_H_

#include <string>

#include "absl/time/time.h"
#include "optstate/client.h"

namespace optstate::client_internal {

// Connects to `target` (host:port, [v6]:port, or with gRPC's dns:/// or
// ipv4:/ipv6: prefix), makes a TLS handshake with the roots of
// options.tls_root_ca_file (the system's when empty), checks the name
// (options.tls_server_name, else the target's host) and returns the result,
// such as "certificate has expired" or "unable to get local issuer
// certificate", with the certificate's subject and validity; "" when it
// verifies, or when the target is no TCP address or cannot be reached
// within `timeout`.
std::string DiagnoseServerCertificate(const std::string& target, const ClientOptions& options,
                                      absl::Duration timeout);

// `status` with the diagnosis appended when it is UNAVAILABLE and says
// "certificate verify failed"; else `status` as it is.
absl::Status ExplainCertificateFailure(absl::Status status, const std::string& target,
                                       const ClientOptions& options);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_CALL_TLS_DIAGNOSIS_H_
