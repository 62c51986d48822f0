#include "client/call/process_guard.h"

#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"

namespace optstate::client_internal {
namespace {

// The process that last made a channel while gRPC was not yet running; a
// forked child inherits the value, so it tells the child it is not that one.
std::atomic<pid_t> grpc_process{0};

}  // namespace

absl::Status CheckGrpcUsableInThisProcess() {
  const pid_t here = getpid();
  const pid_t noted = grpc_process.load();
  if (noted != 0 && noted != here && grpc_is_initialized()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this process (", here, ") is a fork of process ", noted,
        ", which had optstate clients open when it forked: gRPC's threads do not survive "
        "fork(), and a client made here would wait for them forever. Start child processes "
        "with the 'spawn' method (multiprocessing.get_context('spawn'); a DataLoader's "
        "multiprocessing_context='spawn'), or fork before the first client is made (or after "
        "every client is closed)"));
  }
  grpc_process.store(here);
  return absl::OkStatus();
}

}  // namespace optstate::client_internal
