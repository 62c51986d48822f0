// protobuf's own log lines (a request whose string field is not UTF-8 gets
// one per call, written by the parser) into the daemon's log, at most one a
// second: a client cannot flood the log by sending such requests.
#ifndef OPTSTATE_SERVER_RPC_PROTOBUF_LOG_H_
#define OPTSTATE_SERVER_RPC_PROTOBUF_LOG_H_

namespace optstate {

// Installs the handler (process-wide; call once, before serving). protobuf's
// errors and warnings about a request are the client's, not the daemon's:
// logged as warnings, with how many were left out since the last one.
void RouteProtobufLogToTheDaemonLog();

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_PROTOBUF_LOG_H_
