#include "server/metrics/daemon_metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "server/kernels/adamw_kernel.h"

namespace optstate {

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

// Families are built whole, then appended: no reference into `out` is held
// while it grows.
class FamilyBuilder {
 public:
  FamilyBuilder(std::string name, std::string help, MetricType type) {
    family_.name = std::move(name);
    family_.help = std::move(help);
    family_.type = type;
  }

  FamilyBuilder& Value(double value, Labels labels = {}) {
    ClientMetric metric;
    metric.label = std::move(labels);
    if (family_.type == MetricType::Counter) {
      metric.counter.value = value;
    } else {
      metric.gauge.value = value;
    }
    family_.metric.push_back(std::move(metric));
    return *this;
  }

  FamilyBuilder& Histogram(const DurationHistogram::Snapshot& snapshot, Labels labels = {}) {
    ClientMetric metric;
    metric.label = std::move(labels);
    metric.histogram.sample_count = snapshot.count;
    metric.histogram.sample_sum = snapshot.sum_seconds;
    uint64_t cumulative = 0;
    for (size_t i = 0; i < DurationHistogram::kBuckets; ++i) {
      cumulative += snapshot.counts[i];
      ClientMetric::Bucket bucket;
      bucket.cumulative_count = cumulative;
      bucket.upper_bound = i < DurationHistogram::kBoundsSeconds.size()
                               ? DurationHistogram::kBoundsSeconds[i]
                               : std::numeric_limits<double>::infinity();
      metric.histogram.bucket.push_back(bucket);
    }
    family_.metric.push_back(std::move(metric));
    return *this;
  }

  void AppendTo(std::vector<MetricFamily>& out) { out.push_back(std::move(family_)); }

 private:
  MetricFamily family_;
};

void Gauge(std::vector<MetricFamily>& out, std::string name, std::string help, double value) {
  FamilyBuilder(std::move(name), std::move(help), MetricType::Gauge).Value(value).AppendTo(out);
}

void Counter(std::vector<MetricFamily>& out, std::string name, std::string help, double value) {
  FamilyBuilder(std::move(name), std::move(help), MetricType::Counter).Value(value).AppendTo(out);
}

// Resident set size from /proc/self/statm (pages); 0 when unreadable.
uint64_t ProcessResidentBytes() {
  std::FILE* file = std::fopen("/proc/self/statm", "r");
  if (file == nullptr) return 0;
  unsigned long long size_pages = 0, resident_pages = 0;
  const int read = std::fscanf(file, "%llu %llu", &size_pages, &resident_pages);
  std::fclose(file);
  if (read != 2) return 0;
  return resident_pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

std::string StatusCodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// `regions` (may be null): its socket's refusals count in optstate_refusals_total.
void CollectCalls(const CallMetrics& calls, const RegionRegistry* regions,
                  std::vector<MetricFamily>& out) {
  FamilyBuilder started("grpc_server_call_started_total",
                        "Calls started, by method (gRFC A66 grpc.server.call.started)",
                        MetricType::Counter);
  FamilyBuilder duration(
      "grpc_server_call_duration_seconds",
      "Calls from start to the status sent, by method and status (gRFC A66 "
      "grpc.server.call.duration); a call ended with no status sent counts as CANCELLED",
      MetricType::Histogram);
  std::vector<uint64_t> refused(CallMetrics::kStatusCodes, 0);
  for (size_t m = 0; m < calls.num_methods(); ++m) {
    started.Value(static_cast<double>(calls.started(m)), {{"grpc_method", calls.method_name(m)}});
    for (int code = 0; code < CallMetrics::kStatusCodes; ++code) {
      const DurationHistogram::Snapshot snapshot = calls.durations(m, code);
      if (snapshot.count == 0) continue;  // Only the pairs that happened.
      refused[code] += snapshot.count;
      duration.Histogram(snapshot, {{"grpc_method", calls.method_name(m)},
                                    {"grpc_status", StatusCodeName(code)}});
    }
  }
  started.AppendTo(out);
  duration.AppendTo(out);
  if (regions != nullptr) {
    const RegionRegistryStats stats = regions->Stats();
    for (size_t code = 1; code < stats.refusals.size() && code < refused.size(); ++code) {
      refused[code] += stats.refusals[code];
    }
  }
  FamilyBuilder refusals("optstate_refusals_total",
                         "Calls ended with a status other than OK, by status code, every method; "
                         "and region socket requests refused",
                         MetricType::Counter);
  for (int code = 1; code < CallMetrics::kStatusCodes; ++code) {
    refusals.Value(static_cast<double>(refused[code]), {{"code", StatusCodeName(code)}});
  }
  refusals.AppendTo(out);
}

void CollectStepStreams(const StepStreamMetrics& steps, std::vector<MetricFamily>& out) {
  FamilyBuilder phases("optstate_step_phase_seconds",
                       "Per Step message: receive (read into the engine's terms), compute (checks "
                       "and AdamW on a worker), send (the reply written by gRPC)",
                       MetricType::Histogram);
  phases.Histogram(steps.receive.Read(), {{"phase", "receive"}})
      .Histogram(steps.compute.Read(), {{"phase", "compute"}})
      .Histogram(steps.send.Read(), {{"phase", "send"}})
      .AppendTo(out);
  auto load = [](const std::atomic<uint64_t>& v) {
    return static_cast<double>(v.load(std::memory_order_relaxed));
  };
  FamilyBuilder("optstate_data_plane_bytes_total",
                "Step bytes by data plane: wire (Step messages and replies as gRPC carried them), "
                "shared_memory (region slices of applied messages); in: to the daemon",
                MetricType::Counter)
      .Value(load(steps.wire_bytes_in), {{"plane", "wire"}, {"direction", "in"}})
      .Value(load(steps.wire_bytes_out), {{"plane", "wire"}, {"direction", "out"}})
      .Value(load(steps.shared_memory_bytes_in), {{"plane", "shared_memory"}, {"direction", "in"}})
      .Value(load(steps.shared_memory_bytes_out), {{"plane", "shared_memory"}, {"direction", "out"}})
      .AppendTo(out);
}

void CollectState(const StepEngine& engine, std::vector<MetricFamily>& out) {
  const StateStore& store = *engine.store();
  const std::vector<std::shared_ptr<Group>> groups = store.ListAll();
  uint64_t elements = 0;
  for (const auto& group : groups) elements += group->num_elements();
  Gauge(out, "optstate_groups", "Groups held, every tenant", static_cast<double>(groups.size()));
  Gauge(out, "optstate_group_elements", "Elements of the groups held",
        static_cast<double>(elements));
  Gauge(out, "optstate_host_bytes", "Host bytes of the groups held and registrations under way",
        static_cast<double>(store.host_bytes()));
  Gauge(out, "optstate_max_host_bytes", "The host-bytes limit (--max_host_bytes)",
        static_cast<double>(store.max_host_bytes()));

  const CounterTotals totals = store.counter_totals();
  Counter(out, "optstate_steps_completed_total",
          "Group steps of which every page has been applied",
          static_cast<double>(totals.steps_completed));
  Counter(out, "optstate_chunks_applied_total", "Step chunks that applied at least one page",
          static_cast<double>(totals.chunks_applied));
  Counter(out, "optstate_chunks_replayed_total",
          "Step chunks whose pages were all at their step already (a resend, answered again)",
          static_cast<double>(totals.chunks_replayed));
  Counter(out, "optstate_gradient_bytes_total",
          "Gradient bytes of step chunks and initial values taken, any data plane",
          static_cast<double>(totals.bytes_received));
  Counter(out, "optstate_params_bytes_total", "Params bytes the steps wrote back, any data plane",
          static_cast<double>(totals.bytes_sent));

  Counter(out, "optstate_paging_page_ins_total", "Pages brought into device memory",
          static_cast<double>(totals.page_ins));
  Counter(out, "optstate_paging_page_outs_total", "Pages written back from device memory",
          static_cast<double>(totals.page_outs));
  FamilyBuilder("optstate_paging_bytes_total", "Bytes copied between host and device",
                MetricType::Counter)
      .Value(static_cast<double>(totals.bytes_host_to_device), {{"direction", "host_to_device"}})
      .Value(static_cast<double>(totals.bytes_device_to_host), {{"direction", "device_to_host"}})
      .AppendTo(out);
  Counter(out, "optstate_paging_copy_wait_seconds_total",
          "Time steps waited for host-device copies",
          static_cast<double>(totals.copy_wait_us) * 1e-6);

  const BackendStats device = engine.backend()->Stats();
  FamilyBuilder("optstate_build_info",
                "1, labelled with the step backend and the CPU kernel's path in use",
                MetricType::Gauge)
      .Value(1, {{"backend", std::string(engine.backend()->name())},
                 {"cpu_kernel", KernelIsaName(AdamWKernelIsa())},
                 {"paging_strategy", device.strategy}})
      .AppendTo(out);
  Gauge(out, "optstate_vram_budget_bytes", "Device memory the backend may use (0: no device)",
        static_cast<double>(device.budget_total_bytes));
  Gauge(out, "optstate_vram_reserved_bytes", "Of the budget, reserved by groups and staging",
        static_cast<double>(device.budget_reserved_bytes));
  Gauge(out, "optstate_vram_available_bytes", "Of the budget, still free",
        static_cast<double>(device.budget_available_bytes));
  Gauge(out, "optstate_vram_resident_bytes", "Group state resident in device memory",
        static_cast<double>(device.resident_bytes));
  Gauge(out, "optstate_staging_pool_bytes", "The device staging pool of paged groups",
        static_cast<double>(device.staging_pool_bytes));
}

void CollectCheckpoints(const Checkpointer& checkpointer, std::vector<MetricFamily>& out) {
  const CheckpointStats stats = checkpointer.Stats();
  Counter(out, "optstate_checkpoints_written_total", "Checkpoints written completely",
          static_cast<double>(stats.written));
  Counter(out, "optstate_checkpoint_failures_total", "Checkpoints attempted and not written",
          static_cast<double>(stats.failures));
  Gauge(out, "optstate_checkpoint_last_duration_seconds", "How long the newest checkpoint took",
        stats.last_duration_seconds);
  Gauge(out, "optstate_checkpoint_last_bytes", "Bytes of the newest checkpoint written",
        stats.last.has_value() ? static_cast<double>(stats.last->bytes) : 0);
  Gauge(out, "optstate_checkpoint_last_step", "The step the newest checkpoint holds",
        stats.last.has_value() ? static_cast<double>(stats.last->step) : 0);
  Gauge(out, "optstate_checkpoint_last_success_timestamp_seconds",
        "When the newest checkpoint was written (Unix time; 0: none yet)",
        static_cast<double>(stats.last_finished_unix_micros) * 1e-6);
}

void CollectRegions(const RegionRegistry& regions, std::vector<MetricFamily>& out) {
  const RegionRegistryStats stats = regions.Stats();
  Gauge(out, "optstate_region_sessions", "Shared-memory sessions open",
        static_cast<double>(stats.sessions));
  Gauge(out, "optstate_regions", "Shared-memory regions registered",
        static_cast<double>(stats.regions));
  Gauge(out, "optstate_region_registered_bytes", "Bytes of the regions registered",
        static_cast<double>(stats.registered_bytes));
  Gauge(out, "optstate_region_mapped_bytes",
        "Bytes of regions mapped (registered, or unregistered and still used by a step)",
        static_cast<double>(stats.mapped_bytes));
  Counter(out, "optstate_region_registrations_total", "Regions registered since the start",
          static_cast<double>(stats.registrations));
  Gauge(out, "optstate_step_plans", "Step plans the shared-memory sessions keep",
        static_cast<double>(stats.kept));
  Counter(out, "optstate_step_plan_uses_total", "Step messages that named a kept step plan",
          static_cast<double>(stats.kept_found));
}

void CollectProcess(const MetricsSources& sources, std::vector<MetricFamily>& out) {
  Gauge(out, "process_resident_memory_bytes", "Resident memory of the daemon",
        static_cast<double>(ProcessResidentBytes()));
  Gauge(out, "process_start_time_seconds", "When the daemon started (Unix time)",
        absl::ToDoubleSeconds(sources.started - absl::UnixEpoch()));
  const HeapReading heap = ReadHeap();
  Gauge(out, "optstate_heap_in_use_bytes", "The malloc heap: handed out and not yet freed",
        static_cast<double>(heap.in_use_bytes));
  Gauge(out, "optstate_heap_free_bytes", "The malloc heap: taken from the system and free",
        static_cast<double>(heap.free_bytes()));
  Gauge(out, "optstate_heap_resident_bytes", "The main arena's pages resident in memory",
        static_cast<double>(ReadHeapResidentBytes()));
  if (sources.trimmer != nullptr) {
    Counter(out, "optstate_heap_trims_total", "malloc_trim calls since the start",
            static_cast<double>(sources.trimmer->trims()));
  }
}

}  // namespace

namespace {

// Per tenant: what it holds and its quotas (a quota of no limit is left out).
void CollectTenants(const StateStore& store, const Authenticator& auth,
                    std::vector<MetricFamily>& out) {
  const absl::flat_hash_map<std::string, StateStore::TenantUsage> usage = store.TenantUsages();
  std::vector<std::string> tenants = auth.Tenants();
  for (const auto& [tenant, use] : usage) {
    if (std::find(tenants.begin(), tenants.end(), tenant) == tenants.end()) tenants.push_back(tenant);
  }
  std::sort(tenants.begin(), tenants.end());
  FamilyBuilder groups("optstate_tenant_groups", "Groups a tenant holds", MetricType::Gauge);
  FamilyBuilder bytes("optstate_tenant_host_bytes", "Host bytes of a tenant's groups",
                      MetricType::Gauge);
  FamilyBuilder max_bytes("optstate_tenant_max_host_bytes",
                          "A tenant's max_host_bytes quota (absent: none)", MetricType::Gauge);
  FamilyBuilder max_groups("optstate_tenant_max_groups",
                           "A tenant's max_groups quota (absent: none)", MetricType::Gauge);
  constexpr uint64_t kNone = TenantQuota().max_groups;
  for (const std::string& tenant : tenants) {
    const auto it = usage.find(tenant);
    const StateStore::TenantUsage use = it == usage.end() ? StateStore::TenantUsage() : it->second;
    const TenantQuota quota = auth.QuotaOf(tenant);
    groups.Value(static_cast<double>(use.groups), {{"tenant", tenant}});
    bytes.Value(static_cast<double>(use.host_bytes), {{"tenant", tenant}});
    if (quota.max_host_bytes != kNone) {
      max_bytes.Value(static_cast<double>(quota.max_host_bytes), {{"tenant", tenant}});
    }
    if (quota.max_groups != kNone) {
      max_groups.Value(static_cast<double>(quota.max_groups), {{"tenant", tenant}});
    }
  }
  groups.AppendTo(out);
  bytes.AppendTo(out);
  max_bytes.AppendTo(out);
  max_groups.AppendTo(out);
}

}  // namespace

std::vector<MetricFamily> DaemonMetrics::Collect() const {
  std::vector<MetricFamily> out;
  CollectState(*sources_.engine, out);
  if (sources_.authenticator != nullptr && sources_.authenticator->required()) {
    CollectTenants(*sources_.engine->store(), *sources_.authenticator, out);
  }
  CollectCalls(*sources_.calls, sources_.regions, out);
  CollectStepStreams(*sources_.step_streams, out);
  if (sources_.checkpointer != nullptr) CollectCheckpoints(*sources_.checkpointer, out);
  if (sources_.regions != nullptr) CollectRegions(*sources_.regions, out);
  CollectProcess(sources_, out);
  if (sources_.tls) {
    const TlsReading tls = sources_.tls();
    Gauge(out, "optstate_tls_certificate_expiry_timestamp_seconds",
          "When the served TLS certificate (--tls_cert's first) expires, Unix seconds",
          static_cast<double>(tls.certificate_not_after_unix));
    Gauge(out, "optstate_tls_files_refused",
          "1 while changed TLS files are not served (they fail the checks; the previous ones "
          "are served), else 0",
          tls.files_refused ? 1.0 : 0.0);
  }
  return out;
}

}  // namespace optstate
