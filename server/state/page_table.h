// Per-page bookkeeping of exactly-once stepping: each page's mutex, the step
// it has reached, and whether its initial values have arrived.
#ifndef OPTSTATE_SERVER_STATE_PAGE_TABLE_H_
#define OPTSTATE_SERVER_STATE_PAGE_TABLE_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/synchronization/mutex.h"

namespace optstate {

// Thread-safety: a page's step and values flag may be changed only while
// holding mutex(page); they, MinStep, MaxStep and PagesAwaitingValues may be
// read without it.
class PageTable {
 public:
  // `num_pages` pages at step 0; all awaiting values when
  // `awaiting_values`, else all holding them.
  PageTable(uint64_t num_pages, bool awaiting_values);

  PageTable(const PageTable&) = delete;
  PageTable& operator=(const PageTable&) = delete;

  uint64_t num_pages() const { return num_pages_; }
  absl::Mutex& mutex(uint64_t page) const { return mutexes_[page]; }

  uint64_t step(uint64_t page) const { return steps_[page].load(std::memory_order_acquire); }
  // Requires mutex(page).
  void set_step(uint64_t page, uint64_t step) {
    steps_[page].store(step, std::memory_order_release);
  }
  bool has_values(uint64_t page) const { return has_values_[page].load(std::memory_order_acquire); }
  // Requires mutex(page).
  void mark_has_values(uint64_t page);

  // The lowest and highest step any page has reached (0 without pages).
  uint64_t MinStep() const;
  uint64_t MaxStep() const;
  uint64_t PagesAwaitingValues() const {
    return pages_awaiting_values_.load(std::memory_order_acquire);
  }

 private:
  const uint64_t num_pages_;
  std::unique_ptr<absl::Mutex[]> mutexes_;
  std::unique_ptr<std::atomic<uint64_t>[]> steps_;
  std::unique_ptr<std::atomic<bool>[]> has_values_;
  std::atomic<uint64_t> pages_awaiting_values_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_STATE_PAGE_TABLE_H_
