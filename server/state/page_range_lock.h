// Holds the page mutexes of a run of a group's pages: the one way anything
// takes more than one (a step, an initial-values write, a deletion, an
// unregistration, an import over a group).
#ifndef OPTSTATE_SERVER_STATE_PAGE_RANGE_LOCK_H_
#define OPTSTATE_SERVER_STATE_PAGE_RANGE_LOCK_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "server/state/group.h"

namespace optstate {

// Locks pages [first_page, end_page) of `group` in ascending order, so that
// two holders of overlapping ranges cannot deadlock, and unlocks them in
// descending order when it goes. `group` must outlive the lock; a thread
// must not already hold a mutex of the range (absl::Mutex is not
// reentrant). Clang's thread-safety analysis names each mutex it tracks
// statically and cannot name a range of an array, so the constructor and
// destructor are exempt from it; what the range guards (page elements,
// steps, values flags) is stated on Group.
class PageRangeLock {
 public:
  PageRangeLock(const Group& group, uint64_t first_page,
                uint64_t end_page) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Every page of `group`.
  explicit PageRangeLock(const Group& group) : PageRangeLock(group, 0, group.num_pages()) {}
  ~PageRangeLock() ABSL_NO_THREAD_SAFETY_ANALYSIS;

  PageRangeLock(const PageRangeLock&) = delete;
  PageRangeLock& operator=(const PageRangeLock&) = delete;

 private:
  const Group& group_;
  const uint64_t first_;
  const uint64_t end_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_STATE_PAGE_RANGE_LOCK_H_
