// RPC handlers: streams get reactors; unary calls answer inline (they only
// read counters or take the store's lock briefly).
#include "server/rpc/service.h"

#include "server/rpc/proto_convert.h"
#include "server/rpc/register_reactor.h"
#include "server/rpc/step_reactor.h"

namespace optstate {
namespace {

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerReadReactor<v1::RegisterGroupRequest>* OptimizerStateService::RegisterGroup(
    grpc::CallbackServerContext* context, v1::RegisterGroupResponse* response) {
  return new RegisterReactor(engine_, TenantOf(context), response);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* OptimizerStateService::Step(
    grpc::CallbackServerContext* context) {
  return new StepReactor(engine_, TenantOf(context), max_reply_bytes_, regions_);
}

grpc::ServerUnaryReactor* OptimizerStateService::GetStats(grpc::CallbackServerContext* context,
                                                          const v1::GetStatsRequest*,
                                                          v1::GetStatsResponse* response) {
  StateStore* store = engine_->store();
  response->set_backend(std::string(engine_->backend()->name()));
  response->set_threads(engine_->pool()->size());
  response->set_host_bytes(store->host_bytes());
  response->set_max_host_bytes(store->max_host_bytes());
  BackendStatsToProto(engine_->backend()->Stats(), response->mutable_device());
  v1::PagingCounters* paging = response->mutable_paging();
  for (const auto& group : store->List(TenantOf(context))) {
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
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OptimizerStateService::ListGroups(grpc::CallbackServerContext* context,
                                                            const v1::ListGroupsRequest*,
                                                            v1::ListGroupsResponse* response) {
  for (const auto& group : engine_->store()->List(TenantOf(context))) {
    GroupInfoToProto(*group, response->add_groups());
  }
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OptimizerStateService::DescribeGroup(
    grpc::CallbackServerContext* context, const v1::DescribeGroupRequest* request,
    v1::DescribeGroupResponse* response) {
  absl::StatusOr<std::shared_ptr<Group>> group =
      engine_->store()->Find(GroupKey{TenantOf(context), request->name()});
  if (group.ok()) GroupStatsToProto(**group, response->mutable_group());
  return Answer(context, group.status());
}

grpc::ServerUnaryReactor* OptimizerStateService::DeleteGroup(grpc::CallbackServerContext* context,
                                                             const v1::DeleteGroupRequest* request,
                                                             v1::DeleteGroupResponse* response) {
  // Deleting waits for the group's in-flight chunks: do it on a worker.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  GroupKey key{TenantOf(context), request->name()};
  engine_->pool()->Schedule([this, reactor, key = std::move(key), response] {
    absl::StatusOr<uint64_t> freed = engine_->store()->Delete(key);
    if (freed.ok()) response->set_freed_host_bytes(*freed);
    reactor->Finish(ToGrpcStatus(freed.status()));
  });
  return reactor;
}

}  // namespace optstate
