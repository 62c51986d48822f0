#include "server/rpc/grpc_log.h"

#include <grpc/support/log.h>

#include <cstdint>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/base/log.h"
#include "server/base/log_limiter.h"

namespace optstate {
namespace {

LogLimiter limiter;

void ToTheDaemonLog(gpr_log_func_args* args) {
  const bool assertion = absl::StartsWith(args->message, "assertion failed");
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

}  // namespace optstate
