// Channel arguments: message limits both ways, a subchannel of its own.
#include "client/call/channel.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "client/call/process_guard.h"
#include "client/call/tls_files.h"
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
  if (options.reconnect_timeout < absl::ZeroDuration() ||
      options.reconnect_timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        "ClientOptions.reconnect_timeout must be finite and >= 0 (0: max_attempts alone)");
  }
  auto word = [](const std::string& s, size_t max) {
    if (s.size() > max) return false;
    for (char c : s) {
      if (c <= ' ' || c > '~') return false;
    }
    return true;
  };
  if (!word(options.lease_holder, 128) || !word(options.lease_job, 256)) {
    return absl::InvalidArgumentError(
        "ClientOptions.lease_holder (up to 128) and lease_job (up to 256) must be printable "
        "ASCII characters without spaces");
  }
  if (!options.lease_takeover.empty()) {
    const std::vector<absl::string_view> entries =
        absl::StrSplit(options.lease_takeover, ' ', absl::SkipEmpty());
    bool shaped = !entries.empty() && entries.size() <= 16;
    for (absl::string_view entry : entries) {
      shaped = shaped &&
               (absl::StartsWith(entry, "expired=") || absl::StartsWith(entry, "dead=")) &&
               word(std::string(entry), 140) && entry.back() != '=';
    }
    if (!shaped) {
      return absl::InvalidArgumentError(
          "ClientOptions.lease_takeover must be 'expired=ID' or 'dead=ID' (ID: the holder "
          "GroupInfo.lease names), up to 16 of them separated by spaces, or empty");
    }
    if (options.lease_holder.empty()) {
      return absl::InvalidArgumentError(
          "ClientOptions.lease_takeover needs lease_holder: a takeover moves the lease to this "
          "client's holder");
    }
  }
  return absl::OkStatus();
}

namespace {

// A backoff as gRPC's channel argument: milliseconds, within [100 (gRPC's
// floor), INT_MAX] (an infinite or huge one would overflow to a negative).
int BackoffMillis(absl::Duration backoff) {
  const int64_t ms = absl::ToInt64Milliseconds(backoff);
  return static_cast<int>(std::clamp<int64_t>(ms, 100, std::numeric_limits<int>::max()));
}

}  // namespace

absl::StatusOr<std::string> ResolveToken(const ClientOptions& options) {
  const char* env = std::getenv("OPTSTATE_TOKEN");
  const bool from_env = options.token.empty() && env != nullptr;
  const std::string token(
      absl::StripAsciiWhitespace(from_env ? absl::string_view(env) : options.token));
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          from_env ? "the OPTSTATE_TOKEN environment variable" : "the token given to the client",
          " holds character code ", static_cast<int>(c), " at position ", i,
          ", which a gRPC header cannot carry: a token is printable ASCII (the token is not "
          "shown here)"));
    }
  }
  return token;
}

namespace {

// INVALID_ARGUMENT for a host:port target whose port is 0 or past 65535:
// gRPC's resolver takes the number modulo 65536, so 127.0.0.1:113661 reached
// whatever listens on 48125. unix: and other schemes' paths are not looked at.
absl::Status CheckTargetPort(absl::string_view target) {
  for (absl::string_view scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::ConsumePrefix(&target, scheme)) break;
  }
  if (absl::StartsWith(target, "unix:") || absl::StartsWith(target, "unix-abstract:") ||
      absl::StrContains(target, ",")) {
    return absl::OkStatus();  // A path, or a list of addresses (ipv4:a:1,b:2).
  }
  const size_t colon = target.rfind(':');
  if (colon == absl::string_view::npos) return absl::OkStatus();
  if (target.front() == '[' && target.rfind(']') > colon) return absl::OkStatus();  // [v6]
  const absl::string_view port = target.substr(colon + 1);
  if (port.empty() || port.size() > 16 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return absl::OkStatus();  // A named port, or none: gRPC says what it makes of it.
  }
  uint64_t number = 0;
  for (char c : port) number = number * 10 + static_cast<uint64_t>(c - '0');
  if (number == 0 || number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("target '", target, "': port ", port,
                     " is not a TCP port (1 to 65535); give the daemon's address as host:port"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const ClientOptions& options) {
  if (absl::Status s = CheckTargetPort(target); !s.ok()) return s;
  if (absl::Status s = CheckGrpcUsableInThisProcess(); !s.ok()) return s;
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
  // Between failed connection attempts gRPC waits its own backoff (1 s growing
  // by 1.6x up to 120 s by default), during which every call fails at once
  // without trying: a daemon back after a restart went unseen for up to 10 s
  // of a client's retries. The client's own backoff bounds it instead
  // (initial_backoff doubling up to max_backoff; gRPC's floor is 100 ms).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, BackoffMillis(options.initial_backoff));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, BackoffMillis(options.max_backoff));
  // A connection whose peer went away without closing it (a cut link, a
  // host gone) must fail its calls: a stream blocked writing into it does
  // not end at its deadline while the socket holds unacknowledged bytes.
  // Pings every 20 s while a call is open, answered within 10 s, and (gRPC
  // sets it from these) TCP_USER_TIMEOUT of 10 s close such a connection.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  const bool tls = options.tls || !options.tls_root_ca_file.empty() ||
                   !options.tls_cert_file.empty() || !options.tls_key_file.empty();
  if (!tls) return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "ClientOptions.tls_cert_file and tls_key_file go together: give both or neither");
  }
  absl::StatusOr<TlsPem> pem = ReadTlsFiles(options);
  if (!pem.ok()) return pem.status();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = std::move(pem->root_certs);
  ssl.pem_cert_chain = std::move(pem->cert_chain);
  ssl.pem_private_key = std::move(pem->private_key);
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  return grpc::CreateCustomChannel(target, grpc::SslCredentials(ssl), args);
}

}  // namespace optstate::client_internal
