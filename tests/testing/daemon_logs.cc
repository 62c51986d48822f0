// Files under $OPTSTATE_TEST_DAEMON_LOGS: "<test pid>-daemon-<n>.log" for the
// logs DaemonProcess chose, "<test pid>-kept-<hash of path>.log" for copies of
// the logs a test chose, "<test pid>.secrets" (one token per line).
#include "tests/testing/daemon_logs.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace optstate::testing {

std::string DaemonLogDir() {
  const char* dir = std::getenv("OPTSTATE_TEST_DAEMON_LOGS");
  return dir == nullptr ? "" : dir;
}

std::string NewDaemonLogPath() {
  static std::atomic<int> next{0};
  const std::string dir = DaemonLogDir();
  if (dir.empty()) return "";
  return absl::StrCat(dir, "/", getpid(), "-daemon-", next++, ".log");
}

void KeepDaemonLog(const std::string& path) {
  const std::string dir = DaemonLogDir();
  if (dir.empty() || path.empty()) return;
  std::ifstream in(path, std::ios::binary);
  if (!in) return;
  std::ostringstream text;
  text << in.rdbuf();
  std::ofstream out(absl::StrCat(dir, "/", getpid(), "-kept-", std::hash<std::string>{}(path),
                                 ".log"),
                    std::ios::binary | std::ios::trunc);
  out << text.str();
}

void RecordTestSecrets(const std::vector<std::string>& tokens) {
  const std::string dir = DaemonLogDir();
  if (dir.empty()) return;
  std::ofstream out(absl::StrCat(dir, "/", getpid(), ".secrets"), std::ios::app);
  for (const std::string& token : tokens) out << token << "\n";
}

}  // namespace optstate::testing
