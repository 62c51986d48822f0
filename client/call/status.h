// gRPC's statuses as absl::Status, and which failures a retry may cure.
// Not API.
#ifndef OPTSTATE_CLIENT_CALL_STATUS_H_
#define OPTSTATE_CLIENT_CALL_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace optstate::client_internal {

// The same code and message, but for a stream the daemon's gRPC transport
// reset (an HTTP/2 RST_STREAM, which gRPC reports as INTERNAL, "Received
// RST_STREAM with error code N"): UNAVAILABLE saying so. No answer of the
// daemon's came on that stream; gRPC 1.51 resets streams so when its
// memory quota (--grpc_buffer_bytes) is full.
absl::Status FromGrpcStatus(const grpc::Status& status);

// Transient failures a retry may cure: UNAVAILABLE, DEADLINE_EXCEEDED,
// ABORTED, CANCELLED and UNKNOWN (a broken stream). Retrying them is safe:
// steps are exactly-once per page and registration is idempotent.
bool IsRetryable(const absl::Status& status);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_CALL_STATUS_H_
