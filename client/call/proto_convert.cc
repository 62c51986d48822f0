// GroupInfo and Stats from their protos, field by field.
#include "client/call/proto_convert.h"

#include "absl/strings/str_cat.h"

namespace optstate::client_internal {
namespace {

Placement PlacementFromProto(v1::Placement placement) {
  switch (placement) {
    case v1::PLACEMENT_HOST:
      return Placement::kHost;
    case v1::PLACEMENT_DEVICE_RESIDENT:
      return Placement::kDeviceResident;
    case v1::PLACEMENT_DEVICE_PAGED:
      return Placement::kDevicePaged;
    default:  // Unspecified, or a value newer than this client.
      return Placement::kUnspecified;
  }
}

LatencyPercentiles LatencyFromProto(const v1::LatencyPercentiles& proto) {
  LatencyPercentiles out;
  out.p50_us = proto.p50_us();
  out.p99_us = proto.p99_us();
  out.samples = proto.samples();
  return out;
}

PagingCounters PagingFromProto(const v1::PagingCounters& proto) {
  PagingCounters out;
  out.page_ins = proto.page_ins();
  out.page_outs = proto.page_outs();
  out.bytes_host_to_device = proto.bytes_host_to_device();
  out.bytes_device_to_host = proto.bytes_device_to_host();
  out.copy_wait_us = proto.copy_wait_us();
  return out;
}

DeviceStats DeviceFromProto(const v1::DeviceStats& proto) {
  DeviceStats out;
  out.strategy = proto.strategy();
  out.budget_total_bytes = proto.budget_total_bytes();
  out.budget_reserved_bytes = proto.budget_reserved_bytes();
  out.budget_target_utilization = proto.budget_target_utilization();
  out.budget_available_bytes = proto.budget_available_bytes();
  out.resident_bytes = proto.resident_bytes();
  out.staging_pool_bytes = proto.staging_pool_bytes();
  out.staging_slots = proto.staging_slots();
  return out;
}

}  // namespace

void HyperparametersToProto(const Hyperparameters& h, v1::AdamWHyperparameters* proto) {
  proto->set_lr(h.lr);
  proto->set_beta1(h.beta1);
  proto->set_beta2(h.beta2);
  proto->set_eps(h.eps);
  proto->set_weight_decay(h.weight_decay);
  proto->set_maximize(h.maximize);
  proto->set_amsgrad(h.amsgrad);
}

Hyperparameters HyperparametersFromProto(const v1::AdamWHyperparameters& proto) {
  Hyperparameters h;
  if (proto.has_lr()) h.lr = proto.lr();
  if (proto.has_beta1()) h.beta1 = proto.beta1();
  if (proto.has_beta2()) h.beta2 = proto.beta2();
  if (proto.has_eps()) h.eps = proto.eps();
  if (proto.has_weight_decay()) h.weight_decay = proto.weight_decay();
  h.maximize = proto.maximize();
  h.amsgrad = proto.amsgrad();
  return h;
}

absl::StatusOr<GroupInfo> GroupInfoFromProto(const v1::GroupInfo& proto) {
  const v1::AdamWHyperparameters& h = proto.hyperparameters();
  if (!h.has_lr() || !h.has_beta1() || !h.has_beta2() || !h.has_eps() || !h.has_weight_decay()) {
    // A daemon of this version fills every field; one that predates double
    // hyperparameters fills only the retired float32 ones, and ignored ours.
    return absl::FailedPreconditionError(absl::StrCat(
        "the daemon describes group '", proto.name(),
        "' without double hyperparameters: it predates them and ignores the ones this client "
        "sends (its groups step with torch's defaults and the group's lr). Upgrade optstated"));
  }
  GroupInfo info;
  info.name = proto.name();
  info.num_elements = proto.num_elements();
  info.hyperparameters = HyperparametersFromProto(h);
  info.page_elements = proto.page_elements();
  info.num_pages = proto.num_pages();
  info.min_step = proto.min_step();
  info.max_step = proto.max_step();
  info.host_bytes = proto.host_bytes();
  info.placement = PlacementFromProto(proto.placement());
  info.pages_awaiting_values = proto.pages_awaiting_values();
  info.tenant = proto.tenant();
  info.moved_to = proto.moved_to();
  if (proto.has_lease()) {
    const v1::Lease& l = proto.lease();
    info.lease = Lease{l.holder(), l.job(), l.host(), l.pid(), l.last_call_unix_micros(),
                       l.expires_unix_micros(), l.expired()};
  }
  if (proto.has_last_step()) {
    const v1::LastStep& l = proto.last_step();
    info.last_step =
        LastStep{l.step(), l.lr(), l.beta1(), l.beta2(), l.eps(), l.weight_decay(), l.maximize()};
  }
  return info;
}

absl::StatusOr<Stats> StatsFromProto(const v1::GetStatsResponse& proto) {
  Stats out;
  out.backend = proto.backend();
  out.num_groups = proto.num_groups();
  out.total_elements = proto.total_elements();
  out.host_bytes = proto.host_bytes();
  out.max_host_bytes = proto.max_host_bytes();
  out.chunks_applied = proto.chunks_applied();
  out.chunks_replayed = proto.chunks_replayed();
  out.bytes_received = proto.bytes_received();
  out.bytes_sent = proto.bytes_sent();
  out.paging = PagingFromProto(proto.paging());
  out.device = DeviceFromProto(proto.device());
  out.threads = proto.threads();
  if (proto.has_last_checkpoint()) {
    const v1::CheckpointInfo& c = proto.last_checkpoint();
    out.last_checkpoint =
        CheckpointInfo{c.id(), c.step(), c.bytes(), c.duration_seconds(), c.finished_unix_micros()};
  }
  out.checkpoints_written = proto.checkpoints_written();
  out.checkpoint_failures = proto.checkpoint_failures();
  out.last_checkpoint_error = proto.last_checkpoint_error();
  out.restored_checkpoint_id = proto.restored_checkpoint_id();
  out.cpu_kernel = proto.cpu_kernel();
  out.restore_refusals.assign(proto.restore_refusals().begin(), proto.restore_refusals().end());
  const v1::RegionStats& regions = proto.regions();
  out.regions =
      RegionStats{regions.sessions(),      regions.regions(),       regions.registered_bytes(),
                  regions.mapped_bytes(),  regions.registrations(), regions.step_plans(),
                  regions.step_plan_uses()};
  out.heap = HeapStats{proto.heap_in_use_bytes(), proto.heap_free_bytes(),
                       proto.heap_resident_bytes(), proto.heap_trims()};
  out.started_unix_micros = proto.started_unix_micros();
  out.has_state_dir = proto.has_state_dir();
  out.restored_groups = proto.restored_groups();
  out.lease_seconds = proto.lease_seconds();
  out.instance_id = proto.instance_id();
  out.groups.reserve(proto.groups_size());
  for (const v1::GroupStats& g : proto.groups()) {
    absl::StatusOr<GroupInfo> info = GroupInfoFromProto(g.info());
    if (!info.ok()) return info.status();
    GroupStats& stats = out.groups.emplace_back();
    stats.info = *std::move(info);
    stats.steps_completed = g.steps_completed();
    stats.chunks_applied = g.chunks_applied();
    stats.chunks_replayed = g.chunks_replayed();
    stats.bytes_received = g.bytes_received();
    stats.bytes_sent = g.bytes_sent();
    stats.step_latency = LatencyFromProto(g.step_latency());
    stats.chunk_latency = LatencyFromProto(g.chunk_latency());
    stats.paging = PagingFromProto(g.paging());
  }
  return out;
}

}  // namespace optstate::client_internal
