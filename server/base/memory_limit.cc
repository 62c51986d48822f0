#include "server/base/memory_limit.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace optstate {
namespace {

// v1 writes "no limit" as LONG_MAX rounded down to a page; anything this
// large is none.
constexpr uint64_t kUnlimitedFrom = 1ull << 62;

// The limit in `file`, or kNoMemoryLimit.
uint64_t ReadLimit(const std::string& file) {
  std::ifstream in(file);
  if (!in) return kNoMemoryLimit;
  std::stringstream text;
  text << in.rdbuf();
  uint64_t bytes = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text.str()), &bytes) ||
      bytes >= kUnlimitedFrom) {
    return kNoMemoryLimit;  // "max", or no limit
  }
  return bytes;
}

// The lowest limit of `file_name` in `dir` + `path` and each of its
// ancestors up to `dir` itself.
uint64_t LowestAlong(const std::string& dir, absl::string_view path, const char* file_name) {
  uint64_t lowest = kNoMemoryLimit;
  std::string at(absl::StripSuffix(path, "/"));
  while (true) {
    lowest = std::min(lowest, ReadLimit(dir + at + "/" + file_name));
    if (at.empty()) break;
    at.resize(at.rfind('/') == std::string::npos ? 0 : at.rfind('/'));
  }
  return lowest;
}

}  // namespace

uint64_t CgroupMemoryLimit(const std::string& proc_self_cgroup, const std::string& cgroup_root) {
  uint64_t lowest = kNoMemoryLimit;
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n', absl::SkipEmpty())) {
    // ID:CONTROLLERS:PATH (the path may hold ':').
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3 || fields[2].empty() || fields[2][0] != '/') continue;
    if (fields[0] == "0" && fields[1].empty()) {
      lowest = std::min(lowest, LowestAlong(cgroup_root, fields[2], "memory.max"));
      continue;
    }
    for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
      if (controller == "memory") {
        lowest = std::min(lowest,
                          LowestAlong(cgroup_root + "/memory", fields[2], "memory.limit_in_bytes"));
      }
    }
  }
  return lowest;
}

uint64_t MemoryThisProcessMayUse() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  uint64_t host = pages > 0 && page_size > 0
                      ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size)
                      : kNoMemoryLimit;
  std::ifstream in("/proc/self/cgroup");
  std::stringstream text;
  if (in) text << in.rdbuf();
  const uint64_t limit = std::min(host, CgroupMemoryLimit(text.str(), "/sys/fs/cgroup"));
  return limit == kNoMemoryLimit ? 0 : limit;
}

}  // namespace optstate
