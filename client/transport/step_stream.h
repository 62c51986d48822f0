// One attempt of a step: a raw Step stream (grpc::ByteBuffer in and out, no
// protobuf copies of payloads) carrying a transport's messages. Not API.
#ifndef OPTSTATE_CLIENT_TRANSPORT_STEP_STREAM_H_
#define OPTSTATE_CLIENT_TRANSPORT_STEP_STREAM_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "client/transport/step_transport.h"
#include "grpcpp/grpcpp.h"
#include "optstate/client.h"

namespace optstate::client_internal {

// The full name of the Step method, for a raw call.
inline constexpr char kStepMethod[] = "/optstate.v1.OptimizerState/Step";

// The raw Step method, registered on `channel`.
std::unique_ptr<grpc::internal::RpcMethod> MakeStepMethod(
    const std::shared_ptr<grpc::Channel>& channel);

// Sends the messages `pending` lists (indices into the transport's, in
// order) in one stream with the attempt's deadline, at most
// transport.max_in_flight() unanswered, and takes each reply in order;
// removes every answered message from `pending`. OK when all were
// answered; UNAVAILABLE when the stream ended or broke before (retryable);
// TakeReply's status when a reply was wrong (the stream is cancelled);
// else the stream's status.
absl::Status RunStepStream(grpc::ChannelInterface* channel, const grpc::internal::RpcMethod& method,
                           const ClientOptions& options, StepTransport& transport,
                           std::vector<size_t>* pending);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_TRANSPORT_STEP_STREAM_H_
