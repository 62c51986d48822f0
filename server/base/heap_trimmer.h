// Gives the heap's free memory back to the system (malloc_trim) on a thread
// of its own: soon after memory was freed in bulk, once the daemon's load has
// ended, and when a periodic look at the heap shows it grew or its use fell
// (HeapTrimPolicy).
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
  // Held free: resident until a trim gives it back, unless a trim already
  // did (the allocator cannot tell which).
  uint64_t free_bytes() const {
    return system_bytes > in_use_bytes ? system_bytes - in_use_bytes : 0;
  }
};

// When a periodic look trims. A trim gives back every free page of the heap
// at that moment, so trimming on a clock under steady load gives back the
// buffers that happen to be free and faults them in again a moment later:
// RSS then dips and climbs with the instant's load (bench/rss-soak: -12%
// one second, back the next). While the daemon serves streams a trim is due
// only when
// - the heap took more than `slack` from the system since the last trim
//   (load grew, or the heap fragments: what a trim can give back grew), or
// - its use fell by more than max(slack, a quarter of its highest reading
//   since the last trim) from that reading (load fell: the memory freed is
//   not about to be reused).
// So the heap grows past its size at the last trim + slack for at most one
// period before it is trimmed, memory freed by such a fall in use goes back
// within one period, and steady load is never trimmed. What falls short of
// those thresholds (a load that ends just after a trim, memory reused and
// freed between two looks) is for HeapTrimmer's trims once the daemon is idle.
// Not thread-safe: one trimmer thread owns it.
class HeapTrimPolicy {
 public:
  explicit HeapTrimPolicy(uint64_t slack_bytes) : slack_(slack_bytes) {}

  // A trim happened; `after` is the heap read just after it.
  void Trimmed(const HeapReading& after);
  // Whether the heap as read now calls for a trim (and notes its use).
  bool Due(const HeapReading& now);
  // Whether the heap holds more than slack / 16 of free memory beyond what
  // it held free just after the last trim: memory freed since, resident. A
  // look trims on this only when nothing is about to reuse it (no stream open).
  bool FreedSinceTrim(const HeapReading& now) const;

 private:
  const uint64_t slack_;
  uint64_t system_at_trim_ = 0;
  uint64_t free_at_trim_ = 0;
  uint64_t peak_in_use_ = 0;
};

// The heap of this process as glibc reports it (all zero under
// AddressSanitizer, whose allocator replaces glibc's: only requested trims
// happen there).
HeapReading ReadHeap();

// Bytes of the heap's main arena (the `[heap]` mapping: the whole heap with
// optstated's default --malloc_arenas=1) resident in memory now: what is in
// use plus the free memory not yet given back. 0 when /proc/self/maps cannot
// be read. Costs a read of /proc/self/maps and a mincore() over the arena.
uint64_t ReadHeapResidentBytes();

// Thread-safe. glibc keeps freed memory in its arenas (optstated raises the
// trim threshold so chunk buffers are reused without page faults), so a
// daemon whose groups and streams come and go would keep its peak. A trim
// costs a walk of the free lists and, later, one page fault per page reused.
//
// Trims happen
// 1. when asked (RequestTrim: a group was deleted), at most once per min_gap;
// 2. at a look every period, when HeapTrimPolicy::Due says so, or, while the
//    daemon is idle (SetIdle), when the heap freed memory since the last trim
//    (FreedSinceTrim);
// 3. once the daemon has been idle for half a period (a settle trim) after it
//    served streams since the last trim (always: the load's buffers, however
//    its frees raced the trims above), or after a requested trim (when the
//    heap freed memory since: connections and streams closing after the
//    deletes).
// So, with a period, what a load left in the heap is given back within a
// period of the moment its last stream ended or its last group was deleted,
// every time; a daemon that always has a stream open is trimmed by 1 and 2
// only.
class HeapTrimmer {
 public:
  // Looks at the heap every `period` (zero or infinite: never, and no settle
  // trims either; trims only when asked) and trims when HeapTrimPolicy(slack_bytes)
  // says so; trims when asked, at most once per `min_gap`. `read_heap` and
  // `trim` stand in for ReadHeap and malloc_trim(0) in tests.
  HeapTrimmer(absl::Duration period, uint64_t slack_bytes,
              absl::Duration min_gap = absl::Milliseconds(100),
              std::function<HeapReading()> read_heap = ReadHeap,
              std::function<void()> trim = nullptr);
  ~HeapTrimmer();

  // Asks for a trim soon (after a group was deleted, say); returns at once.
  void RequestTrim() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the daemon is idle: nothing in hand that is about to reuse the
  // memory it frees (no open stream; StreamRegistry says). The daemon starts
  // idle. Cheap (a lock, and a wake of the trimmer thread at most twice per
  // half period); call on every change.
  void SetIdle(bool idle) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t trims() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class Cause { kRequested, kSettle, kLook };
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for the next thing to do; false when stopping.
  bool WaitForCause(Cause* cause, bool* idle, bool* busy_since_trim) ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration period_;
  const bool periodic_;
  const absl::Duration settle_;  // Idle this long before a settle trim: period / 2.
  const absl::Duration min_gap_;
  const std::function<HeapReading()> read_heap_;
  const std::function<void()> trim_;
  HeapTrimPolicy policy_;  // Only the trimmer thread uses it.
  mutable absl::Mutex mu_;
  bool requested_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t trims_ ABSL_GUARDED_BY(mu_) = 0;
  bool idle_ ABSL_GUARDED_BY(mu_) = true;
  // A stream was open at some moment since the last trim.
  bool busy_since_trim_ ABSL_GUARDED_BY(mu_) = false;
  // A settle trim is to be considered at settle_at_, if the daemon is idle
  // then; armed once the trimmer thread waits for it.
  bool settle_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool settle_armed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time settle_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time next_look_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BASE_HEAP_TRIMMER_H_
