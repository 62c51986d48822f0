#include "server/rpc/protobuf_log.h"

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/logging.h"
#include "server/base/log.h"
#include "server/base/log_limiter.h"

namespace optstate {
namespace {

LogLimiter limiter;

void ToTheDaemonLog(google::protobuf::LogLevel level, const char* file, int line,
                    const std::string& message) {
  const std::optional<uint64_t> taken = limiter.Take();
  if (!taken.has_value()) return;
  const uint64_t dropped = *taken;
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
