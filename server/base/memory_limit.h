// How much memory this process may use: the host's, or its cgroup's limit (a
// container's --memory, a pod's limits.memory) where that is lower.
#ifndef OPTSTATE_SERVER_BASE_MEMORY_LIMIT_H_
#define OPTSTATE_SERVER_BASE_MEMORY_LIMIT_H_

#include <cstdint>
#include <string>

namespace optstate {

inline constexpr uint64_t kNoMemoryLimit = UINT64_MAX;

// The lowest memory limit of the cgroups this process is in and their
// ancestors, as `proc_self_cgroup` (the text of /proc/self/cgroup) names
// them under `cgroup_root` (/sys/fs/cgroup): cgroup v2's memory.max, v1's
// memory controller's memory.limit_in_bytes. kNoMemoryLimit where none is
// set ("max", v1's page-rounded LONG_MAX) or none can be read.
uint64_t CgroupMemoryLimit(const std::string& proc_self_cgroup, const std::string& cgroup_root);

// The host's physical memory, or this process's cgroup memory limit where
// lower; 0 when neither is known.
uint64_t MemoryThisProcessMayUse();

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BASE_MEMORY_LIMIT_H_
