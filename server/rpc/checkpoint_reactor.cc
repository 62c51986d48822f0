// Checkpoint: request to CheckpointCall, outcome to CheckpointResponse.
#include "server/rpc/checkpoint_reactor.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/raw_message.h"

namespace optstate {

void StartCheckpointCall(Checkpointer* checkpointer, grpc::CallbackServerContext* context,
                         grpc::ServerUnaryReactor* reactor, const std::string& tenant,
                         bool all_tenants, const v1::CheckpointRequest& request,
                         grpc::ByteBuffer* response) {
  if (checkpointer == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                 "this daemon keeps no checkpoints; start optstated with "
                                 "--state_dir"));
    return;
  }
  CheckpointCall call;
  for (const std::string& name : request.groups()) call.groups.push_back(GroupKey{tenant, name});
  if (!all_tenants) call.tenant = tenant;
  if (request.has_wait_for_step()) {
    if (request.wait_for_step() == UINT64_MAX) {
      // No page takes step 2^64-1 (Step refuses it): the wait could only end
      // at the deadline, or never.
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   "wait_for_step must be at most 2^64-2, the last step a page "
                                   "can take"));
      return;
    }
    call.wait_for_step = request.wait_for_step();
  }
  const auto deadline = context->deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    // The wait for a step ends a little before the caller's deadline, so
    // that the answer naming the page still behind reaches it before its own
    // timer ends the call with a bare DEADLINE_EXCEEDED: a tenth of the time
    // it gave, at most 250 ms.
    const absl::Time given = absl::FromChrono(deadline);
    const absl::Duration margin =
        std::min(absl::Milliseconds(250), std::max(absl::ZeroDuration(), given - absl::Now()) / 10);
    call.deadline = given - margin;
  }
  call.cancelled = [context] { return context->IsCancelled(); };
  checkpointer->CheckpointAsync(std::move(call), [reactor, response, all_tenants, checkpointer](
                                                     absl::StatusOr<CheckpointOutcome> outcome) {
    absl::Status status = outcome.status();
    if (outcome.ok()) {
      v1::CheckpointResponse reply;
      reply.set_id(outcome->id);
      reply.set_step(outcome->step);
      // The checkpoint holds every tenant's groups: its size is not a
      // tenant's to know.
      if (all_tenants) reply.set_bytes(outcome->bytes);
      status = SerializeRawMessage(reply, response);
    } else if (!all_tenants && !checkpointer->writes_refused().empty() &&
               status.message() == checkpointer->writes_refused()) {
      status = absl::FailedPreconditionError(kRefusalsForAdmins);
    } else if (!all_tenants) {
      // A failed write names its files; a tenant is told checkpoints by name,
      // not where the daemon keeps them.
      status = absl::Status(
          status.code(),
          absl::StrReplaceAll(status.message(), {{checkpointer->state_dir() + "/", ""},
                                                 {checkpointer->state_dir(), "--state_dir"}}));
    }
    reactor->Finish(ToGrpcStatus(status));
  });
}

void CheckpointStatsToProto(const CheckpointStats& stats, bool whole_daemon,
                            const std::string& tenant, v1::GetStatsResponse* proto) {
  if (stats.last) {
    v1::CheckpointInfo* last = proto->mutable_last_checkpoint();
    last->set_id(stats.last->id);
    const bool own = whole_daemon || stats.last_tenant == tenant;
    if (own) {
      last->set_step(stats.last->step);
      // Its time grows with every tenant's bytes: told to the tenant whose
      // call wrote it, and to admins.
      last->set_duration_seconds(stats.last_duration_seconds);
    }
    if (whole_daemon) last->set_bytes(stats.last->bytes);
    last->set_finished_unix_micros(stats.last_finished_unix_micros);
  }
  proto->set_checkpoints_written(stats.written);
  proto->set_checkpoint_failures(stats.failures);
  constexpr char kForAdmins[] =
      "(the reason may name other tenants' groups: an admin's GetStats and the daemon's log "
      "give it)";
  proto->set_last_checkpoint_error(whole_daemon || stats.last_error.empty() ? stats.last_error
                                                                            : kForAdmins);
  proto->set_restored_checkpoint_id(stats.restored_id);
  for (const std::string& refusal : stats.restore_refusals) {
    proto->add_restore_refusals(whole_daemon ? refusal : kForAdmins);
  }
}

}  // namespace optstate
