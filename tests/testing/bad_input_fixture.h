// The fixture of the bad-input tests (tests/integration/bad_*_test.cc): an
// in-process server holding a "victim" group, and a snapshot of its state.
#ifndef OPTSTATE_TESTS_TESTING_BAD_INPUT_FIXTURE_H_
#define OPTSTATE_TESTS_TESTING_BAD_INPUT_FIXTURE_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "server/server.h"

namespace optstate::testing {

inline constexpr uint64_t kPage = 1024;
inline constexpr uint64_t kElements = 2 * kPage + 452;  // Three pages, the last partial.

// A spec with initial values, and `lr`.
inline v1::GroupSpec Spec(const std::string& name, uint64_t n, float lr) {
  v1::GroupSpec spec;
  spec.set_name(name);
  spec.set_num_elements(n);
  spec.set_has_initial_values(true);
  spec.mutable_hyperparameters()->set_lr(lr);
  return spec;
}

// The bytes of `v`.
inline std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A float32 chunk of `group` at `step`.
inline v1::StepRequest Chunk(const std::string& group, uint64_t step, uint64_t offset,
                             const std::vector<float>& grad) {
  v1::StepRequest r;
  r.set_group(group);
  r.set_step(step);
  r.set_offset(offset);
  r.set_gradient(Floats(grad));
  return r;
}

// The victim's params, m, v and page steps, and the names of all groups.
struct Snapshot {
  std::vector<float> params, exp_avg, exp_avg_sq;
  std::vector<uint64_t> page_steps;
  std::vector<std::string> group_names;

  bool operator==(const Snapshot& o) const {
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
    };
    return same(params, o.params) && same(exp_avg, o.exp_avg) && same(exp_avg_sq, o.exp_avg_sq) &&
           page_steps == o.page_steps && group_names == o.group_names;
  }
};

class BadInputTest : public ::testing::Test {
 public:
  void SetUp() override {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.threads = 2;
    options.page_elements = kPage;
    options.max_host_bytes = 64ull << 20;
    options.max_message_bytes = 1 << 20;  // The least (and small enough to pass with packing).
    options.backend.kind = "cpu";
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::OptimizerState::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials()));
    // The victim: registered with values and stepped twice.
    std::vector<float> initial(kElements);
    for (size_t i = 0; i < kElements; ++i) initial[i] = std::sin(0.1f * i);
    ASSERT_EQ(Register(Spec("victim", kElements, 1e-3f), {{0, Floats(initial)}}).error_code(),
              grpc::StatusCode::OK);
    for (uint64_t t = 1; t <= 2; ++t) {
      for (uint64_t offset = 0; offset < kElements; offset += kPage) {
        const uint64_t n = std::min(kPage, kElements - offset);
        ASSERT_EQ(
            StepOne(Chunk("victim", t, offset, std::vector<float>(n, 0.01f * t))).error_code(),
            grpc::StatusCode::OK);
      }
    }
  }

  grpc::Status Register(const v1::GroupSpec& spec,
                        const std::vector<std::pair<uint64_t, std::string>>& values,
                        bool send_spec = true) {
    grpc::ClientContext context;
    v1::RegisterGroupResponse response;
    auto writer = stub_->RegisterGroup(&context, &response);
    v1::RegisterGroupRequest request;
    if (send_spec) {
      *request.mutable_spec() = spec;
      writer->Write(request);
    }
    for (const auto& [offset, data] : values) {
      request.Clear();
      request.mutable_values()->set_offset(offset);
      request.mutable_values()->set_data(data);
      writer->Write(request);
    }
    writer->WritesDone();
    return writer->Finish();
  }

  grpc::Status StepOne(const v1::StepRequest& request) {
    grpc::ClientContext context;
    auto stream = stub_->Step(&context);
    stream->Write(request);
    stream->WritesDone();
    v1::StepResponse response;
    while (stream->Read(&response)) {
    }
    return stream->Finish();
  }

  Snapshot Take() {
    Snapshot s;
    auto group = server_->engine().store()->Find(GroupKey{"", "victim"});
    EXPECT_TRUE(group.ok());
    const Group& g = **group;
    s.params.assign(g.params(), g.params() + g.num_elements());
    s.exp_avg.assign(g.exp_avg(), g.exp_avg() + g.num_elements());
    s.exp_avg_sq.assign(g.exp_avg_sq(), g.exp_avg_sq() + g.num_elements());
    for (uint64_t p = 0; p < g.num_pages(); ++p) s.page_steps.push_back(g.page_step(p));
    for (const auto& other : server_->engine().store()->List("")) {
      s.group_names.push_back(other->key().name);
    }
    return s;
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::OptimizerState::Stub> stub_;
};

// One row of the bad-input table: what is sent, and the code it must get.
struct BadInput {
  std::string what;
  grpc::StatusCode expected;
  std::function<grpc::Status(BadInputTest&)> send;
};

// The table's rows, by RPC, in the order the table runs them
// (bad_step_test.cc, bad_register_test.cc, bad_unary_test.cc).
std::vector<BadInput> StepBadInputs();
std::vector<BadInput> RegisterBadInputs();
std::vector<BadInput> UnaryBadInputs();

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_TESTING_BAD_INPUT_FIXTURE_H_
