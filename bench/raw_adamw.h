// A reference point of optstate-bench: about the least work an AdamW service
// over gRPC does, on gRPC's fastest path, with nothing else. It extends the
// raw echo (bench/raw_echo.h) by the work no design can avoid:
// - the server runs the AdamW update (optstate's kernel) on each message's
//   gradient where gRPC received it, updating the state it holds in place,
//   and writes the updated params straight into a reply buffer it allocates;
// - the client moves each reply's params into the caller's buffer (memcpy,
//   or a widening to float when the caller holds floats and the wire is bf16),
//   and narrows the caller's float gradient into each request when the wire
//   is bf16; otherwise it lends the gradient to gRPC without a copy.
// What it leaves out, and optstate does: protobuf framing, group names and
// lookups, finite checks on either end, page locks and step bookkeeping,
// replay, a worker pool, validation of anything. Not a strict bound: a
// service could still write the params over the request's own bytes instead
// of a fresh reply buffer, and its throughput can be beaten by a server that
// spreads one stream's messages over workers differently.
//
// "Guarded", it adds the work optstate's guarantees cost, done the cheapest
// way: the client checks the whole step's gradient for finiteness before
// sending any of it and copies each chunk into its request just before
// sending it (the caller's memory is never lent to gRPC, so a stuck
// connection cannot hold the call past its deadline); the server checks each
// message before applying any of it.
#ifndef OPTSTATE_BENCH_RAW_ADAMW_H_
#define OPTSTATE_BENCH_RAW_ADAMW_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "optstate/dtype.h"

namespace optstate::bench {

// Serves the minimal AdamW service (a callback generic service) on
// 127.0.0.1:0 with glibc's heap tuned as optstated tunes it, prints "raw adamw
// listening on port N" and blocks until SIGTERM. Returns the exit code.
int ServeRawAdamW();

// A fresh state's params: p[i] = RawAdamWInitialParam(i), m = v = 0. Not
// uniform, so a reply computed from the wrong elements shows.
inline float RawAdamWInitialParam(uint64_t i) {
  return 0.5f + 0.001f * static_cast<float>(i % 997);
}

class RawAdamWClient {
 public:
  // `client_id` names this client's state on the server; a step 1 starts it
  // afresh (RawAdamWInitialParam). `chunk_bytes`: the
  // payload bytes of each message of a step, in order (the messages
  // Client::Step sends). The step's gradient is `gradient_float` narrowed to
  // `wire` (`gradient_wire`, its wire bytes, must hold the same values; null
  // when the caller holds floats and the wire is bf16, which narrows at every
  // step). Unless `guarded`, `gradient_wire` is lent to gRPC at every step
  // without a copy, so it must outlive this client and stay unchanged.
  RawAdamWClient(const std::string& target, int max_message_bytes, int window, uint64_t client_id,
                 const std::vector<size_t>& chunk_bytes, WireType wire, bool caller_holds_float,
                 bool guarded, const float* gradient_float, const void* gradient_wire);
  ~RawAdamWClient();

  // One step `step` (>= 1): sends every chunk in order, at most `window`
  // unanswered, and writes the updated params into `params_out` (floats when
  // the caller holds floats, else wire bytes). Returns when all have arrived.
  absl::Status Step(uint64_t step, void* params_out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace optstate::bench

#endif  // OPTSTATE_BENCH_RAW_ADAMW_H_
