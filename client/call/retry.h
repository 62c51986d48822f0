// The client's one retry loop, its backoff and each attempt's deadline.
// Every call of the client that may be retried goes through WithRetries.
// Not API.
#ifndef OPTSTATE_CLIENT_CALL_RETRY_H_
#define OPTSTATE_CLIENT_CALL_RETRY_H_

#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "optstate/client.h"

namespace optstate::client_internal {

// The sleep before attempt `attempt` (1 for the first retry):
// initial_backoff, doubled per retry, at most max_backoff.
absl::Duration Backoff(const ClientOptions& options, int attempt);

// Gives `context` the deadline of one attempt (ClientOptions::attempt_timeout;
// none for a timeout of a century or more, InfiniteDuration included) and,
// with ClientOptions::token set, the metadata 'authorization: Bearer TOKEN'
// (sent by hand: gRPC's call credentials refuse plaintext channels); with
// lease_holder set, 'optstate-lease' (LeaseMetadata), and with
// lease_takeover set, 'optstate-lease-takeover'.
void PrepareContext(grpc::ClientContext* context, const ClientOptions& options);

// 'holder=ID job=JOB host=HOST pid=PID' for this process (job left out when
// empty).
std::string LeaseMetadata(const ClientOptions& options);

// How a wait (WaitInterruptibly) ended.
enum class WaitEnd { kDeadline, kConnected, kInterrupted };

// Waits until `deadline`, or until `channel` connects when it is not null
// (polling it, which starts a connection attempt), asking
// options.interrupted (when set) before each slice of at most 100 ms.
WaitEnd WaitInterruptibly(const ClientOptions& options, grpc::Channel* channel,
                          absl::Time deadline);

// Runs attempt(0), then attempt(1), ... (up to options.max_attempts in all,
// waiting Backoff before each retry) while it fails transiently
// (IsRetryable); while it fails UNAVAILABLE, also beyond max_attempts until
// options.reconnect_timeout after the first UNAVAILABLE. Returns the first OK
// or non-transient status. When every attempt failed transiently, the last
// status: with `what` empty as it is, else with its message as "WHAT failed
// after N attempts: MESSAGE". CANCELLED ("interrupted ...") when
// options.interrupted says so during a wait between attempts.
//
// After an UNAVAILABLE while `channel` (may be null) is not connected, the
// wait before the retry ends as soon as the channel connects again. A sleep
// would not do: a connection attempt's outcome is only seen while a thread
// polls the channel (gRPC's backup poller looks every 5 s), so a daemon back
// from a restart went unnoticed for up to 10 s of retries.
absl::Status WithRetries(const ClientOptions& options, grpc::Channel* channel,
                         absl::FunctionRef<absl::Status(int attempt)> attempt,
                         absl::string_view what = {});

// WithRetries for a unary call: each attempt gets a fresh context with the
// attempt's deadline. Only for calls that are safe to repeat.
absl::Status UnaryWithRetries(const ClientOptions& options, grpc::Channel* channel,
                              absl::FunctionRef<grpc::Status(grpc::ClientContext*)> call);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_CALL_RETRY_H_
