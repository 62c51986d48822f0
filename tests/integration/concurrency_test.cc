// Many clients at once: each exact on its own groups; two streams racing on
// one page apply it once.
#include <gtest/gtest.h>

#include <thread>

#include "grpcpp/grpcpp.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/random_tensors.h"

namespace optstate::testing {
namespace {

TEST(ConcurrencyTest, EightClientsSteppingTheirOwnGroupsAtOnceAreExact) {
  auto daemon = DaemonProcess::Start({"--threads=2"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  constexpr int kClients = 8;
  std::vector<std::string> failures(kClients);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937 rng(seed + c);
      auto client = Client::Connect((*daemon)->target());
      if (!client.ok()) return void(failures[c] = client.status().ToString());
      const std::string names[2] = {"client" + std::to_string(c) + ".a",
                                    "client" + std::to_string(c) + ".b"};
      const size_t sizes[2] = {262144 * 2 + 17, 5000};
      std::vector<GroupModel> models;
      std::vector<std::vector<float>> params(2), grads(2);
      for (int g = 0; g < 2; ++g) {
        std::vector<float> initial = RandomNormal(rng, sizes[g], 1.0f);
        if (auto info = (*client)->RegisterGroup(names[g], initial); !info.ok()) {
          return void(failures[c] = info.status().ToString());
        }
        models.emplace_back(initial, Hyperparameters{});
        params[g].resize(sizes[g]);
      }
      for (uint64_t t = 1; t <= 10; ++t) {
        std::vector<GroupStep> step;
        for (int g = 0; g < 2; ++g) {
          grads[g] = RandomNormal(rng, sizes[g], 1e-2f);
          step.push_back({names[g], grads[g], absl::MakeSpan(params[g])});
        }
        if (absl::Status s = (*client)->Step(step, t); !s.ok()) {
          return void(failures[c] = s.ToString());
        }
        for (int g = 0; g < 2; ++g) models[g].Step(t, grads[g]);
      }
      for (int g = 0; g < 2; ++g) {
        if (params[g] != models[g].params_fp32()) failures[c] = names[g] + " differs from model";
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int c = 0; c < kClients; ++c) EXPECT_EQ(failures[c], "") << "client " << c;
}

TEST(ConcurrencyTest, TwoStreamsSendingTheSameStepApplyEachPageOnce) {
  auto daemon = DaemonProcess::Start({"--threads=2"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Client::Connect((*daemon)->target());
  ASSERT_TRUE(client.ok());
  constexpr size_t kElements = 262144 * 4;
  std::mt19937 rng(FreshSeed());
  std::vector<float> initial = RandomNormal(rng, kElements, 1.0f);
  std::vector<float> grad = RandomNormal(rng, kElements, 1e-2f);
  ASSERT_TRUE((*client)->RegisterGroup("shared", initial).ok());

  // Both streams race to apply step 1 to every page, 20 rounds of the same
  // pages each: replays must apply nothing.
  auto channel = grpc::CreateChannel((*daemon)->target(), grpc::InsecureChannelCredentials());
  auto stub = v1::OptimizerState::NewStub(channel);
  std::atomic<uint64_t> applied{0}, replayed{0};
  std::atomic<int> errors{0};
  auto race = [&] {
    grpc::ClientContext context;
    auto stream = stub->Step(&context);
    std::thread reader([&] {
      v1::StepResponse response;
      while (stream->Read(&response)) {
        applied += response.pages_applied();
        replayed += response.pages_replayed();
      }
    });
    for (int round = 0; round < 20; ++round) {
      for (size_t page = 0; page < 4; ++page) {
        v1::StepRequest request;
        request.set_group("shared");
        request.set_step(1);
        request.set_offset(page * 262144);
        request.set_gradient(grad.data() + page * 262144, 262144 * sizeof(float));
        stream->Write(request);
      }
    }
    stream->WritesDone();
    reader.join();
    if (!stream->Finish().ok()) ++errors;
  };
  std::thread a(race), b(race);
  a.join();
  b.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(applied.load(), 4u);
  EXPECT_EQ(replayed.load(), 2u * 20u * 4u - 4u);
  GroupModel model(initial, Hyperparameters{});
  model.Step(1, grad);
  std::vector<float> params(kElements);
  // A replay of step 1 returns the current params without changing them.
  ASSERT_TRUE((*client)->Step("shared", 1, grad, absl::MakeSpan(params)).ok());
  EXPECT_EQ(params, model.params_fp32());
}

}  // namespace
}  // namespace optstate::testing
