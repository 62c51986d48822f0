#include "bench/serve_until_signal.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>

namespace optstate::bench {

int ServeUntilSignal(const char* name,
                     absl::FunctionRef<void(grpc::ServerBuilder&)> register_services) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(64 << 20);  // As optstated's default.
  builder.SetMaxSendMessageSize(64 << 20);
  register_services(builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return 1;
  std::printf("%s listening on port %d\n", name, port);
  std::fflush(stdout);
  int signal = 0;
  sigwait(&signals, &signal);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}

}  // namespace optstate::bench
