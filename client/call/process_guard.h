// Whether gRPC can be used in this process: not in a child forked while its
// parent held gRPC objects (a channel: an open Client). gRPC's threads do not
// survive fork(), its state does: the child's calls waited for threads that
// do not exist, past every deadline (timers run on them too). Not API.
#ifndef OPTSTATE_CLIENT_CALL_PROCESS_GUARD_H_
#define OPTSTATE_CLIENT_CALL_PROCESS_GUARD_H_

#include "absl/status/status.h"

namespace optstate::client_internal {

// FAILED_PRECONDITION, saying what to do instead, in a process forked from
// one that had gRPC running when it forked; OK otherwise, and this process
// is noted as the one gRPC runs in. Call before making a channel.
absl::Status CheckGrpcUsableInThisProcess();

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_CALL_PROCESS_GUARD_H_
