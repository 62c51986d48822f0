#include "server/rpc/protobuf_log.h"

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/stubs/logging.h"
#include "server/base/log.h"

namespace optstate {
namespace {

std::atomic<int64_t> logged_second{0};  // Unix second of the last line written.
std::atomic<uint64_t> left_out{0};      // Lines dropped since then.

void ToTheDaemonLog(google::protobuf::LogLevel level, const char* file, int line,
                    const std::string& message) {
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  int64_t last = logged_second.load(std::memory_order_relaxed);
  if (last == now || !logged_second.compare_exchange_strong(last, now)) {
    left_out.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const uint64_t dropped = left_out.exchange(0, std::memory_order_relaxed);
  const LogLevel ours = level >= google::protobuf::LOGLEVEL_FATAL     ? LogLevel::kError
                        : level >= google::protobuf::LOGLEVEL_WARNING ? LogLevel::kWarning
                                                                      : LogLevel::kDebug;
  Log(ours, "protobuf (", file, ":", line, "): ", message,
      dropped == 0 ? ""
                   : absl::StrCat(" (", dropped,
                                  " more protobuf messages since the last one were not logged)"));
}

}  // namespace

void RouteProtobufLogToTheDaemonLog() { google::protobuf::SetLogHandler(&ToTheDaemonLog); }

}  // namespace optstate
