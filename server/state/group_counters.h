// What a group has done: chunks, bytes, paging traffic and latencies. Plain
// numbers that GetStats reports; nothing here affects the optimizer math.
#ifndef OPTSTATE_SERVER_STATE_GROUP_COUNTERS_H_
#define OPTSTATE_SERVER_STATE_GROUP_COUNTERS_H_

#include <atomic>
#include <cstdint>
#include <map>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/base/latency_recorder.h"

namespace optstate {

// Host<->device traffic of a backend; all zero on the CPU backend.
struct PagingCounters {
  std::atomic<uint64_t> page_ins{0};
  std::atomic<uint64_t> page_outs{0};
  std::atomic<uint64_t> bytes_host_to_device{0};
  std::atomic<uint64_t> bytes_device_to_host{0};
  std::atomic<uint64_t> copy_wait_us{0};
};

// Thread-safe.
class GroupCounters {
 public:
  std::atomic<uint64_t> chunks_applied{0};
  std::atomic<uint64_t> chunks_replayed{0};
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> bytes_sent{0};
  // Steps of which every page has been applied (as step_latency counts them).
  std::atomic<uint64_t> steps_completed{0};
  PagingCounters paging;
  LatencyRecorder chunk_latency;
  LatencyRecorder step_latency;

  // Step latency runs from the first page of a step being applied to the
  // last one. Call when `pages` pages have just been applied for `step` of a
  // group of `total_pages` pages; `started` is when that chunk began.
  void PagesApplied(uint64_t step, uint64_t pages, uint64_t total_pages, absl::Time started);

 private:
  struct StepProgress {
    absl::Time first_chunk_started;
    uint64_t pages_done = 0;
  };
  absl::Mutex mu_;
  std::map<uint64_t, StepProgress> steps_in_progress_ ABSL_GUARDED_BY(mu_);
};

// The counters of many groups added up (of the groups there are, and of those
// deleted: StateStore::CounterTotals). Plain numbers, a snapshot.
struct CounterTotals {
  uint64_t chunks_applied = 0;
  uint64_t chunks_replayed = 0;
  uint64_t steps_completed = 0;
  uint64_t bytes_received = 0;
  uint64_t bytes_sent = 0;
  uint64_t page_ins = 0;
  uint64_t page_outs = 0;
  uint64_t bytes_host_to_device = 0;
  uint64_t bytes_device_to_host = 0;
  uint64_t copy_wait_us = 0;

  void Add(const GroupCounters& counters);
  void Add(const CounterTotals& other);
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_STATE_GROUP_COUNTERS_H_
