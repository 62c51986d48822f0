// fork/exec with a pipe on the child's stdout; /proc for CPU time and RSS.
#include "bench/child_process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace optstate::bench {

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv) {
  int out[2];
  if (pipe(out) != 0) return absl::InternalError("pipe failed");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    // Ends with the benchmark even when it exits without stopping its
    // children (a failed check calls exit), or has already exited.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    execv(args[0], args.data());
    std::fprintf(stderr, "cannot exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(out[1]);
  // Read lines until the port line; the rest of its output is left unread
  // (it prints nothing else on stdout).
  FILE* stream = fdopen(out[0], "r");
  char line[512];
  int port = 0;
  while (port == 0 && std::fgets(line, sizeof(line), stream) != nullptr) {
    if (const char* at = std::strstr(line, "listening on port ")) {
      port = std::atoi(at + std::strlen("listening on port "));
    }
  }
  // Keep the pipe open (a closed pipe would SIGPIPE a later printf); it
  // closes when this process exits.
  if (port == 0) {
    int status = 0;
    waitpid(pid, &status, 0);
    return absl::UnavailableError(absl::StrCat(argv[0], " exited before printing its port"));
  }
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, port));
}

ChildProcess::~ChildProcess() {
  kill(pid_, SIGTERM);
  int status = 0;
  for (int i = 0; i < 300; ++i) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
}

double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces) start past ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

uint64_t ProcessResidentBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      return std::stoull(line.substr(6)) * 1024;  // Reported in kB.
    }
  }
  return 0;
}

std::string ExecutableDir() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return ".";
  std::string exe(path, static_cast<size_t>(n));
  return exe.substr(0, exe.rfind('/'));
}

}  // namespace optstate::bench
