// gRPC's per-call metrics as gRFC A66 names them (grpc.server.call.started,
// grpc.server.call.duration), kept by a server interceptor and read by the
// metrics endpoint (server/metrics).
#ifndef OPTSTATE_SERVER_RPC_CALL_METRICS_H_
#define OPTSTATE_SERVER_RPC_CALL_METRICS_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/support/server_interceptor.h"
#include "server/base/duration_histogram.h"

namespace optstate {

// Thread-safe. Counts calls per method and their durations per method and
// final status code. Methods are a fixed list (a bounded label); any other
// is counted as "other" (A66's name for methods the server does not know).
class CallMetrics {
 public:
  static constexpr int kStatusCodes = 17;  // OK .. UNAUTHENTICATED.
  static constexpr absl::string_view kOtherMethod = "other";

  // `methods`: full method names, "package.Service/Method".
  explicit CallMetrics(const std::vector<std::string>& methods);

  // The methods of the services named ("optstate.v1.OptimizerState", ...),
  // from the linked descriptors; a service whose descriptors are not linked
  // in contributes nothing.
  static std::vector<std::string> MethodsOfServices(const std::vector<std::string>& services);

  // The index of a method by its path ("/package.Service/Method", as gRPC
  // gives it) or its name; the "other" entry for any other.
  size_t MethodIndex(absl::string_view path) const;
  void Started(size_t method) { methods_[method]->started.fetch_add(1, std::memory_order_relaxed); }
  // `code`: the status sent (0..16; anything else counts as UNKNOWN).
  void Finished(size_t method, int code, absl::Duration duration);

  // The methods' names, "other" last.
  size_t num_methods() const { return methods_.size(); }
  const std::string& method_name(size_t method) const { return methods_[method]->name; }
  uint64_t started(size_t method) const {
    return methods_[method]->started.load(std::memory_order_relaxed);
  }
  DurationHistogram::Snapshot durations(size_t method, int code) const {
    return methods_[method]->durations[code].Read();
  }

 private:
  struct Method {
    std::string name;
    std::atomic<uint64_t> started{0};
    std::array<DurationHistogram, kStatusCodes> durations;
  };
  std::vector<std::unique_ptr<Method>> methods_;
  absl::flat_hash_map<std::string, size_t> by_path_;  // "/package.Service/Method".
};

// The interceptor factory for grpc::ServerBuilder::experimental()
// .SetInterceptorCreators: each call counts as started when it is created,
// and its duration (from then to the status being sent, A66's) is observed
// under the status it ends with; a call that ends with no status sent, or
// whose status is sent after the client cancelled it or its deadline passed
// (the client never sees it), counts as CANCELLED. `metrics` must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeCallMetricsInterceptorFactory(CallMetrics* metrics);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_CALL_METRICS_H_
