// ReadHeap reads glibc's own heap. Label `rss`: AddressSanitizer replaces
// glibc's allocator (mallinfo2 then reports nothing), so `make sanitize`
// leaves it out and `make test` runs it.
#include <gtest/gtest.h>

#include <vector>

#include "server/base/heap_trimmer.h"

namespace optstate {
namespace {

TEST(HeapReadingTest, TheRealHeapIsRead) {
  std::vector<char> held(1 << 20, 1);  // In use while read (below the mmap threshold).
  const HeapReading reading = ReadHeap();
  EXPECT_GT(reading.system_bytes, 0u);
  EXPECT_GT(reading.in_use_bytes, 0u);
  EXPECT_LE(reading.in_use_bytes, reading.system_bytes);
}

}  // namespace
}  // namespace optstate
