// Gives the heap's free memory back to the system (malloc_trim) on a thread
// of its own: soon after memory was freed in bulk, and when a periodic look
// at the heap shows it grew or its use fell (HeapTrimPolicy).
#ifndef OPTSTATE_SERVER_BASE_HEAP_TRIMMER_H_
#define OPTSTATE_SERVER_BASE_HEAP_TRIMMER_H_

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace optstate {

// What the allocator says of its heap (glibc: mallinfo2's arena and
// uordblks, all arenas together).
struct HeapReading {
  uint64_t system_bytes = 0;  // Taken from the system for the heap.
  uint64_t in_use_bytes = 0;  // Handed out and not yet freed.
};

// When a periodic look trims. A trim gives back every free page of the heap
// at that moment, so trimming on a clock under steady load gives back the
// buffers that happen to be free and faults them in again a moment later:
// RSS then dips and climbs with the instant's load (bench/rss-soak: -12%
// one second, back the next). A trim is due only when
// - the heap took more than `slack` from the system since the last trim
//   (load grew, or the heap fragments: what a trim can give back grew), or
// - its use fell by more than max(slack, a quarter of its highest reading
//   since the last trim) from that reading (load fell: the memory freed is
//   not about to be reused).
// So the heap grows past its size at the last trim + slack for at most one
// period before it is trimmed, memory freed by such a fall in use goes back
// within one period, and steady load is never trimmed. Not thread-safe: one
// trimmer thread owns it.
class HeapTrimPolicy {
 public:
  explicit HeapTrimPolicy(uint64_t slack_bytes) : slack_(slack_bytes) {}

  // A trim happened; `after` is the heap read just after it.
  void Trimmed(const HeapReading& after);
  // Whether the heap as read now calls for a trim (and notes its use).
  bool Due(const HeapReading& now);

 private:
  const uint64_t slack_;
  uint64_t system_at_trim_ = 0;
  uint64_t peak_in_use_ = 0;
};

// The heap of this process as glibc reports it (all zero under
// AddressSanitizer, whose allocator replaces glibc's: only requested trims
// happen there).
HeapReading ReadHeap();

// Thread-safe. glibc keeps freed memory in its arenas (optstated raises the
// trim threshold so chunk buffers are reused without page faults), so a
// daemon whose groups and streams come and go would keep its peak. A trim
// costs a walk of the free lists and, later, one page fault per page reused.
class HeapTrimmer {
 public:
  // Looks at the heap every `period` (zero or infinite: never; trims only
  // when asked) and trims when HeapTrimPolicy(slack_bytes) says so; trims
  // when asked, at most once per `min_gap`. `read_heap` and `trim` stand in
  // for ReadHeap and malloc_trim(0) in tests.
  HeapTrimmer(absl::Duration period, uint64_t slack_bytes,
              absl::Duration min_gap = absl::Milliseconds(100),
              std::function<HeapReading()> read_heap = ReadHeap,
              std::function<void()> trim = nullptr);
  ~HeapTrimmer();

  // Asks for a trim soon (after a group was deleted, say); returns at once.
  void RequestTrim() ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t trims() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration period_;
  const absl::Duration min_gap_;
  const std::function<HeapReading()> read_heap_;
  const std::function<void()> trim_;
  HeapTrimPolicy policy_;  // Only the trimmer thread uses it.
  mutable absl::Mutex mu_;
  bool requested_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t trims_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BASE_HEAP_TRIMMER_H_
