// Channel arguments: message limits both ways, a subchannel of its own.
#include "client/call/channel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "optstate/message_limits.h"

namespace optstate::client_internal {

absl::Status CheckClientOptions(const ClientOptions& options) {
  if (options.max_attempts < 1 || options.max_chunks_in_flight < 1 || options.chunk_bytes == 0 ||
      static_cast<uint64_t>(std::max(options.max_message_bytes, 0)) < kMinMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions: max_attempts and max_chunks_in_flight must be >= 1, chunk_bytes > 0, "
        "max_message_bytes >= ",
        kMinMessageBytes,
        " (one float32 page of the daemon's default size and room for the other fields)"));
  }
  if (!(options.connect_timeout >= absl::Milliseconds(100)) ||
      options.connect_timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        "ClientOptions.connect_timeout must be finite and at least 100 ms");
  }
  if (options.attempt_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "ClientOptions.attempt_timeout must be positive (absl::InfiniteDuration() for none)");
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  // Each Client gets its own connection: clients of one process (one per
  // data-parallel rank, say) do not queue behind each other on one socket.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // gRPC's deadline for one connection attempt (handshake and the server's
  // first SETTINGS frame included) is max(this, the reconnect backoff).
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.connect_timeout)));
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

}  // namespace optstate::client_internal
