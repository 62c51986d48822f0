// Per-page steps and values flags.
#include "server/state/page_table.h"

#include <algorithm>

namespace optstate {

PageTable::PageTable(uint64_t num_pages, bool awaiting_values)
    : num_pages_(num_pages),
      mutexes_(new absl::Mutex[num_pages]),
      steps_(new std::atomic<uint64_t>[num_pages]),
      has_values_(new std::atomic<bool>[num_pages]),
      pages_awaiting_values_(awaiting_values ? num_pages : 0) {
  for (uint64_t i = 0; i < num_pages_; ++i) {
    steps_[i].store(0, std::memory_order_relaxed);
    has_values_[i].store(!awaiting_values, std::memory_order_relaxed);
  }
}

void PageTable::mark_has_values(uint64_t page) {
  if (!has_values_[page].exchange(true, std::memory_order_acq_rel)) {
    pages_awaiting_values_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

uint64_t PageTable::MinStep() const {
  uint64_t min = UINT64_MAX;
  for (uint64_t i = 0; i < num_pages_; ++i) min = std::min(min, step(i));
  return num_pages_ == 0 ? 0 : min;
}

uint64_t PageTable::MaxStep() const {
  uint64_t max = 0;
  for (uint64_t i = 0; i < num_pages_; ++i) max = std::max(max, step(i));
  return max;
}

}  // namespace optstate
