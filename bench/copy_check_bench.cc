// copy-check-bench: the shared-memory copy path's first pass, measured
// apart. Copies 16 Mi floats (64 MiB, lora7b's step) into a shared mapping
// and checks them finite in pieces of 16 Ki (the block
// client/shared_memory_plane.cc copies and checks in one pass), 64 Ki
// (lora7b's tensor) and 256 Ki elements, each checked right after its copy,
// and as one 64 MiB piece (copied, then checked: two passes over memory, as
// the plane did for a large group before). Best of `reps` (argv[1], 12).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "optstate/dtype.h"

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count() * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  using optstate::WireType;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 12;
  const size_t n = size_t{16} << 20;
  std::vector<float> src(n);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i % 2001) * 1e-6f;
  char* dst = static_cast<char*>(
      mmap(nullptr, n * 4, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (dst == MAP_FAILED) return 1;
  std::memset(dst, 0, n * 4);
  auto copy_then_check = [&](size_t piece) {
    bool finite = true;
    for (size_t at = 0; at < n; at += piece) {
      optstate::EncodeFromFloat(WireType::kFloat32, src.data() + at, dst + at * 4, piece);
      finite = optstate::AllWireFinite(WireType::kFloat32, dst + at * 4, piece) && finite;
    }
    return finite;
  };
  constexpr int kKinds = 4;
  double best[kKinds] = {1e9, 1e9, 1e9, 1e9};
  const size_t pieces[kKinds] = {16384, 65536, 262144, n};
  for (int rep = 0; rep < reps; ++rep) {
    for (int k = 0; k < kKinds; ++k) {
      const Clock::time_point start = Clock::now();
      if (!copy_then_check(pieces[k])) return 2;
      best[k] = std::min(best[k], Ms(start, Clock::now()));
    }
  }
  std::printf(
      "64 MiB copied and checked in pieces of 16 Ki elements: %.2f ms, 64 Ki: %.2f ms, 256 Ki: "
      "%.2f ms; as one piece (copy, then check): %.2f ms (best of %d)\n",
      best[0], best[1], best[2], best[3], reps);
  return 0;
}
