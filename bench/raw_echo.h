// The transport ceiling of optstate-bench: a gRPC bidirectional echo with no
// copies of payload bytes in user code on either side. The client sends
// pre-serialized EchoChunk messages (grpc::ByteBuffer, slices shared, never
// copied); the server (a callback generic service) writes each received
// ByteBuffer straight back; the client counts reply bytes and drops them. No
// gRPC service moving the same messages through the same channel can be
// faster, so "optstate / raw echo" says how much of gRPC's own ceiling the
// Step stream reaches.
#ifndef OPTSTATE_BENCH_RAW_ECHO_H_
#define OPTSTATE_BENCH_RAW_ECHO_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"

namespace optstate::bench {

// The generic service the echo server process registers next to Echo: it
// answers every method no other service handles by echoing each message.
std::unique_ptr<grpc::CallbackGenericService> MakeRawEchoService();

class RawEchoClient {
 public:
  // `chunk_bytes`: payload sizes of the chunks of one step, in order. Builds
  // each chunk's serialized message once, here.
  RawEchoClient(const std::string& target, int max_message_bytes, int window,
                const std::vector<size_t>& chunk_bytes);
  ~RawEchoClient();

  // One "step": sends every chunk in order, at most `window` unanswered, and
  // returns when every reply has arrived with the size it was sent with.
  absl::Status Step();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace optstate::bench

#endif  // OPTSTATE_BENCH_RAW_ECHO_H_
