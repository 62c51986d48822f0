// The daemon's counters as Client::GetStats returns them: totals over the
// caller's groups, the backend's device figures, and each group's own.
#ifndef OPTSTATE_STATS_H_
#define OPTSTATE_STATS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "optstate/group_info.h"

namespace optstate {

// Percentiles of a latency over the samples the daemon keeps.
struct LatencyPercentiles {
  double p50_us = 0;
  double p99_us = 0;
  uint64_t samples = 0;  // Measurements taken.
};

// Traffic between host and device of a paging (CUDA) backend; zero on the CPU backend.
struct PagingCounters {
  uint64_t page_ins = 0;
  uint64_t page_outs = 0;
  uint64_t bytes_host_to_device = 0;
  uint64_t bytes_device_to_host = 0;
  uint64_t copy_wait_us = 0;  // Time steps waited on copies.
};

struct GroupStats {
  GroupInfo info;                // `created` is false here.
  uint64_t steps_completed = 0;  // Steps every page has reached (equals info.min_step).
  uint64_t chunks_applied = 0;
  uint64_t chunks_replayed = 0;      // Chunks whose pages were already at their step.
  uint64_t bytes_received = 0;       // Initial values and gradients.
  uint64_t bytes_sent = 0;           // Params in replies.
  LatencyPercentiles step_latency;   // First chunk of a step to its last page.
  LatencyPercentiles chunk_latency;  // Server time to apply one chunk.
  PagingCounters paging;
};

// The backend's device: its VRAM budget, what is resident, the staging pool.
struct DeviceStats {
  std::string strategy;  // "host" on the CPU backend; the paging strategy on CUDA.
  uint64_t budget_total_bytes = 0;
  uint64_t budget_reserved_bytes = 0;
  double budget_target_utilization = 0;
  uint64_t budget_available_bytes = 0;
  uint64_t resident_bytes = 0;
  uint64_t staging_pool_bytes = 0;
  uint64_t staging_slots = 0;
};

// A checkpoint the daemon wrote (docs/durability.md).
struct CheckpointInfo {
  std::string id;
  uint64_t step = 0;  // Every page of every group it holds is at this step.
  uint64_t bytes = 0;
  double duration_seconds = 0;
  int64_t finished_unix_micros = 0;  // When it became durable.
};

// The daemon's shared-memory regions (same-host data plane), daemon-wide: all
// clients and tenants. Zero when it offers no region socket.
struct RegionStats {
  uint64_t sessions = 0;          // Region socket connections open now.
  uint64_t regions = 0;           // Regions registered now.
  uint64_t registered_bytes = 0;  // Their bytes.
  uint64_t mapped_bytes = 0;      // Mapped now: registered, or unregistered but used by a step.
  uint64_t registrations = 0;     // Regions registered since the daemon started.
  uint64_t step_plans = 0;        // Step plans kept now (steps wholly in SharedBuffers).
  uint64_t step_plan_uses = 0;    // Steps that named a kept plan, since the daemon started.
};

// The daemon process's malloc heap, daemon-wide (GetStatsResponse's heap_*
// fields). Free memory still resident, which a trim would give back, is
// about resident_bytes - in_use_bytes.
struct HeapStats {
  uint64_t in_use_bytes = 0;    // Handed out and not yet freed.
  uint64_t free_bytes = 0;      // Held free: resident, or already given back by a trim.
  uint64_t resident_bytes = 0;  // Of the main arena (all of it with --malloc_arenas=1) in memory.
  uint64_t trims = 0;           // Trims since the daemon started.
};

// One daemon of a client of several (docs/scale-out.md).
struct MemberStats {
  std::string identity;  // What placement hashes.
  std::string target;    // Where the client connects.
  double weight = 1.0;
  uint64_t num_groups = 0;  // The caller's groups it holds...
  uint64_t total_elements = 0;
  uint64_t host_bytes = 0;  // ...and its daemon-wide host memory and limit.
  uint64_t max_host_bytes = 0;
  int64_t started_unix_micros = 0;  // When its daemon started (a restart changes it).
  bool has_state_dir = false;
  std::string instance_id;  // Its daemon process's (Stats::instance_id).
};

struct Stats {
  std::string backend;      // "cpu" or "cuda".
  uint64_t num_groups = 0;  // The caller's groups; the counters below sum over them...
  uint64_t total_elements = 0;
  uint64_t host_bytes = 0;      // ...but these two are the daemon's: host memory all
  uint64_t max_host_bytes = 0;  // groups' state takes, and the most it may take.
  uint64_t chunks_applied = 0;
  uint64_t chunks_replayed = 0;
  uint64_t bytes_received = 0;
  uint64_t bytes_sent = 0;
  PagingCounters paging;
  DeviceStats device;
  std::vector<GroupStats> groups;
  uint32_t threads = 0;    // Of the daemon's step thread pool.
  std::string cpu_kernel;  // The CPU kernel's path: "avx512", "avx2" or "scalar".
  // Durability: unset, zero or empty without --state_dir.
  std::optional<CheckpointInfo> last_checkpoint;  // The newest this daemon wrote.
  uint64_t checkpoints_written = 0;
  uint64_t checkpoint_failures = 0;           // Checkpoints attempted that were not written.
  std::string last_checkpoint_error;          // Why the last failed one failed.
  std::string restored_checkpoint_id;         // Restored at start; "" if none.
  std::vector<std::string> restore_refusals;  // Refused at start, each naming file and fault.
  RegionStats regions;                        // Shared-memory regions, daemon-wide.
  HeapStats heap;                             // The daemon's malloc heap.
  // The daemon process: when it started, whether it keeps checkpoints
  // (--state_dir), how many of this tenant's groups it restored at start
  // (every tenant's for an admin), its --lease_seconds.
  int64_t started_unix_micros = 0;
  bool has_state_dir = false;
  uint64_t restored_groups = 0;
  int64_t lease_seconds = 0;
  // Random per daemon process: two targets answering with the same one reach
  // one daemon. Empty from a daemon that predates it.
  std::string instance_id;
  // A client of several daemons: one entry per daemon, and the totals above
  // summed over them (host_bytes and max_host_bytes too; the daemon facts
  // after `threads` are the first daemon's). Empty from a client of one.
  std::vector<MemberStats> members;
};

}  // namespace optstate

#endif  // OPTSTATE_STATS_H_
