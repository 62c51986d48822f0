// PageRangeLock: ascending Lock, descending Unlock.
#include "server/state/page_range_lock.h"

namespace optstate {

PageRangeLock::PageRangeLock(const Group& group, uint64_t first_page, uint64_t end_page)
    : group_(group), first_(first_page), end_(end_page) {
  for (uint64_t p = first_; p < end_; ++p) group_.page_mutex(p).Lock();
}

PageRangeLock::~PageRangeLock() {
  for (uint64_t p = end_; p-- > first_;) group_.page_mutex(p).Unlock();
}

}  // namespace optstate
