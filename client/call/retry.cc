// One loop for every retried call: attempts, backoff, the exhausted message.
#include "client/call/retry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/call/status.h"

namespace optstate::client_internal {

absl::Duration Backoff(const ClientOptions& options, int attempt) {
  absl::Duration wait = options.initial_backoff;
  for (int i = 1; i < attempt && wait < options.max_backoff; ++i) wait *= 2;
  return std::min(wait, options.max_backoff);
}

void PrepareContext(grpc::ClientContext* context, const ClientOptions& options) {
  // A timeout of a century or more (InfiniteDuration included) is no
  // deadline; added to the clock it could overflow into one in the past.
  if (!options.token.empty()) context->AddMetadata("authorization", "Bearer " + options.token);
  if (options.attempt_timeout >= absl::Hours(24 * 365 * 100)) return;
  context->set_deadline(absl::ToChronoTime(absl::Now() + options.attempt_timeout));
}

absl::Status WithRetries(const ClientOptions& options,
                         absl::FunctionRef<absl::Status(int attempt)> attempt,
                         absl::string_view what) {
  absl::Status last;
  for (int n = 0; n < options.max_attempts; ++n) {
    if (n > 0) absl::SleepFor(Backoff(options, n));
    last = attempt(n);
    if (last.ok() || !IsRetryable(last)) return last;
  }
  if (what.empty()) return last;
  return absl::Status(last.code(), absl::StrCat(what, " failed after ", options.max_attempts,
                                                " attempts: ", last.message()));
}

absl::Status UnaryWithRetries(const ClientOptions& options,
                              absl::FunctionRef<grpc::Status(grpc::ClientContext*)> call) {
  return WithRetries(options, [&](int) {
    grpc::ClientContext context;
    PrepareContext(&context, options);
    return FromGrpcStatus(call(&context));
  });
}

}  // namespace optstate::client_internal
