// Step-latency bookkeeping for GroupCounters, and their totals.
#include "server/state/group_counters.h"

namespace optstate {

void GroupCounters::PagesApplied(uint64_t step, uint64_t pages, uint64_t total_pages,
                                 absl::Time started) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = steps_in_progress_.try_emplace(step);
  if (inserted) it->second.first_chunk_started = started;
  it->second.pages_done += pages;
  if (it->second.pages_done >= total_pages) {
    step_latency.Record(absl::ToDoubleMicroseconds(absl::Now() - it->second.first_chunk_started));
    steps_completed.fetch_add(1, std::memory_order_relaxed);
    steps_in_progress_.erase(it);
  }
  // A step abandoned by its trainer must not grow the map for ever.
  while (steps_in_progress_.size() > 64) steps_in_progress_.erase(steps_in_progress_.begin());
}

void CounterTotals::Add(const GroupCounters& c) {
  chunks_applied += c.chunks_applied.load(std::memory_order_relaxed);
  chunks_replayed += c.chunks_replayed.load(std::memory_order_relaxed);
  steps_completed += c.steps_completed.load(std::memory_order_relaxed);
  bytes_received += c.bytes_received.load(std::memory_order_relaxed);
  bytes_sent += c.bytes_sent.load(std::memory_order_relaxed);
  page_ins += c.paging.page_ins.load(std::memory_order_relaxed);
  page_outs += c.paging.page_outs.load(std::memory_order_relaxed);
  bytes_host_to_device += c.paging.bytes_host_to_device.load(std::memory_order_relaxed);
  bytes_device_to_host += c.paging.bytes_device_to_host.load(std::memory_order_relaxed);
  copy_wait_us += c.paging.copy_wait_us.load(std::memory_order_relaxed);
}

void CounterTotals::Add(const CounterTotals& o) {
  chunks_applied += o.chunks_applied;
  chunks_replayed += o.chunks_replayed;
  steps_completed += o.steps_completed;
  bytes_received += o.bytes_received;
  bytes_sent += o.bytes_sent;
  page_ins += o.page_ins;
  page_outs += o.page_outs;
  bytes_host_to_device += o.bytes_host_to_device;
  bytes_device_to_host += o.bytes_device_to_host;
  copy_wait_us += o.copy_wait_us;
}

}  // namespace optstate
