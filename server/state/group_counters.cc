// Step-latency bookkeeping for GroupCounters.
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
    steps_in_progress_.erase(it);
  }
  // A step abandoned by its trainer must not grow the map for ever.
  while (steps_in_progress_.size() > 64) steps_in_progress_.erase(steps_in_progress_.begin());
}

}  // namespace optstate
