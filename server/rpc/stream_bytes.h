// The bytes Step streams hold between them: requests read and not yet
// applied, and replies not yet sent (StepReactor). A stream reads no further
// message while they are at the limit, unless it holds nothing, so the
// daemon holds at most the limit plus one message each way per stream.
#ifndef OPTSTATE_SERVER_RPC_STREAM_BYTES_H_
#define OPTSTATE_SERVER_RPC_STREAM_BYTES_H_

#include <atomic>
#include <cstdint>

namespace optstate {

// Thread-safe.
class StreamBytes {
 public:
  // `limit`: the bytes the streams may hold before they read more (0: no
  // limit).
  explicit StreamBytes(uint64_t limit) : limit_(limit) {}

  // Adds `bytes` (a stream's holdings grew by them) or takes them away.
  void Add(uint64_t bytes) { held_.fetch_add(bytes, std::memory_order_relaxed); }
  void Subtract(uint64_t bytes) { held_.fetch_sub(bytes, std::memory_order_relaxed); }

  // Whether the streams hold the limit or more: read no more until some goes.
  bool Full() const { return limit_ != 0 && held_.load(std::memory_order_relaxed) >= limit_; }
  uint64_t held() const { return held_.load(std::memory_order_relaxed); }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> held_{0};
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_STREAM_BYTES_H_
