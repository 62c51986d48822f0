// The plain gRPC echo that optstate-bench measures the Step stream against:
// same chunk sizes, same window, same channel settings, no optimizer.
#ifndef OPTSTATE_BENCH_ECHO_BASELINE_H_
#define OPTSTATE_BENCH_ECHO_BASELINE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"

namespace optstate::bench {

// Serves Echo (sync API, one thread per stream) on 127.0.0.1:0, prints
// "echo listening on port N" and blocks until SIGTERM. Returns the exit code.
int ServeEcho();

// A client of the echo service over its own channel, built with the channel
// arguments the optstate client uses. Not thread-safe; one per thread.
class EchoClient {
 public:
  EchoClient(const std::string& target, int max_message_bytes, int window);
  ~EchoClient();

  // One "step": sends each chunk of `chunk_bytes` (sizes in bytes) from
  // `payload` in order, at most `window` unanswered, copies each reply into
  // `out`, and returns when every reply has arrived.
  absl::Status Step(const std::vector<size_t>& chunk_bytes, const char* payload, char* out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace optstate::bench

#endif  // OPTSTATE_BENCH_ECHO_BASELINE_H_
