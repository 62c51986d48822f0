// ReadHeap and ReadHeapResidentBytes read glibc's own heap. Label `rss`: AddressSanitizer replaces
// glibc's allocator (mallinfo2 then reports nothing), so `make sanitize`
// leaves it out and `make test` runs it.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstring>
#include <memory>
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

TEST(HeapReadingTest, ResidentBytesFollowWhatIsTouchedAndWhatATrimGivesBack) {
  constexpr size_t kBlock = 16 << 10;  // Below glibc's mmap threshold: from [heap].
  constexpr int kBlocks = 1024;        // 16 MiB.
  // As optstated tunes it: free() keeps what it frees; only trims give back.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  malloc_trim(0);
  const uint64_t before = ReadHeapResidentBytes();
  std::vector<std::unique_ptr<char[]>> blocks;
  for (int i = 0; i < kBlocks; ++i) {
    blocks.emplace_back(new char[kBlock]);
    std::memset(blocks.back().get(), 1, kBlock);
  }
  const uint64_t touched = ReadHeapResidentBytes();
  EXPECT_GE(touched, before + kBlocks * kBlock * 9 / 10);
  EXPECT_LE(touched, ReadHeap().system_bytes);
  blocks.clear();
  EXPECT_GE(ReadHeapResidentBytes(), touched - kBlock) << "freed but not given back: resident";
  malloc_trim(0);
  EXPECT_LE(ReadHeapResidentBytes(), touched - kBlocks * kBlock * 9 / 10);
}

}  // namespace
}  // namespace optstate
