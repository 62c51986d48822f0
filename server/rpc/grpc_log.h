// gRPC's own log lines (one per failed TLS handshake, written by the
// transport: any peer that connects can cause them) into the daemon's log,
// in its format and under --log_level, its errors at most one a second.
#ifndef OPTSTATE_SERVER_RPC_GRPC_LOG_H_
#define OPTSTATE_SERVER_RPC_GRPC_LOG_H_

#include <functional>
#include <string>

namespace optstate {

// Installs the handler (process-wide; call once, before gRPC starts
// serving). gRPC's errors are logged as warnings (they are most often a
// peer's doing), at most one a second, with how many were left out since
// the last one (an assertion's line is never left out, and is an error);
// its info and debug lines (GRPC_VERBOSITY, GRPC_TRACE) all as debug.
void RouteGrpcLogToTheDaemonLog();

// `failed` runs once (on the thread gRPC logs from) when gRPC logs that its
// listener could not accept a connection for other than a passing reason:
// gRPC 1.51 then stops accepting on that listener for good (its
// tcp_server_posix gives up on EMFILE, the descriptor limit reached), and
// the daemon serves only the connections it has. Set before serving.
void OnGrpcListenerFailed(std::function<void(const std::string& reason)> failed);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_GRPC_LOG_H_
