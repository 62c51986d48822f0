// optstate-probe: one grpc.health.v1 Check against a daemon. Exits 0 only
// when the answer is SERVING; 1 when it is anything else or no answer comes
// within --timeout; 2 for bad usage. For Docker HEALTHCHECK, compose and
// Kubernetes exec probes (Kubernetes' built-in grpc: probe cannot present a
// client certificate; this program will, when the daemon gets TLS).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
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
// Transport security (TLS, a client certificate, a bearer token) comes with
// the daemon's: its flags will sit here, beside --addr.

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "optstate-probe asks an optstated daemon's grpc.health.v1 service whether it serves; "
      "exit 0 only on SERVING.\n"
      "Usage: optstate-probe [--addr=127.0.0.1:50051] [--service=NAME] [--timeout=3s]");
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

  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  // Waits for the connection within the deadline instead of failing at the
  // first refused attempt: a daemon that is just starting gets the whole
  // timeout to answer.
  context.set_wait_for_ready(true);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  const std::string what = service.empty() ? addr : addr + " " + service;
  if (!status.ok()) {
    std::fprintf(stderr, "optstate-probe: %s: %s (code %d)\n", what.c_str(),
                 status.error_message().c_str(), static_cast<int>(status.error_code()));
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
