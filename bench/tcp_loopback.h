// The raw-transport baseline: a plain TCP socket pair over 127.0.0.1, no
// framing, no serialization. What any RPC over loopback is measured against.
#ifndef OPTSTATE_BENCH_TCP_LOOPBACK_H_
#define OPTSTATE_BENCH_TCP_LOOPBACK_H_

#include <cstddef>

#include "absl/time/time.h"

namespace optstate::bench {

struct TcpResult {
  double bytes_per_second = 0;  // Payload bytes moved, both directions counted.
};

// One stream, one direction (iperf3-like): a sender thread writes
// `chunk_bytes` buffers, a receiver thread reads them, for about `duration`.
TcpResult MeasureTcpOneWay(size_t chunk_bytes, absl::Duration duration);

// The Step stream's pattern on a raw socket pair: the client sends chunks of
// `chunk_bytes` while an echo thread sends each back; a third thread reads the
// replies. Counts bytes in both directions.
TcpResult MeasureTcpEcho(size_t chunk_bytes, absl::Duration duration);

}  // namespace optstate::bench

#endif  // OPTSTATE_BENCH_TCP_LOOPBACK_H_
