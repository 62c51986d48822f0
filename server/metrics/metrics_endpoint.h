// The metrics endpoint: Prometheus' text format on `/metrics`, over HTTP on
// an address of its own (--metrics_listen), served by prometheus-cpp's
// exposer.
#ifndef OPTSTATE_SERVER_METRICS_METRICS_ENDPOINT_H_
#define OPTSTATE_SERVER_METRICS_METRICS_ENDPOINT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace optstate {

// Thread-safe: scrapes run on the exposer's own threads.
class MetricsEndpoint {
 public:
  // `listen`: IP:PORT ("127.0.0.1:9464", "0.0.0.0:9464", "[::1]:9464"); port
  // 0 picks a free one. INVALID_ARGUMENT for another form, and for an IPv6
  // address where civetweb was built without IPv6; UNAVAILABLE,
  // naming the address, when it cannot be bound (taken, or not this host's).
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& listen, std::shared_ptr<prometheus::Collectable> metrics);
  // Stops serving (waits for a scrape under way).
  ~MetricsEndpoint();

  int port() const { return port_; }

 private:
  MetricsEndpoint(std::unique_ptr<prometheus::Exposer> exposer,
                  std::shared_ptr<prometheus::Collectable> metrics, int port)
      : exposer_(std::move(exposer)), metrics_(std::move(metrics)), port_(port) {}

  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Collectable> metrics_;  // The exposer holds it weakly.
  int port_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_METRICS_METRICS_ENDPOINT_H_
