// fork/exec of optstated, reading its "listening on port N" line.
#include "tests/testing/daemon_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/testing/daemon_logs.h"

namespace optstate::testing {

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(
    const std::vector<std::string>& flags, const std::string& stderr_path) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return absl::InternalError("pipe failed");
  const bool own_log = stderr_path.empty() && !DaemonLogDir().empty();
  const std::string log_path = own_log ? NewDaemonLogPath() : stderr_path;
  if (own_log) std::fprintf(stderr, "optstated log: %s\n", log_path.c_str());
  std::vector<std::string> args = {OPTSTATED_PATH, "--listen=127.0.0.1:0", "--log_level=warning"};
  args.insert(args.end(), flags.begin(), flags.end());
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    if (!log_path.empty()) {
      const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
      if (log >= 0) dup2(log, STDERR_FILENO);
    }
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  std::string out;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  const std::string marker = "optstated listening on port ";
  while (absl::Now() < deadline) {
    pollfd pfd{pipe_fds[0], POLLIN, 0};
    if (poll(&pfd, 1, 100) <= 0) continue;
    char buffer[256];
    ssize_t n = read(pipe_fds[0], buffer, sizeof(buffer));
    if (n <= 0) break;
    out.append(buffer, n);
    size_t at = out.find(marker);
    size_t end = at == std::string::npos ? at : out.find('\n', at);
    if (end != std::string::npos) {
      int port = std::atoi(out.c_str() + at + marker.size());
      return std::unique_ptr<DaemonProcess>(
          new DaemonProcess(pid, pipe_fds[0], port, log_path, own_log));
    }
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  close(pipe_fds[0]);
  if (!own_log) KeepDaemonLog(log_path);
  return absl::UnavailableError(absl::StrCat("optstated did not report its port; stdout: ", out));
}

absl::StatusOr<int> DaemonProcess::Stop(int timeout_seconds) {
  if (pid_ <= 0) return absl::FailedPreconditionError("already stopped");
  kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + absl::Seconds(timeout_seconds);
  int status = 0;
  while (absl::Now() < deadline) {
    pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      pid_ = -1;
      close(stdout_fd_);
      const int exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      AfterExit(exit_code);
      return exit_code;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError("optstated did not exit after SIGTERM");
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    // Killed, it could not remove its default region socket file.
    unlink(("/tmp/optstated-" + std::to_string(port_) + ".regions").c_str());
    close(stdout_fd_);
    AfterExit(0);
  }
}

void DaemonProcess::AfterExit(int exit_code) {
  if (!own_log_) {
    KeepDaemonLog(log_path_);
    return;
  }
  if (exit_code == 0) return;
  std::ifstream in(log_path_);
  std::ostringstream text;
  text << in.rdbuf();
  const std::string log = text.str();
  constexpr size_t kTail = 4096;
  std::fprintf(stderr, "optstated exited %d; the end of %s:\n%s\n", exit_code, log_path_.c_str(),
               log.substr(log.size() > kTail ? log.size() - kTail : 0).c_str());
}

}  // namespace optstate::testing
