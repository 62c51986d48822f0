// Minimal leveled logging to stderr: "LEVEL time message". Abseil 20220623
// has no logging library; this is all the daemon needs.
#ifndef OPTSTATE_SERVER_BASE_LOG_H_
#define OPTSTATE_SERVER_BASE_LOG_H_

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace optstate {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// "debug", "info", "warning" or "error"; false for anything else.
bool ParseLogLevel(absl::string_view text, LogLevel* level);
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, absl::string_view message);

template <typename... Args>
void Log(LogLevel level, const Args&... args) {
  if (LogEnabled(level)) LogLine(level, absl::StrCat(args...));
}

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BASE_LOG_H_
