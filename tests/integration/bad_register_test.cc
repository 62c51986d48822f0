// Bad RegisterGroup calls: the RegisterGroup rows of the bad-input table,
// and a stream left open on a group that is then deleted.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "server/server.h"
#include "tests/testing/bad_input_fixture.h"

namespace optstate::testing {

std::vector<BadInput> RegisterBadInputs() {
  static constexpr float nan = std::numeric_limits<float>::quiet_NaN();
  static const auto good = [](uint64_t n) { return std::vector<float>(n, 0.02f); };
  using T = BadInputTest;
  return {
      {"re-register with another size", grpc::StatusCode::ALREADY_EXISTS,
       [&](T& t) { return t.Register(Spec("victim", kElements + 1, 1e-3f), {}); }},
      {"re-register with another lr", grpc::StatusCode::ALREADY_EXISTS,
       [&](T& t) { return t.Register(Spec("victim", kElements, 2e-3f), {}); }},
      {"register with negative lr", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) { return t.Register(Spec("fresh", 10, -1.0f), {}); }},
      {"register with beta1 = 1", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::GroupSpec s = Spec("fresh", 10, 1e-3f);
         s.mutable_hyperparameters()->set_beta1(1.0f);
         return t.Register(s, {});
       }},
      {"register with beta2 < 0", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::GroupSpec s = Spec("fresh", 10, 1e-3f);
         s.mutable_hyperparameters()->set_beta2(-0.5f);
         return t.Register(s, {});
       }},
      {"register with a retired float32 hyperparameter", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::GroupSpec s = Spec("fresh", 10, 1e-3f);
         s.mutable_hyperparameters()->set_beta2_float32(0.99f);
         return t.Register(s, {});
       }},
      {"register with an eps that is 0 in float32", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::GroupSpec s = Spec("fresh", 10, 1e-3f);
         s.mutable_hyperparameters()->set_eps(1e-50);
         return t.Register(s, {});
       }},
      {"register with eps = 0", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::GroupSpec s = Spec("fresh", 10, 1e-3f);
         s.mutable_hyperparameters()->set_eps(0.0f);
         return t.Register(s, {});
       }},
      {"register zero elements", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) { return t.Register(Spec("fresh", 0, 1e-3f), {}); }},
      {"register an empty name", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) { return t.Register(Spec("", 10, 1e-3f), {}); }},
      {"register past --max_host_bytes", grpc::StatusCode::RESOURCE_EXHAUSTED,
       [&](T& t) { return t.Register(Spec("huge", 100ull << 20, 1e-3f), {}); }},
      {"register stream without a spec", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         return t.Register({}, {{0, Floats(good(10))}}, /*send_spec=*/false);
       }},
      {"values for the victim that are not page aligned", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         return t.Register(Spec("victim", kElements, 1e-3f), {{7, Floats(good(10))}});
       }},
      {"non-finite initial value", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         std::vector<float> v = good(kElements);
         v[5] = nan;
         return t.Register(Spec("victim", kElements, 1e-3f), {{0, Floats(v)}});
       }},
  };
}

namespace {

// A RegisterGroup stream left open holds no claim on its group: deleting the
// group frees its memory at once (the budget already counts it as free), and
// values sent on the stream afterwards are refused.
TEST_F(BadInputTest, ARegisterStreamLeftOpenDoesNotKeepADeletedGroupsMemory) {
  StateStore* store = server_->engine().store();
  const uint64_t bytes_before = store->host_bytes();
  grpc::ClientContext context;
  v1::RegisterGroupResponse response;
  auto writer = stub_->RegisterGroup(&context, &response);
  v1::RegisterGroupRequest request;
  *request.mutable_spec() = Spec("held", 4 * kPage, 1e-3f);
  ASSERT_TRUE(writer->Write(request));
  std::weak_ptr<Group> held;
  for (int i = 0; i < 2000 && held.expired(); ++i) {
    absl::StatusOr<std::shared_ptr<Group>> found = store->Find(GroupKey{"", "held"});
    if (found.ok()) {
      held = *found;
    } else {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  ASSERT_FALSE(held.expired()) << "the spec was not registered";
  EXPECT_EQ(store->host_bytes(), bytes_before + 4 * kPage * 12);
  {
    grpc::ClientContext c;
    v1::DeleteGroupRequest r;
    r.set_name("held");
    v1::DeleteGroupResponse out;
    ASSERT_TRUE(stub_->DeleteGroup(&c, r, &out).ok());
  }
  EXPECT_TRUE(held.expired()) << "the open stream still holds the deleted group's memory";
  EXPECT_EQ(store->host_bytes(), bytes_before);
  request.Clear();
  request.mutable_values()->set_offset(0);
  request.mutable_values()->set_data(Floats(std::vector<float>(kPage, 1.0f)));
  writer->Write(request);
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
  EXPECT_NE(status.error_message().find("'held' was deleted"), std::string::npos)
      << status.error_message();
}

}  // namespace
}  // namespace optstate::testing
