// One loop for every retried call: attempts, backoff, the exhausted message.
#include "client/call/retry.h"

#include <unistd.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/call/status.h"

namespace optstate::client_internal {

absl::Duration Backoff(const ClientOptions& options, int attempt) {
  absl::Duration wait = options.initial_backoff;
  for (int i = 1; i < attempt && wait < options.max_backoff; ++i) wait *= 2;
  return std::min(wait, options.max_backoff);
}

namespace {

// This process's host name, read once.
const std::string& HostName() {
  static const std::string* const name = [] {
    char buffer[256] = {};
    if (gethostname(buffer, sizeof(buffer) - 1) != 0) buffer[0] = '\0';
    std::string out;
    for (const char* c = buffer; *c != '\0'; ++c) {
      if (*c > ' ' && *c <= '~') out.push_back(*c);
    }
    return new std::string(out);
  }();
  return *name;
}

}  // namespace

std::string LeaseMetadata(const ClientOptions& options) {
  std::string out = absl::StrCat("holder=", options.lease_holder);
  if (!options.lease_job.empty()) absl::StrAppend(&out, " job=", options.lease_job);
  if (!HostName().empty()) absl::StrAppend(&out, " host=", HostName());
  absl::StrAppend(&out, " pid=", static_cast<long>(getpid()));
  return out;
}

void PrepareContext(grpc::ClientContext* context, const ClientOptions& options) {
  if (!options.token.empty()) context->AddMetadata("authorization", "Bearer " + options.token);
  if (!options.lease_holder.empty()) context->AddMetadata("optstate-lease", LeaseMetadata(options));
  if (!options.lease_takeover.empty()) {
    context->AddMetadata("optstate-lease-takeover", options.lease_takeover);
  }
  // A timeout of a century or more (InfiniteDuration included) is no
  // deadline; added to the clock it could overflow into one in the past.
  if (options.attempt_timeout >= absl::Hours(24 * 365 * 100)) return;
  context->set_deadline(absl::ToChronoTime(absl::Now() + options.attempt_timeout));
}

WaitEnd WaitInterruptibly(const ClientOptions& options, grpc::Channel* channel,
                          absl::Time deadline) {
  // Without options.interrupted, one wait; with it, slices of this long.
  constexpr absl::Duration kSlice = absl::Milliseconds(100);
  for (;;) {
    if (options.interrupted && options.interrupted()) return WaitEnd::kInterrupted;
    const absl::Time now = absl::Now();
    if (now >= deadline) return WaitEnd::kDeadline;
    const absl::Time until = options.interrupted ? std::min(deadline, now + kSlice) : deadline;
    if (channel == nullptr) {
      absl::SleepFor(until - now);
    } else if (channel->WaitForConnected(absl::ToChronoTime(until))) {
      return WaitEnd::kConnected;
    }
  }
}

namespace {

// The wait before retry `attempt` after `last` failed (see WithRetries):
// false when options.interrupted ended it.
bool WaitBeforeRetry(const ClientOptions& options, grpc::Channel* channel, int attempt,
                     const absl::Status& last) {
  const absl::Time deadline = absl::Now() + Backoff(options, attempt);
  // Polls the channel (and starts a connection attempt) while it waits.
  const bool reconnect = channel != nullptr && last.code() == absl::StatusCode::kUnavailable &&
                         channel->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY;
  return WaitInterruptibly(options, reconnect ? channel : nullptr, deadline) !=
         WaitEnd::kInterrupted;
}

}  // namespace

absl::Status WithRetries(const ClientOptions& options, grpc::Channel* channel,
                         absl::FunctionRef<absl::Status(int attempt)> attempt,
                         absl::string_view what) {
  absl::Status last;
  // A daemon that is not there (restarting) is waited for up to
  // reconnect_timeout after the first attempt that found it gone.
  absl::Time reconnect_deadline = absl::InfinitePast();
  int n = 0;
  for (;; ++n) {
    if (n > 0 && !WaitBeforeRetry(options, channel, n, last)) {
      return absl::CancelledError(absl::StrCat(
          "interrupted while waiting to retry", what.empty() ? "" : " ", what, " after ", n,
          n == 1 ? " attempt" : " attempts", " (the last: ", last.message(), ")"));
    }
    last = attempt(n);
    if (last.ok() || !IsRetryable(last)) return last;
    if (last.code() == absl::StatusCode::kUnavailable &&
        options.reconnect_timeout > absl::ZeroDuration() &&
        reconnect_deadline == absl::InfinitePast()) {
      reconnect_deadline = absl::Now() + options.reconnect_timeout;
    }
    const bool waiting = last.code() == absl::StatusCode::kUnavailable &&
                         absl::Now() + Backoff(options, n + 1) < reconnect_deadline;
    if (n + 1 >= options.max_attempts && !waiting) break;
  }
  if (what.empty()) return last;
  return absl::Status(last.code(),
                      absl::StrCat(what, " failed after ", n + 1, " attempts: ", last.message()));
}

absl::Status UnaryWithRetries(const ClientOptions& options, grpc::Channel* channel,
                              absl::FunctionRef<grpc::Status(grpc::ClientContext*)> call) {
  return WithRetries(options, channel, [&](int) {
    grpc::ClientContext context;
    PrepareContext(&context, options);
    return FromGrpcStatus(call(&context));
  });
}

}  // namespace optstate::client_internal
