// The client's reading of GetStatsResponse into optstate::Stats: every field
// arrives, each from its own proto field (distinct values catch a swap), and
// a group whose info lacks double hyperparameters fails the whole reply.
#include <gtest/gtest.h>

#include "client/call/proto_convert.h"
#include "optstate/v1/optstate.pb.h"

namespace optstate {
namespace {

void FillInfo(v1::GroupInfo* info, const std::string& name, uint64_t base) {
  info->set_name(name);
  info->set_num_elements(base + 1);
  info->set_page_elements(base + 2);
  info->set_num_pages(base + 3);
  info->set_min_step(base + 4);
  info->set_max_step(base + 5);
  info->set_host_bytes(base + 6);
  info->set_placement(v1::PLACEMENT_DEVICE_PAGED);
  info->set_pages_awaiting_values(base + 7);
  v1::AdamWHyperparameters* h = info->mutable_hyperparameters();
  h->set_lr(0.25);
  h->set_beta1(0.5);
  h->set_beta2(0.75);
  h->set_eps(1e-6);
  h->set_weight_decay(0.125);
}

void FillPaging(v1::PagingCounters* p, uint64_t base) {
  p->set_page_ins(base + 1);
  p->set_page_outs(base + 2);
  p->set_bytes_host_to_device(base + 3);
  p->set_bytes_device_to_host(base + 4);
  p->set_copy_wait_us(base + 5);
}

void ExpectPaging(const PagingCounters& p, uint64_t base) {
  EXPECT_EQ(p.page_ins, base + 1);
  EXPECT_EQ(p.page_outs, base + 2);
  EXPECT_EQ(p.bytes_host_to_device, base + 3);
  EXPECT_EQ(p.bytes_device_to_host, base + 4);
  EXPECT_EQ(p.copy_wait_us, base + 5);
}

v1::GetStatsResponse Response() {
  v1::GetStatsResponse r;
  r.set_backend("cuda");
  r.set_num_groups(2);
  r.set_total_elements(11);
  r.set_host_bytes(12);
  r.set_max_host_bytes(13);
  r.set_chunks_applied(14);
  r.set_chunks_replayed(15);
  r.set_bytes_received(16);
  r.set_bytes_sent(17);
  r.set_threads(18);
  FillPaging(r.mutable_paging(), 100);
  v1::DeviceStats* d = r.mutable_device();
  d->set_strategy("adaptive");
  d->set_budget_total_bytes(201);
  d->set_budget_reserved_bytes(202);
  d->set_budget_target_utilization(0.875);
  d->set_budget_available_bytes(203);
  d->set_resident_bytes(204);
  d->set_staging_pool_bytes(205);
  d->set_staging_slots(206);
  v1::RegionStats* regions = r.mutable_regions();
  regions->set_sessions(301);
  regions->set_regions(302);
  regions->set_registered_bytes(303);
  regions->set_mapped_bytes(304);
  regions->set_registrations(305);
  r.set_heap_in_use_bytes(401);
  r.set_heap_free_bytes(402);
  r.set_heap_resident_bytes(403);
  r.set_heap_trims(404);
  for (int i = 0; i < 2; ++i) {
    const uint64_t base = 1000 * (i + 1);
    v1::GroupStats* g = r.add_groups();
    FillInfo(g->mutable_info(), "g" + std::to_string(i), base);
    g->set_steps_completed(base + 10);
    g->set_chunks_applied(base + 11);
    g->set_chunks_replayed(base + 12);
    g->set_bytes_received(base + 13);
    g->set_bytes_sent(base + 14);
    g->mutable_step_latency()->set_p50_us(base + 15.5);
    g->mutable_step_latency()->set_p99_us(base + 16.5);
    g->mutable_step_latency()->set_samples(base + 17);
    g->mutable_chunk_latency()->set_p50_us(base + 18.5);
    g->mutable_chunk_latency()->set_p99_us(base + 19.5);
    g->mutable_chunk_latency()->set_samples(base + 20);
    FillPaging(g->mutable_paging(), base + 100);
  }
  return r;
}

TEST(StatsFromProto, CarriesEveryFieldFromItsOwnProtoField) {
  absl::StatusOr<Stats> stats = client_internal::StatsFromProto(Response());
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->backend, "cuda");
  EXPECT_EQ(stats->num_groups, 2u);
  EXPECT_EQ(stats->total_elements, 11u);
  EXPECT_EQ(stats->host_bytes, 12u);
  EXPECT_EQ(stats->max_host_bytes, 13u);
  EXPECT_EQ(stats->chunks_applied, 14u);
  EXPECT_EQ(stats->chunks_replayed, 15u);
  EXPECT_EQ(stats->bytes_received, 16u);
  EXPECT_EQ(stats->bytes_sent, 17u);
  EXPECT_EQ(stats->threads, 18u);
  ExpectPaging(stats->paging, 100);
  EXPECT_EQ(stats->device.strategy, "adaptive");
  EXPECT_EQ(stats->device.budget_total_bytes, 201u);
  EXPECT_EQ(stats->device.budget_reserved_bytes, 202u);
  EXPECT_EQ(stats->device.budget_target_utilization, 0.875);
  EXPECT_EQ(stats->device.budget_available_bytes, 203u);
  EXPECT_EQ(stats->device.resident_bytes, 204u);
  EXPECT_EQ(stats->device.staging_pool_bytes, 205u);
  EXPECT_EQ(stats->device.staging_slots, 206u);
  EXPECT_EQ(stats->regions.sessions, 301u);
  EXPECT_EQ(stats->regions.regions, 302u);
  EXPECT_EQ(stats->regions.registered_bytes, 303u);
  EXPECT_EQ(stats->regions.mapped_bytes, 304u);
  EXPECT_EQ(stats->regions.registrations, 305u);
  EXPECT_EQ(stats->heap.in_use_bytes, 401u);
  EXPECT_EQ(stats->heap.free_bytes, 402u);
  EXPECT_EQ(stats->heap.resident_bytes, 403u);
  EXPECT_EQ(stats->heap.trims, 404u);
  ASSERT_EQ(stats->groups.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    const uint64_t base = 1000 * (i + 1);
    const GroupStats& g = stats->groups[i];
    EXPECT_EQ(g.info.name, "g" + std::to_string(i));
    EXPECT_EQ(g.info.num_elements, base + 1);
    EXPECT_EQ(g.info.page_elements, base + 2);
    EXPECT_EQ(g.info.num_pages, base + 3);
    EXPECT_EQ(g.info.min_step, base + 4);
    EXPECT_EQ(g.info.max_step, base + 5);
    EXPECT_EQ(g.info.host_bytes, base + 6);
    EXPECT_EQ(g.info.placement, Placement::kDevicePaged);
    EXPECT_EQ(g.info.pages_awaiting_values, base + 7);
    EXPECT_EQ(g.info.hyperparameters.lr, 0.25);
    EXPECT_EQ(g.info.hyperparameters.beta1, 0.5);
    EXPECT_EQ(g.info.hyperparameters.beta2, 0.75);
    EXPECT_EQ(g.info.hyperparameters.eps, 1e-6);
    EXPECT_EQ(g.info.hyperparameters.weight_decay, 0.125);
    EXPECT_FALSE(g.info.created);
    EXPECT_EQ(g.steps_completed, base + 10);
    EXPECT_EQ(g.chunks_applied, base + 11);
    EXPECT_EQ(g.chunks_replayed, base + 12);
    EXPECT_EQ(g.bytes_received, base + 13);
    EXPECT_EQ(g.bytes_sent, base + 14);
    EXPECT_EQ(g.step_latency.p50_us, base + 15.5);
    EXPECT_EQ(g.step_latency.p99_us, base + 16.5);
    EXPECT_EQ(g.step_latency.samples, base + 17);
    EXPECT_EQ(g.chunk_latency.p50_us, base + 18.5);
    EXPECT_EQ(g.chunk_latency.p99_us, base + 19.5);
    EXPECT_EQ(g.chunk_latency.samples, base + 20);
    ExpectPaging(g.paging, base + 100);
  }
}

TEST(StatsFromProto, EachPlacementIsItsOwn) {
  const std::pair<v1::Placement, Placement> pairs[] = {
      {v1::PLACEMENT_UNSPECIFIED, Placement::kUnspecified},
      {v1::PLACEMENT_HOST, Placement::kHost},
      {v1::PLACEMENT_DEVICE_RESIDENT, Placement::kDeviceResident},
      {v1::PLACEMENT_DEVICE_PAGED, Placement::kDevicePaged},
      {static_cast<v1::Placement>(77), Placement::kUnspecified},  // Newer than this client.
  };
  for (const auto& [proto, expected] : pairs) {
    v1::GroupInfo info;
    FillInfo(&info, "p", 0);
    info.set_placement(proto);
    absl::StatusOr<GroupInfo> out = client_internal::GroupInfoFromProto(info);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->placement, expected) << static_cast<int>(proto);
  }
}

TEST(StatsFromProto, AGroupWithoutDoubleHyperparametersFailsTheReply) {
  v1::GetStatsResponse r = Response();
  r.mutable_groups(1)->mutable_info()->mutable_hyperparameters()->clear_eps();
  absl::StatusOr<Stats> stats = client_internal::StatsFromProto(r);
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kFailedPrecondition) << stats.status();
  EXPECT_NE(stats.status().message().find("'g1'"), std::string::npos) << stats.status();
}

}  // namespace
}  // namespace optstate
