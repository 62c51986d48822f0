// Leveled logging to stderr.
#include "server/base/log.h"

#include <atomic>
#include <cstdio>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace optstate {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
}  // namespace

bool ParseLogLevel(absl::string_view text, LogLevel* level) {
  if (text == "debug")
    *level = LogLevel::kDebug;
  else if (text == "info")
    *level = LogLevel::kInfo;
  else if (text == "warning")
    *level = LogLevel::kWarning;
  else if (text == "error")
    *level = LogLevel::kError;
  else
    return false;
  return true;
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void LogLine(LogLevel level, absl::string_view message) {
  static const char* const kNames[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
  std::string line =
      absl::StrCat(kNames[static_cast<int>(level)], " ",
                   absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
                   " optstated: ", message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace optstate
