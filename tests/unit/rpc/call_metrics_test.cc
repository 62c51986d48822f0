// CallMetrics: the methods of the linked services by name, any other one
// counted as "other", durations by status code.
#include "server/rpc/call_metrics.h"

#include <algorithm>

#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "optstate/v1/optstate.grpc.pb.h"

namespace optstate {
namespace {

TEST(CallMetricsTest, NamesTheLinkedServicesMethodsAndCountsTheRestAsOther) {
  v1::StepRequest::descriptor();  // Links optstate.proto's descriptors in, as the daemon does.
  const std::vector<std::string> methods =
      CallMetrics::MethodsOfServices({"optstate.v1.OptimizerState", "no.such.Service"});
  // Every method of the service, as its descriptor lists them; none of the missing one.
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "optstate.v1.OptimizerState");
  ASSERT_NE(service, nullptr);
  ASSERT_EQ(methods.size(), static_cast<size_t>(service->method_count()));
  for (int i = 0; i < service->method_count(); ++i) {
    EXPECT_EQ(methods[i], "optstate.v1.OptimizerState/" + service->method(i)->name());
  }
  EXPECT_NE(std::find(methods.begin(), methods.end(), "optstate.v1.OptimizerState/Step"),
            methods.end());
  CallMetrics metrics(methods);
  EXPECT_EQ(metrics.num_methods(), methods.size() + 1);
  const size_t step = metrics.MethodIndex("/optstate.v1.OptimizerState/Step");
  EXPECT_EQ(metrics.method_name(step), "optstate.v1.OptimizerState/Step");
  EXPECT_EQ(metrics.MethodIndex("optstate.v1.OptimizerState/Step"), step);
  const size_t other = metrics.MethodIndex("/evil/" + std::string(1000, 'x'));
  EXPECT_EQ(metrics.method_name(other), "other");
  EXPECT_EQ(other, metrics.num_methods() - 1);

  metrics.Started(step);
  metrics.Started(step);
  metrics.Finished(step, 0, absl::Milliseconds(3));
  metrics.Finished(step, 3, absl::Milliseconds(1));
  metrics.Finished(step, 99, absl::Milliseconds(1));  // Not a code: UNKNOWN (2).
  EXPECT_EQ(metrics.started(step), 2u);
  EXPECT_EQ(metrics.started(other), 0u);
  EXPECT_EQ(metrics.durations(step, 0).count, 1u);
  EXPECT_EQ(metrics.durations(step, 3).count, 1u);
  EXPECT_EQ(metrics.durations(step, 2).count, 1u);
  EXPECT_NEAR(metrics.durations(step, 0).sum_seconds, 0.003, 1e-9);
}

}  // namespace
}  // namespace optstate
