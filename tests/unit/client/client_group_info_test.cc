// The client's reading of GroupInfo: hyperparameters come back as the
// doubles they were registered with, and a daemon that predates double
// hyperparameters (it ignores them and fills only the retired float32
// fields) is refused rather than believed.
#include <gtest/gtest.h>

#include "client/call/proto_convert.h"
#include "optstate/v1/optstate.pb.h"

namespace optstate {
namespace {

v1::GroupInfo Info() {
  v1::GroupInfo proto;
  proto.set_name("w");
  proto.set_num_elements(10);
  proto.set_page_elements(262144);
  v1::AdamWHyperparameters* h = proto.mutable_hyperparameters();
  h->set_lr(1e-3);
  h->set_beta1(0.9);
  h->set_beta2(0.999);
  h->set_eps(1e-8);
  h->set_weight_decay(1e-2);
  return proto;
}

TEST(GroupInfoFromProto, KeepsEveryHyperparameterAsTheDoubleItIs) {
  absl::StatusOr<GroupInfo> info = client_internal::GroupInfoFromProto(Info());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->hyperparameters.lr, 1e-3);
  EXPECT_EQ(info->hyperparameters.beta1, 0.9);
  EXPECT_EQ(info->hyperparameters.beta2, 0.999);
  EXPECT_EQ(info->hyperparameters.eps, 1e-8);
  EXPECT_EQ(info->hyperparameters.weight_decay, 1e-2);
  EXPECT_EQ(info->num_elements, 10u);
}

TEST(GroupInfoFromProto, RefusesADaemonThatPredatesDoubleHyperparameters) {
  v1::GroupInfo old = Info();
  v1::AdamWHyperparameters* h = old.mutable_hyperparameters();
  h->Clear();
  h->set_lr_float32(1e-3f);
  h->set_beta1_float32(0.9f);
  h->set_beta2_float32(0.999f);
  h->set_eps_float32(1e-8f);
  h->set_weight_decay_float32(1e-2f);
  absl::StatusOr<GroupInfo> info = client_internal::GroupInfoFromProto(old);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kFailedPrecondition) << info.status();
  EXPECT_NE(info.status().message().find("Upgrade optstated"), std::string::npos);

  v1::GroupInfo one_missing = Info();
  one_missing.mutable_hyperparameters()->clear_eps();
  EXPECT_EQ(client_internal::GroupInfoFromProto(one_missing).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace optstate
