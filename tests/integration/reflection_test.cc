// Inspectability: server reflection lists and describes every service, and
// the standard health service answers SERVING (what grpcurl relies on).
#include <gtest/gtest.h>

#include <set>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tests/testing/daemon_process.h"

namespace optstate::testing {
namespace {

namespace reflection = grpc::reflection::v1alpha;

class ReflectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = DaemonProcess::Start();
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    channel_ = grpc::CreateChannel(daemon_->target(), grpc::InsecureChannelCredentials());
  }

  // One request/response exchange on the reflection stream.
  reflection::ServerReflectionResponse Ask(const reflection::ServerReflectionRequest& request) {
    auto stub = reflection::ServerReflection::NewStub(channel_);
    grpc::ClientContext context;
    auto stream = stub->ServerReflectionInfo(&context);
    EXPECT_TRUE(stream->Write(request));
    stream->WritesDone();
    reflection::ServerReflectionResponse response;
    EXPECT_TRUE(stream->Read(&response));
    EXPECT_TRUE(stream->Finish().ok());
    return response;
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(ReflectionTest, ListsOptimizerStateHealthAndReflectionServices) {
  reflection::ServerReflectionRequest request;
  request.set_list_services("");
  reflection::ServerReflectionResponse response = Ask(request);
  std::set<std::string> services;
  for (const auto& s : response.list_services_response().service()) services.insert(s.name());
  EXPECT_TRUE(services.count("optstate.v1.OptimizerState")) << ::testing::PrintToString(services);
  EXPECT_TRUE(services.count("grpc.health.v1.Health"));
  EXPECT_TRUE(services.count("grpc.reflection.v1alpha.ServerReflection"));
}

TEST_F(ReflectionTest, DescribesTheServiceAndHealthBySymbol) {
  for (const std::string symbol :
       {"optstate.v1.OptimizerState", "optstate.v1.StepRequest", "grpc.health.v1.Health"}) {
    reflection::ServerReflectionRequest request;
    request.set_file_containing_symbol(symbol);
    reflection::ServerReflectionResponse response = Ask(request);
    EXPECT_FALSE(response.has_error_response())
        << symbol << ": " << response.error_response().error_message();
    EXPECT_GT(response.file_descriptor_response().file_descriptor_proto_size(), 0) << symbol;
  }
}

TEST_F(ReflectionTest, HealthCheckAnswersServing) {
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(stub->Check(&context, request, &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(ReflectionTest, HealthCheckOfTheServiceByNameAnswersServing) {
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("optstate.v1.OptimizerState");
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

}  // namespace
}  // namespace optstate::testing
