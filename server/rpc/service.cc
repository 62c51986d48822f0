// RPC handlers: streams get reactors; unary calls are counted (unary_calls.h),
// parse their request (raw_message.h) and answer inline (they only read
// counters or take the store's lock briefly), except DeleteGroup, which waits
// on a worker, and Checkpoint and RewindJob, on the checkpointer's threads.
#include "server/rpc/service.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <random>

#include "server/base/heap_trimmer.h"
#include "server/kernels/adamw_kernel.h"
#include "server/rpc/call_lease.h"
#include "server/rpc/checkpoint_reactor.h"
#include "server/rpc/export_reactor.h"
#include "server/rpc/group_pager.h"
#include "server/rpc/import_reactor.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/raw_message.h"
#include "server/rpc/register_reactor.h"
#include "server/rpc/step_reactor.h"
#include "server/rpc/unary_calls.h"

namespace optstate {

std::string OptimizerStateService::RandomInstanceId() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
    if (n < 0 && errno != EINTR) {
      // No getrandom (a seccomp filter, an old kernel): the C++ library's source.
      std::random_device source;
      for (; got < sizeof(bytes); ++got) bytes[got] = static_cast<unsigned char>(source());
    }
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  for (unsigned char b : bytes) {
    id.push_back(kHex[b >> 4]);
    id.push_back(kHex[b & 15]);
  }
  return id;
}
namespace {

// A page's size bound: a repeated entry's tag and length, and room for the
// next_page_token (web-safe base64 of a tenant and a name of up to 512).
constexpr size_t kEntryOverhead = 8;
constexpr size_t kPageTokenReserve = 2048;

// Finishes with `status`; when OK, with `reply` serialized into `response`.
void Reply(grpc::ServerUnaryReactor* reactor, absl::Status status,
           const google::protobuf::Message& reply, grpc::ByteBuffer* response) {
  if (status.ok()) status = SerializeRawMessage(reply, response);
  reactor->Finish(ToGrpcStatus(status));
}

// A tenant no caller can have (tenant names are printable): the key of a
// group that never exists.
const std::string& NoTenant() {
  static const std::string* const none = new std::string(1, '\0');
  return *none;
}

}  // namespace

std::vector<std::shared_ptr<Group>> OptimizerStateService::VisibleGroups(
    const Caller& caller) const {
  return caller.admin ? engine_->store()->ListAll() : engine_->store()->List(caller.tenant);
}

GroupKey OptimizerStateService::KeyFor(const Caller& caller, bool owner_named,
                                       const std::string& owner, const std::string& name) {
  if (!owner_named || owner == caller.tenant) return GroupKey{caller.tenant, name};
  return GroupKey{caller.admin ? owner : NoTenant(), name};
}

grpc::ServerReadReactor<grpc::ByteBuffer>* OptimizerStateService::RegisterGroup(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  absl::StatusOr<Caller> caller = CallerOf(context);
  absl::StatusOr<LeaseClaim> lease = caller.ok() ? LeaseClaimOf(context) : caller.status();
  if (!lease.ok()) return new RefusedReadReactor<grpc::ByteBuffer>(ToGrpcStatus(lease.status()));
  return new RegisterReactor(engine_, caller->tenant, response, &streams_, std::move(*lease));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* OptimizerStateService::Step(
    grpc::CallbackServerContext* context) {
  absl::StatusOr<Caller> caller = CallerOf(context);
  absl::StatusOr<LeaseClaim> lease = caller.ok() ? LeaseClaimOf(context) : caller.status();
  absl::StatusOr<StreamSlot> slot =
      lease.ok() ? stream_limit_.Acquire(caller->tenant) : lease.status();
  if (!slot.ok()) {
    return new RefusedBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>(ToGrpcStatus(slot.status()));
  }
  return new StepReactor(engine_, caller->tenant, max_reply_bytes_, &streams_, regions_,
                         step_metrics_, std::move(*slot), std::move(*lease), &step_stream_bytes_);
}

grpc::ServerUnaryReactor* OptimizerStateService::GetStats(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  // A call refused during the shutdown does none of the work.
  grpc::ServerUnaryReactor* reactor;
  if (!unary_calls_.Begin(context, &reactor)) return reactor;
  v1::GetStatsRequest parsed;
  v1::GetStatsResponse reply;
  absl::StatusOr<Caller> caller = CallerOf(context);
  absl::Status status = caller.ok() ? ParseRawMessage(*request, &parsed) : caller.status();
  if (status.ok()) status = FillStats(*caller, parsed, &reply);
  Reply(reactor, std::move(status), reply, response);
  return reactor;
}

absl::Status OptimizerStateService::FillStats(const Caller& caller,
                                              const v1::GetStatsRequest& request,
                                              v1::GetStatsResponse* response) {
  StateStore* store = engine_->store();
  const std::vector<std::shared_ptr<Group>> groups = VisibleGroups(caller);
  absl::StatusOr<GroupPageStart> start = StartGroupPage(groups, caller.tenant, caller.admin,
                                                        request.page_size(), request.page_token());
  if (!start.ok()) return start.status();
  // A tenant sees its own use and the most it may hold; the daemon-wide
  // figures (other tenants' bytes, every region, the heap, the device's
  // budget, the last checkpoint's size and step, refusals that may name other
  // tenants' groups) only an admin, or anyone when there are no tenants.
  const bool whole_daemon = caller.admin || !tenancy();
  response->set_backend(std::string(engine_->backend()->name()));
  response->set_threads(engine_->pool()->size());
  response->set_cpu_kernel(KernelIsaName(AdamWKernelIsa()));
  if (whole_daemon) {
    response->set_host_bytes(store->host_bytes());
    response->set_max_host_bytes(store->max_host_bytes());
  } else {
    response->set_host_bytes(store->UsageOf(caller.tenant).host_bytes);
    response->set_max_host_bytes(
        std::min(store->max_host_bytes(), authenticator_->QuotaOf(caller.tenant).max_host_bytes));
  }
  BackendStatsToProto(engine_->backend()->Stats(), response->mutable_device());
  if (whole_daemon) {
    const HeapReading heap = ReadHeap();
    response->set_heap_in_use_bytes(heap.in_use_bytes);
    response->set_heap_free_bytes(heap.free_bytes());
    response->set_heap_resident_bytes(ReadHeapResidentBytes());
    if (trimmer_ != nullptr) response->set_heap_trims(trimmer_->trims());
  } else {
    const std::string strategy = response->device().strategy();
    response->mutable_device()->Clear();
    response->mutable_device()->set_strategy(strategy);
  }
  response->set_started_unix_micros(absl::ToUnixMicros(started_));
  response->set_instance_id(instance_id_);
  response->set_has_state_dir(checkpointer_ != nullptr);
  uint64_t restored = 0;
  for (const auto& [tenant, groups] : restored_groups_) {
    if (whole_daemon || tenant == caller.tenant) restored += groups;
  }
  response->set_restored_groups(restored);
  response->set_lease_seconds(absl::ToInt64Seconds(store->lease_term()));
  // Totals over every group, on every page.
  if (checkpointer_ != nullptr) {
    CheckpointStatsToProto(checkpointer_->Stats(), whole_daemon, caller.tenant, response);
  }
  if (regions_ != nullptr && whole_daemon) {
    const RegionRegistryStats r = regions_->Stats();
    v1::RegionStats* proto = response->mutable_regions();
    proto->set_sessions(r.sessions);
    proto->set_regions(r.regions);
    proto->set_registered_bytes(r.registered_bytes);
    proto->set_mapped_bytes(r.mapped_bytes);
    proto->set_registrations(r.registrations);
    proto->set_step_plans(r.kept);
    proto->set_step_plan_uses(r.kept_found);
  }
  v1::PagingCounters* paging = response->mutable_paging();
  for (const auto& group : groups) {
    const GroupCounters& c = group->counters();
    response->set_total_elements(response->total_elements() + group->num_elements());
    response->set_chunks_applied(response->chunks_applied() + c.chunks_applied.load());
    response->set_chunks_replayed(response->chunks_replayed() + c.chunks_replayed.load());
    response->set_bytes_received(response->bytes_received() + c.bytes_received.load());
    response->set_bytes_sent(response->bytes_sent() + c.bytes_sent.load());
    paging->set_page_ins(paging->page_ins() + c.paging.page_ins.load());
    paging->set_page_outs(paging->page_outs() + c.paging.page_outs.load());
    paging->set_bytes_host_to_device(paging->bytes_host_to_device() +
                                     c.paging.bytes_host_to_device.load());
    paging->set_bytes_device_to_host(paging->bytes_device_to_host() +
                                     c.paging.bytes_device_to_host.load());
    paging->set_copy_wait_us(paging->copy_wait_us() + c.paging.copy_wait_us.load());
  }
  response->set_num_groups(groups.size());
  // This page: up to its size, and while the reply stays within the limit.
  size_t bytes = response->ByteSizeLong() + kPageTokenReserve;
  size_t end = start->begin;
  for (; end < groups.size() && end - start->begin < start->limit; ++end) {
    v1::GroupStats stats;
    GroupStatsToProto(*groups[end], &stats);
    if (caller.admin) stats.mutable_info()->set_tenant(groups[end]->key().tenant);
    const size_t entry = stats.ByteSizeLong() + kEntryOverhead;
    if (end > start->begin && bytes + entry > max_reply_bytes_) break;
    bytes += entry;
    *response->add_groups() = std::move(stats);
  }
  response->set_next_page_token(NextGroupPageToken(groups, end, caller.admin));
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* OptimizerStateService::ListGroups(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor;
  if (!unary_calls_.Begin(context, &reactor)) return reactor;
  v1::ListGroupsRequest parsed;
  v1::ListGroupsResponse reply;
  absl::StatusOr<Caller> caller = CallerOf(context);
  absl::Status status = caller.ok() ? ParseRawMessage(*request, &parsed) : caller.status();
  if (status.ok()) status = FillGroupList(*caller, parsed, &reply);
  Reply(reactor, std::move(status), reply, response);
  return reactor;
}

absl::Status OptimizerStateService::FillGroupList(const Caller& caller,
                                                  const v1::ListGroupsRequest& request,
                                                  v1::ListGroupsResponse* response) {
  const std::vector<std::shared_ptr<Group>> groups = VisibleGroups(caller);
  absl::StatusOr<GroupPageStart> start = StartGroupPage(groups, caller.tenant, caller.admin,
                                                        request.page_size(), request.page_token());
  if (!start.ok()) return start.status();
  response->set_num_groups(groups.size());
  size_t bytes = response->ByteSizeLong() + kPageTokenReserve;
  size_t end = start->begin;
  for (; end < groups.size() && end - start->begin < start->limit; ++end) {
    v1::GroupInfo info;
    GroupInfoToProto(*groups[end], &info);
    if (caller.admin) info.set_tenant(groups[end]->key().tenant);
    const size_t entry = info.ByteSizeLong() + kEntryOverhead;
    if (end > start->begin && bytes + entry > max_reply_bytes_) break;
    bytes += entry;
    *response->add_groups() = std::move(info);
  }
  response->set_next_page_token(NextGroupPageToken(groups, end, caller.admin));
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* OptimizerStateService::DescribeGroup(grpc::CallbackServerContext* context,
                                                               const grpc::ByteBuffer* request,
                                                               grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor;
  if (!unary_calls_.Begin(context, &reactor)) return reactor;
  v1::DescribeGroupRequest parsed;
  v1::DescribeGroupResponse reply;
  absl::StatusOr<Caller> caller = CallerOf(context);
  absl::Status status = caller.ok() ? ParseRawMessage(*request, &parsed) : caller.status();
  if (status.ok()) {
    absl::StatusOr<std::shared_ptr<Group>> group = engine_->store()->Find(
        KeyFor(*caller, parsed.has_tenant(), parsed.tenant(), parsed.name()));
    if (group.ok()) {
      GroupStatsToProto(**group, reply.mutable_group());
      if (caller->admin) reply.mutable_group()->mutable_info()->set_tenant((*group)->key().tenant);
    }
    status = group.status();
  }
  Reply(reactor, std::move(status), reply, response);
  return reactor;
}

grpc::ServerUnaryReactor* OptimizerStateService::DeleteGroup(grpc::CallbackServerContext* context,
                                                             const grpc::ByteBuffer* request,
                                                             grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor;
  if (!unary_calls_.Begin(context, &reactor)) return reactor;
  v1::DeleteGroupRequest parsed;
  absl::StatusOr<Caller> caller = CallerOf(context);
  absl::StatusOr<LeaseClaim> lease = caller.ok() ? LeaseClaimOf(context) : caller.status();
  absl::Status status = lease.ok() ? ParseRawMessage(*request, &parsed) : lease.status();
  if (!status.ok()) {
    Reply(reactor, std::move(status), v1::DeleteGroupResponse(), response);
    return reactor;
  }
  // Deleting waits for the group's in-flight chunks: do it on a worker.
  GroupKey key = KeyFor(*caller, parsed.has_tenant(), parsed.tenant(), parsed.name());
  engine_->pool()->Schedule(
      [this, reactor, key = std::move(key), lease = std::move(*lease), response] {
        absl::StatusOr<uint64_t> freed = engine_->store()->Delete(key, lease);
        v1::DeleteGroupResponse reply;
        if (freed.ok()) reply.set_freed_host_bytes(*freed);
        Reply(reactor, freed.status(), reply, response);
      });
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* OptimizerStateService::ExportState(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  absl::StatusOr<Caller> caller = CallerOf(context);
  absl::StatusOr<LeaseClaim> lease = caller.ok() ? LeaseClaimOf(context) : caller.status();
  v1::ExportStateRequest parsed;
  if (lease.ok()) {
    if (absl::Status s = ParseRawMessage(*request, &parsed); !s.ok()) lease = s;
  }
  // An export not read holds its next message (up to a few MiB) in the
  // daemon: counted apart from Step streams, under the same limit.
  absl::StatusOr<StreamSlot> slot =
      lease.ok() ? export_stream_limit_.Acquire(caller->tenant) : lease.status();
  if (!slot.ok()) {
    return new RefusedWriteReactor<grpc::ByteBuffer>(ToGrpcStatus(slot.status()));
  }
  return new ExportReactor(engine_, GroupKey{caller->tenant, parsed.name()}, &streams_,
                           parsed.moved_to(), *lease, std::move(*slot));
}

grpc::ServerReadReactor<grpc::ByteBuffer>* OptimizerStateService::ImportState(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  absl::StatusOr<Caller> caller = CallerOf(context);
  absl::StatusOr<LeaseClaim> lease = caller.ok() ? LeaseClaimOf(context) : caller.status();
  if (!lease.ok()) {
    return new RefusedReadReactor<grpc::ByteBuffer>(ToGrpcStatus(lease.status()));
  }
  return new ImportReactor(engine_, context, caller->tenant, response, &streams_, std::move(*lease),
                           checkpointer_);
}

grpc::ServerUnaryReactor* OptimizerStateService::Checkpoint(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor;
  if (!unary_calls_.Begin(context, &reactor)) return reactor;
  absl::StatusOr<Caller> caller = CallerOf(context);
  v1::CheckpointRequest parsed;
  absl::Status status = caller.ok() ? ParseRawMessage(*request, &parsed) : caller.status();
  if (!status.ok()) {
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  StartCheckpointCall(checkpointer_, context, reactor, caller->tenant, caller->admin || !tenancy(),
                      parsed, response);
  return reactor;
}

grpc::ServerUnaryReactor* OptimizerStateService::RewindJob(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor;
  if (!unary_calls_.Begin(context, &reactor)) return reactor;
  absl::StatusOr<Caller> caller = CallerOf(context);
  absl::StatusOr<LeaseClaim> lease = caller.ok() ? LeaseClaimOf(context) : caller.status();
  v1::RewindJobRequest parsed;
  if (lease.ok()) {
    if (absl::Status s = ParseRawMessage(*request, &parsed); !s.ok()) lease = s;
  }
  if (lease.ok() && parsed.prefix().empty()) {  // The request's own fault first.
    lease = absl::InvalidArgumentError(
        "name a job by its non-empty name prefix (RewindJobRequest.prefix): an empty one "
        "would rewind every group of the tenant");
  }
  if (lease.ok() && checkpointer_ == nullptr) {
    lease = absl::FailedPreconditionError(
        "this optstated runs without --state_dir: it keeps no checkpoints to rewind a job to");
  }
  if (!lease.ok()) {
    reactor->Finish(ToGrpcStatus(lease.status()));
    return reactor;
  }
  JobRewindRequest rewind;
  rewind.tenant = caller->tenant;
  rewind.prefix = parsed.prefix();
  if (parsed.has_step()) rewind.step = parsed.step();
  rewind.validate_only = parsed.validate_only();
  rewind.caller_sees_every_tenant = caller->admin || !tenancy();
  rewind.lease = *std::move(lease);
  // Reading the checkpoint's files, and writing one after, take a while: on
  // a call thread of the checkpointer's, not a step worker. The checkpoint
  // after the rewind is written within the caller's deadline (less a margin,
  // so the answer reaches it) and while it waits for the answer.
  CheckpointCall after;
  const auto deadline = context->deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    const absl::Time given = absl::FromChrono(deadline);
    after.deadline = given - std::min(absl::Milliseconds(250),
                                      std::max(absl::ZeroDuration(), given - absl::Now()) / 10);
  }
  after.cancelled = [context] { return context->IsCancelled(); };
  const bool whole_daemon = caller->admin || !tenancy();
  checkpointer_->RewindAsync(
      std::move(rewind), std::move(after),
      [this, reactor, response, whole_daemon](absl::StatusOr<JobRewindOutcome> outcome) {
        v1::RewindJobResponse reply;
        if (outcome.ok()) {
          reply.set_checkpoint_id(outcome->checkpoint_id);
          reply.set_step(outcome->step);
          for (const std::string& g : outcome->groups) reply.add_groups(g);
          for (const std::string& p : outcome->passed_over) reply.add_passed_over(p);
          reply.set_written_checkpoint_id(outcome->written_checkpoint_id);
          reply.set_not_written(!whole_daemon && !outcome->not_written.empty() &&
                                        outcome->not_written == checkpointer_->writes_refused()
                                    ? kRefusalsForAdmins
                                    : outcome->not_written);
        }
        Reply(reactor, outcome.status(), reply, response);
      });
  return reactor;
}

}  // namespace optstate
