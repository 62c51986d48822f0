// Gives the heap's free memory back to the system (malloc_trim) on a thread
// of its own: soon after memory was freed in bulk, and every few seconds.
#ifndef OPTSTATE_SERVER_BASE_HEAP_TRIMMER_H_
#define OPTSTATE_SERVER_BASE_HEAP_TRIMMER_H_

#include <cstdint>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace optstate {

// Thread-safe. glibc keeps freed memory in its arenas (optstated raises the
// trim threshold so chunk buffers are reused without page faults), so a
// daemon whose groups and streams come and go would keep its peak. A trim
// costs a walk of the free lists and, later, one page fault per page reused.
class HeapTrimmer {
 public:
  // Trims every `period` (zero or infinite: only when asked), and at most
  // once per `min_gap` when asked.
  explicit HeapTrimmer(absl::Duration period, absl::Duration min_gap = absl::Milliseconds(100));
  ~HeapTrimmer();

  // Asks for a trim soon (after a group was deleted, say); returns at once.
  void RequestTrim() ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t trims() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration period_;
  const absl::Duration min_gap_;
  mutable absl::Mutex mu_;
  bool requested_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t trims_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BASE_HEAP_TRIMMER_H_
