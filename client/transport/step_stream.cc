// A writer thread sends within the window while this thread reads replies
// (a one-message step is written by this thread first);
// the first wrong reply cancels the call, and Finish says why a stream
// ended early.
#include "client/transport/step_stream.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "client/call/retry.h"
#include "client/call/status.h"
#include "client/step/send_window.h"
#include "grpcpp/support/sync_stream.h"

namespace optstate::client_internal {

std::unique_ptr<grpc::internal::RpcMethod> MakeStepMethod(
    const std::shared_ptr<grpc::Channel>& channel) {
  return std::make_unique<grpc::internal::RpcMethod>(
      kStepMethod, grpc::internal::RpcMethod::BIDI_STREAMING, channel);
}

absl::Status RunStepStream(grpc::ChannelInterface* channel, const grpc::internal::RpcMethod& method,
                           const ClientOptions& options, StepTransport& transport,
                           std::vector<size_t>* pending) {
  grpc::ClientContext context;
  PrepareContext(&context, options);
  // The call's headers go out with its first message, not in a round of
  // their own before it.
  context.set_initial_metadata_corked(true);
  // A raw stream, created as generated stubs do, with gRPC's internal
  // factory (stable across the 1.x releases we build with).
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel, method, &context));

  SendWindow window(transport.max_in_flight());
  const size_t total = pending->size();
  // One message (a zero-copy step's, or a small step's) is written here with
  // the half-close in the same batch: no writer thread to start and join.
  // The daemon reads a message before it answers it, so this write cannot
  // wait on a reply; a failed one leaves Read to fail and Finish to say why.
  std::thread writer;
  if (total == 1) {
    stream->WriteLast(transport.Request((*pending)[0]), grpc::WriteOptions());
  } else {
    writer = std::thread([&] {
      for (size_t i = 0; i < total; ++i) {
        if (!window.WaitForRoom(i)) break;
        if (!stream->Write(transport.Request((*pending)[i]))) break;  // Finish says why.
      }
      stream->WritesDone();
    });
  }

  absl::Status mismatch;
  size_t answered = 0;
  grpc::ByteBuffer reply;
  while (answered < total && stream->Read(&reply)) {
    absl::Status taken = transport.TakeReply((*pending)[answered], &reply);
    if (!taken.ok()) {
      mismatch = absl::Status(taken.code(), absl::StrCat("reply to message ", (*pending)[answered],
                                                         " of the step: ", taken.message()));
      break;
    }
    ++answered;
    window.Answered();
  }
  window.Stop();
  // After a mismatch the call is abandoned; cancelling unblocks the writer.
  // Otherwise Read only fails once the call is over, and Finish says why.
  if (!mismatch.ok()) context.TryCancel();
  if (writer.joinable()) writer.join();
  absl::Status status = FromGrpcStatus(stream->Finish());
  pending->erase(pending->begin(), pending->begin() + static_cast<std::ptrdiff_t>(answered));

  if (!mismatch.ok()) return mismatch;
  if (pending->empty()) return absl::OkStatus();
  if (status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the stream ended after ", answered, " of ", total, " replies"));
  }
  if (status.code() == absl::StatusCode::kCancelled) {
    return absl::UnavailableError(absl::StrCat("the stream broke after ", answered, " of ", total,
                                               " replies: ", status.message()));
  }
  return status;
}

}  // namespace optstate::client_internal
