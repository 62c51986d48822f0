// The server processes of optstate-bench's baselines: one gRPC server on a
// free loopback port, run until the benchmark stops it.
#ifndef OPTSTATE_BENCH_SERVE_UNTIL_SIGNAL_H_
#define OPTSTATE_BENCH_SERVE_UNTIL_SIGNAL_H_

#include "absl/functional/function_ref.h"
#include "grpcpp/grpcpp.h"

namespace optstate::bench {

// Builds a server on 127.0.0.1:0 with optstated's default message limits,
// lets `register_services` add its services, prints "<name> listening on
// port N" on stdout (what ChildProcess waits for) and blocks until SIGTERM or
// SIGINT. Returns the process's exit code.
int ServeUntilSignal(const char* name,
                     absl::FunctionRef<void(grpc::ServerBuilder&)> register_services);

}  // namespace optstate::bench

#endif  // OPTSTATE_BENCH_SERVE_UNTIL_SIGNAL_H_
