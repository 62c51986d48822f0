// A copy whose destination is read next from memory, by another process or
// a later pass, not from this core's cache.
#ifndef OPTSTATE_STREAMING_COPY_H_
#define OPTSTATE_STREAMING_COPY_H_

#include <cstddef>

namespace optstate {

// Copies `bytes` from `src` to `dst` (any alignment; the two must not
// overlap), as memcpy does, but with non-temporal stores on x86-64: the
// destination's lines are not read before they are written and do not push
// other data out of the cache, so a copy larger than the cache moves a third
// fewer bytes through memory. Ends with a store fence, so whoever
// synchronizes with the caller afterwards (a message, a mutex) sees every
// byte. Elsewhere it is memcpy.
void CopyStreaming(void* dst, const void* src, size_t bytes);

}  // namespace optstate

#endif  // OPTSTATE_STREAMING_COPY_H_
