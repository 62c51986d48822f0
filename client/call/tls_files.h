// The client's TLS files, read and checked before a channel is made. Not API.
#ifndef OPTSTATE_CLIENT_CALL_TLS_FILES_H_
#define OPTSTATE_CLIENT_CALL_TLS_FILES_H_

#include <string>

#include "absl/status/statusor.h"
#include "optstate/client.h"

namespace optstate::client_internal {

// The PEM text of ClientOptions' TLS files (empty where not given).
struct TlsPem {
  std::string root_certs;
  std::string cert_chain;
  std::string private_key;
};

// Reads tls_root_ca_file, tls_cert_file and tls_key_file. INVALID_ARGUMENT
// naming the option (as C++ and Python call it) for a file that cannot be
// read, holds no certificate OpenSSL parses (the roots, the certificate) or
// no private key (the key), or a key that is not the certificate's: gRPC
// would take such files and fail every connection with "empty address list",
// and be retried as UNAVAILABLE.
absl::StatusOr<TlsPem> ReadTlsFiles(const ClientOptions& options);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_CALL_TLS_FILES_H_
