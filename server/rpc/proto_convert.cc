// Field-by-field translation between optstate.v1 messages and server types.
#include "server/rpc/proto_convert.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace optstate {

absl::StatusOr<WireType> WireTypeFromProto(v1::DType dtype, absl::string_view field) {
  std::optional<WireType> type = WireTypeFromProtoValue(dtype);
  if (type) return *type;
  return absl::InvalidArgumentError(
      absl::StrCat(field, " has unknown dtype ", static_cast<int>(dtype),
                   "; use DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_FLOAT16"));
}

absl::StatusOr<AdamWHyperparameters> HyperparametersFromProto(
    const v1::AdamWHyperparameters& proto) {
  if (proto.has_lr_float32() || proto.has_beta1_float32() || proto.has_beta2_float32() ||
      proto.has_eps_float32() || proto.has_weight_decay_float32()) {
    return absl::InvalidArgumentError(
        "hyperparameters set a retired float32 field (*_float32, fields 1-5): send them as "
        "doubles in lr, beta1, beta2, eps and weight_decay (fields 6-10); this client "
        "predates them and must be rebuilt");
  }
  AdamWHyperparameters h;
  if (proto.has_lr()) h.lr = proto.lr();
  if (proto.has_beta1()) h.beta1 = proto.beta1();
  if (proto.has_beta2()) h.beta2 = proto.beta2();
  if (proto.has_eps()) h.eps = proto.eps();
  if (proto.has_weight_decay()) h.weight_decay = proto.weight_decay();
  if (proto.has_maximize()) h.maximize = proto.maximize();
  if (proto.has_amsgrad()) h.amsgrad = proto.amsgrad();
  return h;
}

void HyperparametersToProto(const AdamWHyperparameters& h, v1::AdamWHyperparameters* proto) {
  proto->set_lr(h.lr);
  proto->set_beta1(h.beta1);
  proto->set_beta2(h.beta2);
  proto->set_eps(h.eps);
  proto->set_weight_decay(h.weight_decay);
  proto->set_maximize(h.maximize);
  proto->set_amsgrad(h.amsgrad);
}

namespace {

v1::Placement PlacementToProto(Placement placement) {
  switch (placement) {
    case Placement::kHost:
      return v1::PLACEMENT_HOST;
    case Placement::kDeviceResident:
      return v1::PLACEMENT_DEVICE_RESIDENT;
    case Placement::kDevicePaged:
      return v1::PLACEMENT_DEVICE_PAGED;
  }
  return v1::PLACEMENT_UNSPECIFIED;
}

void PercentilesToProto(const Percentiles& p, v1::LatencyPercentiles* proto) {
  proto->set_p50_us(p.p50_us);
  proto->set_p99_us(p.p99_us);
  proto->set_samples(p.samples);
}

}  // namespace

void GroupInfoToProto(const Group& group, v1::GroupInfo* proto) {
  proto->set_name(group.key().name);
  proto->set_num_elements(group.num_elements());
  HyperparametersToProto(group.config().hyperparameters, proto->mutable_hyperparameters());
  proto->set_page_elements(group.page_elements());
  proto->set_num_pages(group.num_pages());
  proto->set_min_step(group.MinStep());
  proto->set_max_step(group.MaxStep());
  proto->set_host_bytes(group.host_bytes());
  proto->set_placement(PlacementToProto(group.placement()));
  proto->set_pages_awaiting_values(group.PagesAwaitingValues());
  if (std::optional<LeaseView> lease = group.lease().View(absl::Now()); lease.has_value()) {
    v1::Lease* out = proto->mutable_lease();
    out->set_holder(lease->holder.id);
    out->set_job(lease->holder.job);
    out->set_host(lease->holder.host);
    out->set_pid(lease->holder.pid);
    out->set_last_call_unix_micros(absl::ToUnixMicros(lease->last_call));
    out->set_expires_unix_micros(absl::ToUnixMicros(lease->expires));
    out->set_expired(lease->expired);
  }
  if (group.move().sealed()) proto->set_moved_to(group.move().moved_to());
  if (std::optional<SteppedWith> last = group.last_step().Get(); last.has_value()) {
    v1::LastStep* out = proto->mutable_last_step();
    const AdamWHyperparameters& h = last->hyperparameters;
    out->set_step(last->step);
    out->set_lr(h.lr);
    out->set_beta1(h.beta1);
    out->set_beta2(h.beta2);
    out->set_eps(h.eps);
    out->set_weight_decay(h.weight_decay);
    out->set_maximize(h.maximize);
  }
}

void GroupStatsToProto(const Group& group, v1::GroupStats* proto) {
  GroupInfoToProto(group, proto->mutable_info());
  const GroupCounters& c = group.counters();
  proto->set_steps_completed(proto->info().min_step());
  proto->set_chunks_applied(c.chunks_applied.load());
  proto->set_chunks_replayed(c.chunks_replayed.load());
  proto->set_bytes_received(c.bytes_received.load());
  proto->set_bytes_sent(c.bytes_sent.load());
  PercentilesToProto(c.step_latency.Summarize(), proto->mutable_step_latency());
  PercentilesToProto(c.chunk_latency.Summarize(), proto->mutable_chunk_latency());
  v1::PagingCounters* paging = proto->mutable_paging();
  paging->set_page_ins(c.paging.page_ins.load());
  paging->set_page_outs(c.paging.page_outs.load());
  paging->set_bytes_host_to_device(c.paging.bytes_host_to_device.load());
  paging->set_bytes_device_to_host(c.paging.bytes_device_to_host.load());
  paging->set_copy_wait_us(c.paging.copy_wait_us.load());
}

void BackendStatsToProto(const BackendStats& stats, v1::DeviceStats* proto) {
  proto->set_strategy(stats.strategy);
  proto->set_budget_total_bytes(stats.budget_total_bytes);
  proto->set_budget_reserved_bytes(stats.budget_reserved_bytes);
  proto->set_budget_target_utilization(stats.budget_target_utilization);
  proto->set_budget_available_bytes(stats.budget_available_bytes);
  proto->set_resident_bytes(stats.resident_bytes);
  proto->set_staging_pool_bytes(stats.staging_pool_bytes);
  proto->set_staging_slots(stats.staging_slots);
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  absl::string_view message = status.message();
  if (message.size() <= kMaxStatusMessageBytes) {
    return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(message));
  }
  return grpc::Status(
      static_cast<grpc::StatusCode>(status.code()),
      absl::StrCat(message.substr(0, kMaxStatusMessageBytes), "... (", message.size(), " bytes)"));
}

}  // namespace optstate
