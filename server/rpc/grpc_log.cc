#include "server/rpc/grpc_log.h"

#include <grpc/support/log.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/base/log.h"
#include "server/base/log_limiter.h"

namespace optstate {
namespace {

LogLimiter limiter;

// OnGrpcListenerFailed's callback; set before gRPC serves, read after.
std::function<void(const std::string&)>* listener_failed = nullptr;
std::atomic<bool> listener_failed_told{false};

void ToTheDaemonLog(gpr_log_func_args* args) {
  const bool assertion = absl::StartsWith(args->message, "assertion failed");
  // tcp_server_posix logs this, then closes the listener's watch for good;
  // a passing failure (EAGAIN, ECONNABORTED) is not logged.
  if (args->severity == GPR_LOG_SEVERITY_ERROR && listener_failed != nullptr &&
      absl::StrContains(args->file, "tcp_server_posix") &&
      absl::StartsWith(args->message, "Failed accept4") && !listener_failed_told.exchange(true)) {
    (*listener_failed)(args->message);
  }
  // gRPC's info and debug lines come only when asked for (GRPC_VERBOSITY,
  // GRPC_TRACE): all of them, at debug. Its errors are limited.
  if (args->severity != GPR_LOG_SEVERITY_ERROR) {
    Log(LogLevel::kDebug, "gRPC (", args->file, ":", args->line, "): ", args->message);
    return;
  }
  const std::optional<uint64_t> taken = limiter.Take();
  if (!assertion && !taken.has_value()) return;
  const uint64_t dropped = taken.value_or(0);
  const LogLevel ours = assertion ? LogLevel::kError : LogLevel::kWarning;
  Log(ours, "gRPC (", args->file, ":", args->line, "): ", args->message,
      dropped == 0
          ? ""
          : absl::StrCat(" (", dropped, " more gRPC messages since the last one were not logged)"));
}

}  // namespace

void RouteGrpcLogToTheDaemonLog() { gpr_set_log_function(&ToTheDaemonLog); }

void OnGrpcListenerFailed(std::function<void(const std::string& reason)> failed) {
  delete listener_failed;
  listener_failed = new std::function<void(const std::string&)>(std::move(failed));
}

}  // namespace optstate
