// CopyStreaming: SSE2 non-temporal stores (every x86-64 CPU has them) over the
// destination's 16-byte-aligned middle, memcpy for its unaligned ends.
#include "optstate/streaming_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace optstate {

void CopyStreaming(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const unsigned char*>(src);
  constexpr size_t kStore = 16;    // One _mm_stream_si128.
  constexpr size_t kStride = 64;   // Four of them: one cache line.
  const size_t head = std::min(bytes, (kStore - reinterpret_cast<uintptr_t>(out) % kStore) % kStore);
  if (head != 0) std::memcpy(out, in, head);
  size_t done = head;
  for (; done + kStride <= bytes; done += kStride) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + done), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + done + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + done + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + done + 48), d);
  }
  if (done < bytes) std::memcpy(out + done, in + done, bytes - done);
  _mm_sfence();
#else
  if (bytes != 0) std::memcpy(dst, src, bytes);
#endif
}

}  // namespace optstate
