// Runs a real optstated process on a free loopback port for a test, and
// stops it with SIGTERM, reporting how it exited.
#ifndef OPTSTATE_TESTS_TESTING_DAEMON_PROCESS_H_
#define OPTSTATE_TESTS_TESTING_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace optstate::testing {

class DaemonProcess {
 public:
  // Starts optstated with --listen=127.0.0.1:0 plus `flags`, and waits (up to
  // 20 s) for it to print its port. `stderr_path` non-empty: the daemon's log
  // (stderr) is appended to that file, and copied into DaemonLogDir() when the
  // daemon is stopped; empty: the log goes to a file of its own in
  // DaemonLogDir() (tests/testing/daemon_logs.h), whose path is printed and
  // whose tail is printed if the daemon exits non-zero, or, without that
  // folder, to the test's stderr.
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(
      const std::vector<std::string>& flags = {}, const std::string& stderr_path = "");
  // Kills the process if it is still running.
  ~DaemonProcess();

  int port() const { return port_; }
  pid_t pid() const { return pid_; }  // Of the optstated process (-1 once stopped).
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }

  // Sends SIGTERM and waits; returns the exit code (128+signal if killed by
  // one), or an error if it did not exit within `timeout_seconds`.
  absl::StatusOr<int> Stop(int timeout_seconds = 30);

 private:
  DaemonProcess(pid_t pid, int stdout_fd, int port, std::string log_path, bool own_log)
      : pid_(pid), stdout_fd_(stdout_fd), port_(port), log_path_(std::move(log_path)),
        own_log_(own_log) {}
  // Copies or reports the log once the process is gone (see Start).
  void AfterExit(int exit_code);
  pid_t pid_;
  int stdout_fd_;
  int port_;
  std::string log_path_;  // "" when the log goes to the test's stderr.
  bool own_log_;          // log_path_ is a file in DaemonLogDir() of this daemon's own.
};

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_TESTING_DAEMON_PROCESS_H_
