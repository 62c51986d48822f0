// A child process the benchmark starts (optstated, or its own echo server):
// spawn, learn the port it prints, read its CPU time and resident memory,
// stop it with SIGTERM.
#ifndef OPTSTATE_BENCH_CHILD_PROCESS_H_
#define OPTSTATE_BENCH_CHILD_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace optstate::bench {

// Not thread-safe; owned by one thread.
class ChildProcess {
 public:
  // Starts argv[0] with `argv` and waits (up to 30 s) for a stdout line
  // containing "listening on port N". UNAVAILABLE if it exits first.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const std::vector<std::string>& argv);
  // Sends SIGTERM and waits for the exit.
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  int port() const { return port_; }

 private:
  ChildProcess(pid_t pid, int port) : pid_(pid), port_(port) {}
  pid_t pid_;
  int port_;
};

// User plus system CPU seconds `pid` has used so far (all its threads).
double ProcessCpuSeconds(pid_t pid);
// Resident set size of `pid` in bytes (VmRSS).
uint64_t ProcessResidentBytes(pid_t pid);

// Directory holding the running executable (to find optstated next to it).
std::string ExecutableDir();

}  // namespace optstate::bench

#endif  // OPTSTATE_BENCH_CHILD_PROCESS_H_
