// The client's channel to a daemon, and the options it is made with. Not API.
#ifndef OPTSTATE_CLIENT_CALL_CHANNEL_H_
#define OPTSTATE_CLIENT_CALL_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "optstate/client.h"

namespace optstate::client_internal {

// INVALID_ARGUMENT, naming the bound, for options no client takes:
// max_attempts or max_chunks_in_flight under 1, chunk_bytes 0,
// max_message_bytes under kMinMessageBytes (optstate/message_limits.h), a
// timeout that is not positive.
absl::Status CheckClientOptions(const ClientOptions& options);

// A channel of its own to `target` (its own connection, so clients of one
// process do not queue behind each other on one socket), with the options'
// message limits and TLS files. Does not wait for the server.
// INVALID_ARGUMENT naming the option for a TLS file ReadTlsFiles refuses
// (tls_files.h), or a certificate without its key; for a host:port target
// whose port is 0 or past 65535 (gRPC would take it modulo 65536).
// FAILED_PRECONDITION in a child forked while its parent had clients open
// (process_guard.h).
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const ClientOptions& options);

// The token to send: ClientOptions::token, or OPTSTATE_TOKEN when it is
// empty, without surrounding whitespace (the newline a token file or secret
// ends with). INVALID_ARGUMENT for a character an HTTP/2 header value cannot
// carry (a control character or one past ASCII; gRPC would abort the
// process on it), naming its position and code, never the token.
absl::StatusOr<std::string> ResolveToken(const ClientOptions& options);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_CALL_CHANNEL_H_
