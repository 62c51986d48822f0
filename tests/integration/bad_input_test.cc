// Every refusal: a table of bad inputs, each with its gRPC status code, each
// followed by a check that the victim group's state (params, m, v and page
// steps) is byte-identical to before. Runs an in-process server so the test
// can read the state store directly; the calls still go through gRPC. The
// rows are kept by RPC (bad_step_test.cc, bad_register_test.cc,
// bad_unary_test.cc); this file runs the whole table and checks the messages
// of both streaming RPCs.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/bad_input_fixture.h"

namespace optstate::testing {
namespace {

TEST_F(BadInputTest, EveryBadInputGetsItsCodeAndLeavesStateByteIdentical) {
  auto good = [](uint64_t n) { return std::vector<float>(n, 0.02f); };
  std::vector<BadInput> table = StepBadInputs();
  for (BadInput& row : RegisterBadInputs()) table.push_back(std::move(row));
  for (BadInput& row : UnaryBadInputs()) table.push_back(std::move(row));
  ASSERT_GE(table.size(), 15u);
  for (const BadInput& bad : table) {
    SCOPED_TRACE(bad.what);
    const Snapshot before = Take();
    grpc::Status status = bad.send(*this);
    EXPECT_EQ(status.error_code(), bad.expected) << status.error_message();
    EXPECT_FALSE(status.error_message().empty());
    EXPECT_TRUE(Take() == before) << "state changed";
  }
  // The victim still steps: the refusals left it usable.
  for (uint64_t offset = 0; offset < kElements; offset += kPage) {
    EXPECT_TRUE(
        StepOne(Chunk("victim", 3, offset, good(std::min(kPage, kElements - offset)))).ok());
  }
}

TEST_F(BadInputTest, MessagesSayWhatToFix) {
  grpc::Status s = StepOne(Chunk("victim", 3, 512, std::vector<float>(kPage, 0.1f)));
  EXPECT_NE(s.error_message().find("page_elements=1024"), std::string::npos) << s.error_message();
  s = StepOne(Chunk("victim", 5, 0, std::vector<float>(kPage, 0.1f)));
  EXPECT_NE(s.error_message().find("expected step 3"), std::string::npos) << s.error_message();
  s = Register(Spec("huge", 100ull << 20, 1e-3f), {});
  EXPECT_NE(s.error_message().find("--max_host_bytes"), std::string::npos) << s.error_message();
  v1::StepRequest retired = Chunk("victim", 3, 0, std::vector<float>(kPage, 0.1f));
  retired.set_lr_float32(1e-3f);
  s = StepOne(retired);
  EXPECT_NE(s.error_message().find("StepRequest.lr (field 11)"), std::string::npos)
      << s.error_message();
  // The group was registered with the double nearest 1e-3f; 1e-3 is another.
  v1::GroupSpec near = Spec("victim", kElements, 1e-3f);
  near.mutable_hyperparameters()->set_lr(1e-3);
  s = Register(near, {});
  EXPECT_NE(s.error_message().find("lr=0.0010000000474974513"), std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("lr=0.001 "), std::string::npos) << s.error_message();
  v1::GroupSpec spec = Spec("fresh", 10, 1e-3f);
  spec.mutable_hyperparameters()->set_lr_float32(1e-3f);
  s = Register(spec, {});
  EXPECT_NE(s.error_message().find("as doubles in lr, beta1"), std::string::npos)
      << s.error_message();
}

}  // namespace
}  // namespace optstate::testing
