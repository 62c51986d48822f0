// optstate-probe: one grpc.health.v1 Check against a daemon. Exits 0 only
// when the answer is SERVING; 1 when it is anything else or no answer comes
// within --timeout; 2 for bad usage. For Docker HEALTHCHECK, compose and
// Kubernetes exec probes (Kubernetes' built-in grpc: probe cannot present a
// client certificate; this program will, when the daemon gets TLS).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, addr, "127.0.0.1:50051",
          "The daemon's address: host:port, or unix:/path for a daemon on a Unix socket.");
ABSL_FLAG(std::string, service, "",
          "The service asked about; empty: the server as a whole. "
          "optstate.v1.OptimizerState is SERVING once the daemon serves steps.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(3),
          "Deadline of the check, connecting included.");
// Transport security: health needs no token (the daemon exempts
// grpc.health.v1 from --auth_tokens_file), so there is no token flag; a TLS
// daemon needs the CA, and under mTLS a client certificate.
ABSL_FLAG(std::string, tls_ca, "",
          "PEM roots that sign the daemon's certificate: the check goes over TLS. Empty (and "
          "no --tls_cert): plaintext.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate, for a daemon started with --tls_client_ca (with --tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_server_name, "",
          "The name the daemon's certificate must carry; empty: the host of --addr.");

namespace {

// The whole file at `path`, or nullopt (reported on stderr) when unreadable.
std::optional<std::string> ReadFlagFile(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "optstate-probe: --%s=%s cannot be read\n", flag, path.c_str());
    return std::nullopt;
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

int main(int argc, char** argv) {
  // --help lists this file's flags (absl's default takes a file named after
  // the binary: optstate-probe's is optstate_probe_main.cc).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "optstate_probe_main.");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "optstate-probe asks an optstated daemon's grpc.health.v1 service whether it serves; "
      "exit 0 only on SERVING.\n"
      "Usage: optstate-probe [--addr=127.0.0.1:50051] [--service=NAME] [--timeout=3s] "
      "[--tls_ca=FILE [--tls_cert=FILE --tls_key=FILE] [--tls_server_name=NAME]]");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "optstate-probe: unexpected argument %s (see --help)\n", rest[1]);
    return 2;
  }
  const absl::Duration timeout = absl::GetFlag(FLAGS_timeout);
  if (timeout <= absl::ZeroDuration()) {
    std::fprintf(stderr, "optstate-probe: --timeout must be positive\n");
    return 2;
  }
  const std::string addr = absl::GetFlag(FLAGS_addr);
  const std::string service = absl::GetFlag(FLAGS_service);

  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args;
  const std::string ca = absl::GetFlag(FLAGS_tls_ca), cert = absl::GetFlag(FLAGS_tls_cert),
                    key = absl::GetFlag(FLAGS_tls_key);
  if (cert.empty() != key.empty()) {
    std::fprintf(stderr, "optstate-probe: --tls_cert and --tls_key go together\n");
    return 2;
  }
  if (!ca.empty() || !cert.empty()) {
    grpc::SslCredentialsOptions ssl;
    if (!ca.empty()) {
      std::optional<std::string> roots = ReadFlagFile("tls_ca", ca);
      if (!roots) return 2;
      ssl.pem_root_certs = std::move(*roots);
    }
    if (!cert.empty()) {
      std::optional<std::string> chain = ReadFlagFile("tls_cert", cert);
      std::optional<std::string> private_key = ReadFlagFile("tls_key", key);
      if (!chain || !private_key) return 2;
      ssl.pem_cert_chain = std::move(*chain);
      ssl.pem_private_key = std::move(*private_key);
    }
    credentials = grpc::SslCredentials(ssl);
    if (!absl::GetFlag(FLAGS_tls_server_name).empty()) {
      args.SetSslTargetNameOverride(absl::GetFlag(FLAGS_tls_server_name));
    }
  }
  auto channel = grpc::CreateCustomChannel(addr, credentials, args);
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const absl::Time start = absl::Now();
  // The last quarter of the timeout (a second at most) is kept for a call
  // that says why no connection came.
  const absl::Duration reserve = std::min(absl::Seconds(1), timeout / 4);
  auto check = [&](absl::Time deadline, bool wait_for_ready) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    context.set_wait_for_ready(wait_for_ready);
    return stub->Check(&context, request, &response);
  };
  // Waits for the connection instead of failing at the first refused
  // attempt: a daemon that is just starting gets most of the timeout to
  // answer.
  grpc::Status status = check(start + timeout - reserve, /*wait_for_ready=*/true);
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
      channel->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) {
    // Not connected: a call that does not wait fails with gRPC's reason (a
    // refused connection, a failed TLS handshake), or still gets the answer.
    const grpc::Status again = check(start + timeout, /*wait_for_ready=*/false);
    if (again.ok() || again.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) status = again;
    // Failed at once: the daemon may yet come up within what is left.
    if (!status.ok() && absl::Now() < start + timeout) {
      grpc::health::v1::HealthCheckResponse answer;
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(start + timeout));
      context.set_wait_for_ready(true);
      if (stub->Check(&context, request, &answer).ok()) {
        status = grpc::Status::OK;
        response = answer;
      }
    }
  }
  const std::string what = service.empty() ? addr : addr + " " + service;
  const bool no_answer = status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                         status.error_code() == grpc::StatusCode::UNAVAILABLE;
  if (!status.ok() && !no_answer) {
    std::fprintf(stderr, "optstate-probe: %s: %s (code %d)\n", what.c_str(),
                 status.error_message().c_str(), static_cast<int>(status.error_code()));
    return 1;
  }
  if (!status.ok()) {
    // A daemon with TLS closes a plaintext connection at its first bytes.
    const bool plaintext_refused =
        ca.empty() && cert.empty() && status.error_code() == grpc::StatusCode::UNAVAILABLE &&
        status.error_message().find("Socket closed") != std::string::npos;
    std::fprintf(stderr, "optstate-probe: %s: no answer within %s: %s (code %d)%s\n", what.c_str(),
                 absl::FormatDuration(timeout).c_str(), status.error_message().c_str(),
                 static_cast<int>(status.error_code()),
                 plaintext_refused ? "; a daemon with TLS closes plaintext connections: give "
                                     "--tls_ca (and --tls_cert, --tls_key under mTLS)"
                                   : "");
    return 1;
  }
  const std::string answer =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    std::fprintf(stderr, "optstate-probe: %s: %s\n", what.c_str(), answer.c_str());
    return 1;
  }
  std::printf("%s: %s\n", what.c_str(), answer.c_str());
  return 0;
}
