// One thread: wait for a request, the end of the daemon's load or the
// period; trim when asked, once the load has settled, or when the policy says
// so; keep the gap.
//
// Why the settle trim (issue 33): the trims asked for by deletes run while
// the memory a load used is still being freed (the streams' and connections'
// buffers go after the last delete, or were reused after a trim and freed
// again), and a trim resets the policy's references (its peak, what the heap
// held free). What went back after the last delete then depended on whether
// a later look saw a fall larger than the slack: with 64 connections closing
// after the deletes it saw 68 MiB and trimmed 10 s later; with fewer it saw
// less than the slack and never did. The daemon going idle is the moment
// nothing is about to reuse what the load left, so the trimmer trims then,
// whatever the readings say.
#include "server/base/heap_trimmer.h"

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "server/base/log.h"

namespace optstate {

void HeapTrimPolicy::Trimmed(const HeapReading& after) {
  system_at_trim_ = after.system_bytes;
  free_at_trim_ = after.free_bytes();
  peak_in_use_ = after.in_use_bytes;
}

bool HeapTrimPolicy::Due(const HeapReading& now) {
  peak_in_use_ = std::max(peak_in_use_, now.in_use_bytes);
  if (now.system_bytes > system_at_trim_ + slack_) return true;
  const uint64_t fall = std::max(slack_, peak_in_use_ / 4);
  return now.in_use_bytes + fall < peak_in_use_;
}

bool HeapTrimPolicy::FreedSinceTrim(const HeapReading& now) const {
  return now.free_bytes() > free_at_trim_ + slack_ / 16;
}

HeapReading ReadHeap() {
  const struct mallinfo2 info = mallinfo2();
  return HeapReading{info.arena, info.uordblks};
}

uint64_t ReadHeapResidentBytes() {
  std::FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return 0;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uint64_t resident = 0;
  char line[512];
  while (std::fgets(line, sizeof(line), maps) != nullptr) {
    const size_t length = std::strlen(line);
    constexpr const char kHeap[] = "[heap]\n";
    if (length < sizeof(kHeap) - 1 ||
        std::strcmp(line + length - (sizeof(kHeap) - 1), kHeap) != 0) {
      continue;
    }
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR, &begin, &end) != 2) continue;
    unsigned char in_core[4096];  // One byte per page: 16 MiB per call.
    while (begin < end) {
      const size_t pages = std::min<uintptr_t>((end - begin) / page, sizeof(in_core));
      // Fails only where the heap shrank since the read of maps.
      if (pages == 0 || mincore(reinterpret_cast<void*>(begin), pages * page, in_core) != 0) break;
      for (size_t i = 0; i < pages; ++i) resident += (in_core[i] & 1) * page;
      begin += pages * page;
    }
  }
  std::fclose(maps);
  return resident;
}

HeapTrimmer::HeapTrimmer(absl::Duration period, uint64_t slack_bytes, absl::Duration min_gap,
                         std::function<HeapReading()> read_heap, std::function<void()> trim)
    : period_(period),
      periodic_(period > absl::ZeroDuration() && period != absl::InfiniteDuration()),
      settle_(periodic_ ? period / 2 : absl::InfiniteDuration()),
      min_gap_(min_gap),
      read_heap_(std::move(read_heap)),
      trim_(trim ? std::move(trim) : [] { malloc_trim(0); }),
      policy_(slack_bytes) {
  policy_.Trimmed(read_heap_());
  {
    absl::MutexLock lock(&mu_);
    next_look_ = periodic_ ? absl::Now() + period_ : absl::InfiniteFuture();
  }
  thread_ = std::thread([this] { Run(); });
}

HeapTrimmer::~HeapTrimmer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void HeapTrimmer::RequestTrim() {
  absl::MutexLock lock(&mu_);
  requested_ = true;
  if (periodic_) {
    // A follow-up: what the deleted groups' streams and connections still
    // hold is freed after this trim.
    settle_at_ = std::max(settle_at_, absl::Now() + settle_);
    settle_pending_ = true;
  }
}

void HeapTrimmer::SetIdle(bool idle) {
  absl::MutexLock lock(&mu_);
  if (idle == idle_) return;
  idle_ = idle;
  if (!idle) {
    busy_since_trim_ = true;
    return;
  }
  if (periodic_) {
    settle_at_ = std::max(settle_at_, absl::Now() + settle_);
    settle_pending_ = true;
  }
}

uint64_t HeapTrimmer::trims() const {
  absl::MutexLock lock(&mu_);
  return trims_;
}

bool HeapTrimmer::WaitForCause(Cause* cause, bool* idle, bool* busy_since_trim) {
  absl::MutexLock lock(&mu_);
  // Woken early only to arm a settle: the thread then waits for settle_at_
  // instead, and later changes of idleness (a stream between two steps of
  // one client) move settle_at_ without waking it.
  auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || requested_ || (settle_pending_ && !settle_armed_);
  };
  for (;;) {
    if (stop_) return false;
    if (requested_) {
      requested_ = false;
      *cause = Cause::kRequested;
      break;
    }
    const absl::Time now = absl::Now();
    if (settle_armed_) {
      if (!idle_) {
        settle_pending_ = settle_armed_ = false;  // Going idle again arms a new one.
      } else if (now >= settle_at_) {
        settle_pending_ = settle_armed_ = false;
        *cause = Cause::kSettle;
        break;
      }
    }
    if (now >= next_look_) {
      *cause = Cause::kLook;
      break;
    }
    settle_armed_ = settle_pending_;
    mu_.AwaitWithDeadline(absl::Condition(&wake),
                          settle_armed_ ? std::min(next_look_, settle_at_) : next_look_);
  }
  *idle = idle_;
  *busy_since_trim = busy_since_trim_;
  return true;
}

void HeapTrimmer::Run() {
  Cause cause;
  bool idle, busy_since_trim;
  while (WaitForCause(&cause, &idle, &busy_since_trim)) {
    const char* why = nullptr;
    if (cause == Cause::kRequested) {
      why = "asked";
    } else {
      const HeapReading now = read_heap_();
      if (cause == Cause::kSettle && busy_since_trim) {
        why = "idle after serving streams";
      } else if (cause == Cause::kLook && policy_.Due(now)) {
        why = "the heap grew or its use fell";
      } else if (policy_.FreedSinceTrim(now) && (cause == Cause::kSettle || idle)) {
        why = "memory freed while idle";
      }
    }
    if (why == nullptr) {
      absl::MutexLock lock(&mu_);
      if (cause == Cause::kLook) next_look_ = absl::Now() + period_;
      continue;
    }
    {
      // What a stream does from here on may reuse what the trim gives back.
      absl::MutexLock lock(&mu_);
      busy_since_trim_ = !idle_;
    }
    trim_();
    const HeapReading after = read_heap_();
    policy_.Trimmed(after);
    if (LogEnabled(LogLevel::kDebug)) {
      Log(LogLevel::kDebug, "heap trimmed (", why, "): ", after.in_use_bytes >> 20, " MiB in use, ",
          after.free_bytes() >> 20, " MiB free, ", ReadHeapResidentBytes() >> 20,
          " MiB of the main arena resident");
    }
    {
      absl::MutexLock lock(&mu_);
      ++trims_;
      next_look_ = periodic_ ? absl::Now() + period_ : absl::InfiniteFuture();
      // Requests within the gap are served by one trim after it.
      mu_.AwaitWithTimeout(absl::Condition(&stop_), min_gap_);
      if (stop_) return;
    }
  }
}

}  // namespace optstate
