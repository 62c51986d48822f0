// What the Step streams measure for the metrics endpoint: where a message's
// time goes in the daemon, and the bytes each data plane carried.
#ifndef OPTSTATE_SERVER_RPC_STEP_STREAM_METRICS_H_
#define OPTSTATE_SERVER_RPC_STEP_STREAM_METRICS_H_

#include <atomic>
#include <cstdint>

#include "server/base/duration_histogram.h"

namespace optstate {

// Thread-safe; shared by every Step stream of a service. One sample per
// Step message in each phase:
// - receive: the message read into the engine's terms (parsed in place,
//   its gradients located in the message's slices), once gRPC has it;
// - compute: the message applied (checks, region lookups, AdamW, the
//   params encoded into the reply or the region) on a worker;
// - send: the reply handed to gRPC until gRPC is done writing it (flow
//   control included: a trainer slow to read shows here).
// Bytes: `wire` counts Step messages and replies as gRPC carried them;
// `shared_memory` the gradient and params bytes of the region slices that
// applied messages named (read from and written into the trainer's memory).
struct StepStreamMetrics {
  DurationHistogram receive;
  DurationHistogram compute;
  DurationHistogram send;
  std::atomic<uint64_t> wire_bytes_in{0};
  std::atomic<uint64_t> wire_bytes_out{0};
  std::atomic<uint64_t> shared_memory_bytes_in{0};
  std::atomic<uint64_t> shared_memory_bytes_out{0};
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_STEP_STREAM_METRICS_H_
