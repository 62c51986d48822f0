#include "server/rpc/grpc_log.h"

#include <grpc/support/log.h>

#include <atomic>
#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/base/log.h"

namespace optstate {
namespace {

std::atomic<int64_t> logged_second{0};  // Unix second of the last line written.
std::atomic<uint64_t> left_out{0};      // Lines dropped since then.

void ToTheDaemonLog(gpr_log_func_args* args) {
  const bool assertion = absl::StartsWith(args->message, "assertion failed");
  // gRPC's info and debug lines come only when asked for (GRPC_VERBOSITY,
  // GRPC_TRACE): all of them, at debug. Its errors are limited.
  if (args->severity != GPR_LOG_SEVERITY_ERROR) {
    Log(LogLevel::kDebug, "gRPC (", args->file, ":", args->line, "): ", args->message);
    return;
  }
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  int64_t last = logged_second.load(std::memory_order_relaxed);
  if (!assertion && (last == now || !logged_second.compare_exchange_strong(last, now))) {
    left_out.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const uint64_t dropped = left_out.exchange(0, std::memory_order_relaxed);
  const LogLevel ours = assertion ? LogLevel::kError : LogLevel::kWarning;
  Log(ours, "gRPC (", args->file, ":", args->line, "): ", args->message,
      dropped == 0
          ? ""
          : absl::StrCat(" (", dropped, " more gRPC messages since the last one were not logged)"));
}

}  // namespace

void RouteGrpcLogToTheDaemonLog() { gpr_set_log_function(&ToTheDaemonLog); }

}  // namespace optstate
