// At most one line a second from a source outside the daemon's control (a
// library's log handler), counting the lines left out.
#ifndef OPTSTATE_SERVER_BASE_LOG_LIMITER_H_
#define OPTSTATE_SERVER_BASE_LOG_LIMITER_H_

#include <atomic>
#include <cstdint>
#include <optional>

namespace optstate {

// Thread-safe, lock-free.
class LogLimiter {
 public:
  // Whether a line may be written now: the lines left out since the last
  // one written, or nullopt (this one is left out, and counted) within the
  // same Unix second as the last.
  std::optional<uint64_t> Take();

 private:
  std::atomic<int64_t> logged_second_{0};  // Unix second of the last line written.
  std::atomic<uint64_t> left_out_{0};      // Lines left out since then.
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BASE_LOG_LIMITER_H_
