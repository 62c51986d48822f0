// Bad unary calls (DescribeGroup, DeleteGroup): the unary rows of the
// bad-input table.
#include <gtest/gtest.h>

#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/bad_input_fixture.h"

namespace optstate::testing {

std::vector<BadInput> UnaryBadInputs() {
  using T = BadInputTest;
  return {
      {"describe an unknown group", grpc::StatusCode::NOT_FOUND,
       [&](T& t) {
         grpc::ClientContext c;
         v1::DescribeGroupRequest r;
         r.set_name("nobody");
         v1::DescribeGroupResponse out;
         return t.stub_->DescribeGroup(&c, r, &out);
       }},
      {"delete an unknown group", grpc::StatusCode::NOT_FOUND,
       [&](T& t) {
         grpc::ClientContext c;
         v1::DeleteGroupRequest r;
         r.set_name("nobody");
         v1::DeleteGroupResponse out;
         return t.stub_->DeleteGroup(&c, r, &out);
       }},
  };
}

}  // namespace optstate::testing
