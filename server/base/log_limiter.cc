#include "server/base/log_limiter.h"

#include "absl/time/clock.h"

namespace optstate {

std::optional<uint64_t> LogLimiter::Take() {
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  int64_t last = logged_second_.load(std::memory_order_relaxed);
  if (last == now || !logged_second_.compare_exchange_strong(last, now)) {
    left_out_.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  return left_out_.exchange(0, std::memory_order_relaxed);
}

}  // namespace optstate
