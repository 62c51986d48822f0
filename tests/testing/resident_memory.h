// A process's resident memory, read from /proc: what the memory tests hold
// the daemon to.
#ifndef OPTSTATE_TESTS_TESTING_RESIDENT_MEMORY_H_
#define OPTSTATE_TESTS_TESTING_RESIDENT_MEMORY_H_

#include <sys/types.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace optstate::testing {

// VmRSS of `pid` in bytes, or 0 if it cannot be read.
inline uint64_t ResidentBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_TESTING_RESIDENT_MEMORY_H_
