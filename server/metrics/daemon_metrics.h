// The daemon's metrics in Prometheus' data model, read when scraped: the
// same sources GetStats reads (store, engine, backend, checkpointer, regions,
// heap), daemon-wide, plus the call and Step-stream measurements.
#ifndef OPTSTATE_SERVER_METRICS_DAEMON_METRICS_H_
#define OPTSTATE_SERVER_METRICS_DAEMON_METRICS_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/time/time.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/auth/authenticator.h"
#include "server/base/heap_trimmer.h"
#include "server/durability/checkpointer.h"
#include "server/engine/step_engine.h"
#include "server/regions/region_registry.h"
#include "server/rpc/call_metrics.h"
#include "server/rpc/step_stream_metrics.h"

namespace optstate {

// What the daemon serves TLS with, read at each scrape.
struct TlsReading {
  int64_t certificate_not_after_unix = 0;  // The served chain's first certificate.
  bool files_refused = false;              // Changed files not served (the previous ones are).
};

// What the metrics are read from. engine, calls and step_streams are
// required; the rest may be null (the daemon has none: no --state_dir, no
// region socket). Each must outlive the DaemonMetrics.
struct MetricsSources {
  const StepEngine* engine = nullptr;
  const Checkpointer* checkpointer = nullptr;
  const RegionRegistry* regions = nullptr;
  const HeapTrimmer* trimmer = nullptr;
  const CallMetrics* calls = nullptr;
  const StepStreamMetrics* step_streams = nullptr;
  // Tenants and their quotas; null or without tenants: no per-tenant series.
  const Authenticator* authenticator = nullptr;
  absl::Time started;  // When the daemon started, for process_start_time_seconds.
  // With TLS: what it serves; unset: no TLS series.
  std::function<TlsReading()> tls;
};

// Thread-safe (Collect runs on the exposer's threads). Labels are bounded:
// method names of the services served, status codes, phases, data planes,
// tenants (the tokens file's, and those of client certificates); never a
// group's name, a token, a digest or anything else a client sent. docs/operations.md lists
// every metric. Counters count from the daemon's start and never go down
// (a deleted group's counts stay in them); GetStats' totals are over the
// groups there are now.
class DaemonMetrics : public prometheus::Collectable {
 public:
  explicit DaemonMetrics(MetricsSources sources) : sources_(sources) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const MetricsSources sources_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_METRICS_DAEMON_METRICS_H_
