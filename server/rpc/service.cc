// RPC handlers: streams get reactors; unary calls parse their request
// (raw_message.h) and answer inline (they only read counters or take the
// store's lock briefly), except DeleteGroup, which waits on a worker.
#include "server/rpc/service.h"

#include "server/rpc/proto_convert.h"
#include "server/rpc/raw_message.h"
#include "server/rpc/register_reactor.h"
#include "server/rpc/step_reactor.h"

namespace optstate {
namespace {

// Finishes with `status`; when OK, with `reply` serialized into `response`.
void Reply(grpc::ServerUnaryReactor* reactor, absl::Status status,
           const google::protobuf::Message& reply, grpc::ByteBuffer* response) {
  if (status.ok()) status = SerializeRawMessage(reply, response);
  reactor->Finish(ToGrpcStatus(status));
}

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* OptimizerStateService::RegisterGroup(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new RegisterReactor(engine_, TenantOf(context), response, &streams_);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* OptimizerStateService::Step(
    grpc::CallbackServerContext* context) {
  return new StepReactor(engine_, TenantOf(context), max_reply_bytes_, &streams_);
}

grpc::ServerUnaryReactor* OptimizerStateService::GetStats(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  v1::GetStatsRequest parsed;
  v1::GetStatsResponse reply;
  absl::Status status = ParseRawMessage(*request, &parsed);
  if (status.ok()) status = GetStats(TenantOf(context), parsed, &reply);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Reply(reactor, std::move(status), reply, response);
  return reactor;
}

absl::Status OptimizerStateService::GetStats(const std::string& tenant,
                                             const v1::GetStatsRequest& request,
                                             v1::GetStatsResponse* response) {
  StateStore* store = engine_->store();
  response->set_backend(std::string(engine_->backend()->name()));
  response->set_threads(engine_->pool()->size());
  response->set_host_bytes(store->host_bytes());
  response->set_max_host_bytes(store->max_host_bytes());
  BackendStatsToProto(engine_->backend()->Stats(), response->mutable_device());
  v1::PagingCounters* paging = response->mutable_paging();
  for (const auto& group : store->List(tenant)) {
    v1::GroupStats* stats = response->add_groups();
    GroupStatsToProto(*group, stats);
    response->set_num_groups(response->num_groups() + 1);
    response->set_total_elements(response->total_elements() + group->num_elements());
    response->set_chunks_applied(response->chunks_applied() + stats->chunks_applied());
    response->set_chunks_replayed(response->chunks_replayed() + stats->chunks_replayed());
    response->set_bytes_received(response->bytes_received() + stats->bytes_received());
    response->set_bytes_sent(response->bytes_sent() + stats->bytes_sent());
    paging->set_page_ins(paging->page_ins() + stats->paging().page_ins());
    paging->set_page_outs(paging->page_outs() + stats->paging().page_outs());
    paging->set_bytes_host_to_device(paging->bytes_host_to_device() +
                                     stats->paging().bytes_host_to_device());
    paging->set_bytes_device_to_host(paging->bytes_device_to_host() +
                                     stats->paging().bytes_device_to_host());
    paging->set_copy_wait_us(paging->copy_wait_us() + stats->paging().copy_wait_us());
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* OptimizerStateService::ListGroups(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  v1::ListGroupsRequest parsed;
  v1::ListGroupsResponse reply;
  absl::Status status = ParseRawMessage(*request, &parsed);
  if (status.ok()) status = ListGroups(TenantOf(context), parsed, &reply);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Reply(reactor, std::move(status), reply, response);
  return reactor;
}

absl::Status OptimizerStateService::ListGroups(const std::string& tenant,
                                               const v1::ListGroupsRequest& request,
                                               v1::ListGroupsResponse* response) {
  for (const auto& group : engine_->store()->List(tenant)) {
    GroupInfoToProto(*group, response->add_groups());
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* OptimizerStateService::DescribeGroup(grpc::CallbackServerContext* context,
                                                               const grpc::ByteBuffer* request,
                                                               grpc::ByteBuffer* response) {
  v1::DescribeGroupRequest parsed;
  v1::DescribeGroupResponse reply;
  absl::Status status = ParseRawMessage(*request, &parsed);
  if (status.ok()) {
    absl::StatusOr<std::shared_ptr<Group>> group =
        engine_->store()->Find(GroupKey{TenantOf(context), parsed.name()});
    if (group.ok()) GroupStatsToProto(**group, reply.mutable_group());
    status = group.status();
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Reply(reactor, std::move(status), reply, response);
  return reactor;
}

grpc::ServerUnaryReactor* OptimizerStateService::DeleteGroup(grpc::CallbackServerContext* context,
                                                             const grpc::ByteBuffer* request,
                                                             grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  v1::DeleteGroupRequest parsed;
  absl::Status status = ParseRawMessage(*request, &parsed);
  if (!status.ok()) {
    Reply(reactor, std::move(status), v1::DeleteGroupResponse(), response);
    return reactor;
  }
  // Deleting waits for the group's in-flight chunks: do it on a worker.
  GroupKey key{TenantOf(context), parsed.name()};
  engine_->pool()->Schedule([this, reactor, key = std::move(key), response] {
    absl::StatusOr<uint64_t> freed = engine_->store()->Delete(key);
    v1::DeleteGroupResponse reply;
    if (freed.ok()) reply.set_freed_host_bytes(*freed);
    Reply(reactor, freed.status(), reply, response);
  });
  return reactor;
}

}  // namespace optstate
