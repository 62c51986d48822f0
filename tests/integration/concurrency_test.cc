// Many clients at once: each exact on its own groups; two streams racing on
// one page apply it once.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <thread>

#include "grpcpp/grpcpp.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/random_tensors.h"

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

v1::StepRequest ChunkOf(const std::string& group, uint64_t step, const std::vector<float>& grad) {
  v1::StepRequest request;
  request.set_group(group);
  request.set_step(step);
  request.set_gradient(grad.data(), grad.size() * sizeof(float));
  return request;
}

TEST(ConcurrencyTest, OneStreamCarriesConsecutiveStepsOfTheSameGroupInOrder) {
  auto daemon = DaemonProcess::Start({"--threads=2"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Client::Connect((*daemon)->target());
  ASSERT_TRUE(client.ok());
  std::mt19937 rng(FreshSeed());
  std::vector<float> initial = RandomNormal(rng, 5000, 1.0f);
  std::vector<float> other = RandomNormal(rng, 7000, 1.0f);
  ASSERT_TRUE((*client)->RegisterGroup("a", initial).ok());
  ASSERT_TRUE((*client)->RegisterGroup("b", other).ok());
  GroupModel model(initial, Hyperparameters{});
  auto stub = v1::OptimizerState::NewStub(
      grpc::CreateChannel((*daemon)->target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  auto stream = stub->Step(&context);
  // Steps 1..20 of "a", interleaved with chunks of "b" that may run alongside.
  std::vector<std::vector<float>> grads;
  for (uint64_t t = 1; t <= 20; ++t) {
    grads.push_back(RandomNormal(rng, initial.size(), 1e-2f));
    ASSERT_TRUE(stream->Write(ChunkOf("a", t, grads.back())));
    ASSERT_TRUE(stream->Write(ChunkOf("b", t, std::vector<float>(other.size(), 0.01f))));
  }
  stream->WritesDone();
  v1::StepResponse response;
  std::vector<float> params(initial.size());
  for (uint64_t t = 1; t <= 20; ++t) {
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_EQ(response.group(), "a");
    EXPECT_EQ(response.step(), t);
    EXPECT_EQ(response.pages_applied(), 1u);
    std::memcpy(params.data(), response.params().data(), params.size() * sizeof(float));
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_EQ(response.group(), "b");
    model.Step(t, grads[t - 1]);
  }
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(params, model.params_fp32());
}

TEST(ConcurrencyTest, RefusedChunkEndsTheStreamAfterRepliesToEarlierChunks) {
  auto daemon = DaemonProcess::Start({"--threads=2"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Client::Connect((*daemon)->target());
  ASSERT_TRUE(client.ok());
  for (const char* name : {"g0", "g1", "g2", "g3"}) {
    ASSERT_TRUE((*client)->RegisterGroup(name, std::vector<float>(3000, 1.0f)).ok());
  }
  auto stub = v1::OptimizerState::NewStub(
      grpc::CreateChannel((*daemon)->target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  auto stream = stub->Step(&context);
  std::vector<float> good(3000, 0.01f), bad(3000, 0.01f);
  bad[1234] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(stream->Write(ChunkOf("g0", 1, good)));
  ASSERT_TRUE(stream->Write(ChunkOf("g1", 1, good)));
  ASSERT_TRUE(stream->Write(ChunkOf("g2", 1, bad)));
  stream->Write(ChunkOf("g3", 1, good));
  stream->WritesDone();
  v1::StepResponse response;
  std::vector<std::string> replied;
  while (stream->Read(&response)) replied.push_back(response.group());
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("element 1234"), std::string::npos);
  EXPECT_EQ(replied, (std::vector<std::string>{"g0", "g1"}));
  absl::StatusOr<GroupInfo> refused = (*client)->DescribeGroup("g2");
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->max_step, 0u);  // The refused chunk changed nothing.
  // Resending the whole step completes it; g3 replays if it was applied.
  std::vector<GroupStep> all;
  std::vector<std::vector<float>> outs(4, std::vector<float>(3000));
  const char* names[] = {"g0", "g1", "g2", "g3"};
  for (int i = 0; i < 4; ++i) all.push_back({names[i], good, absl::MakeSpan(outs[i])});
  ASSERT_TRUE((*client)->Step(all, 1).ok());
  for (int i = 1; i < 4; ++i) EXPECT_EQ(outs[i], outs[0]) << names[i];
}

TEST(ConcurrencyTest, DeletingAGroupWhileItIsSteppedEndsInNotFoundWithoutHanging) {
  auto daemon = DaemonProcess::Start({"--threads=2"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Client::Connect((*daemon)->target());
  ASSERT_TRUE(client.ok());
  constexpr size_t kElements = 262144 * 3;
  ASSERT_TRUE((*client)->RegisterGroup("doomed", kElements).ok());
  absl::Status last;
  std::thread stepper([&] {
    std::vector<float> grad(kElements, 0.01f), params(kElements);
    for (uint64_t t = 1; t <= 1000; ++t) {
      last = (*client)->Step("doomed", t, grad, absl::MakeSpan(params));
      if (!last.ok()) return;
    }
  });
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE((*client)->DeleteGroup("doomed").ok());
  stepper.join();
  EXPECT_EQ(last.code(), absl::StatusCode::kNotFound) << last;
  auto stats = (*client)->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->host_bytes, 0u);
}

TEST(ConcurrencyTest, RacingRegistrationsOfOneNameCreateItOnce) {
  auto daemon = DaemonProcess::Start({"--threads=2"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  constexpr int kClients = 6;
  std::vector<absl::StatusOr<GroupInfo>> results(kClients, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  const std::vector<float> initial(262144 * 8, 0.5f);  // Large enough to overlap.
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      ClientOptions options;
      options.initial_backoff = absl::Milliseconds(5);
      options.max_attempts = 20;
      auto client = Client::Connect((*daemon)->target(), options);
      results[c] = client.ok() ? (*client)->RegisterGroup("contested", initial) : client.status();
    });
  }
  for (auto& t : threads) t.join();
  int created = 0;
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->num_elements, initial.size());
    created += r->created;
  }
  EXPECT_EQ(created, 1);
}

}  // namespace
}  // namespace optstate::testing
