// The shared-memory data plane against optstated processes: exactly once
// through cancelled and retried steps, hostile and buggy clients (each gets
// its code, the daemon stays up, others stay exact, memory is released),
// the choice of data plane, and unix: listen sockets.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/random_tensors.h"
#include "tests/testing/raw_region.h"
#include "tests/testing/resident_memory.h"

extern char** environ;

namespace optstate {
namespace {

using ::optstate::testing::DaemonProcess;
using ::optstate::testing::FreshSeed;
using ::optstate::testing::GroupModel;
using ::optstate::testing::OpenRegion;
using ::optstate::testing::RandomNormal;
using ::optstate::testing::RawRegion;
using ::optstate::testing::RegionSocketOf;
using ::optstate::testing::ResidentBytes;

constexpr uint64_t kPage = 256 * 1024;  // The daemon's default.
constexpr uint64_t kElements = 4 * kPage;

// One float32 chunk of group `group` at page `page` (one page) naming
// `region`: gradient at `grad_offset`, params at `params_offset`.
v1::StepRequest RegionChunk(const std::string& group, uint64_t step, uint64_t page,
                            const RawRegion& region, uint64_t grad_offset, uint64_t params_offset) {
  v1::StepRequest request;
  request.set_group(group);
  request.set_step(step);
  request.set_offset(page * kPage);
  request.set_region_session(region.key);
  v1::RegionSlice* g = request.mutable_gradient_region();
  g->set_region(region.id);
  g->set_offset(grad_offset);
  g->set_bytes(kPage * 4);
  v1::RegionSlice* p = request.mutable_params_region();
  p->set_region(region.id);
  p->set_offset(params_offset);
  p->set_bytes(kPage * 4);
  return request;
}

// Mappings of client regions in the daemon (memfds the clients named).
int RegionMappings(pid_t pid, const std::string& name) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) n += line.find("/memfd:" + name) != std::string::npos;
  return n;
}

class SharedMemoryHostileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = DaemonProcess::Start({"--threads=2"});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    ClientOptions options;
    options.data_plane = DataPlane::kSharedMemory;
    options.initial_backoff = absl::Milliseconds(1);
    auto client = Client::Connect(daemon_->target(), options);
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
    stub_ = v1::OptimizerState::NewStub(
        grpc::CreateChannel(daemon_->target(), grpc::InsecureChannelCredentials()));
    seed_ = FreshSeed();
    rng_.seed(seed_);
    std::vector<float> initial = RandomNormal(rng_, kElements, 1.0f);
    ASSERT_TRUE(client_->RegisterGroup("w", initial).ok());
    model_ = std::make_unique<GroupModel>(initial, Hyperparameters{});
    params_.resize(kElements);
    path_ = RegionSocketOf(daemon_->target());
    ASSERT_FALSE(path_.empty());
  }

  void StepBoth(uint64_t t, const std::vector<float>& grad) {
    absl::Status status = client_->Step("w", t, grad, absl::MakeSpan(params_));
    ASSERT_TRUE(status.ok()) << t << " " << status;
    model_->Step(t, grad);
  }
  void StepBoth(uint64_t t) { StepBoth(t, RandomNormal(rng_, kElements, 1e-2f)); }

  // Sends `requests` on one raw Step stream and returns its final status.
  absl::Status SendAll(const std::vector<v1::StepRequest>& requests) {
    grpc::ClientContext context;
    auto stream = stub_->Step(&context);
    for (const v1::StepRequest& r : requests) {
      if (!stream->Write(r)) break;
    }
    stream->WritesDone();
    v1::StepResponse response;
    while (stream->Read(&response)) {
    }
    grpc::Status status = stream->Finish();
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }

  // The group as the model says, and nothing applied by a refused chunk.
  void ExpectExact() {
    StepBoth(model_step_ + 1);
    EXPECT_EQ(params_, model_->params_fp32()) << "seed " << seed_;
  }

  uint32_t seed_;
  std::mt19937 rng_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<v1::OptimizerState::Stub> stub_;
  std::unique_ptr<GroupModel> model_;
  std::vector<float> params_;
  std::string path_;
  uint64_t model_step_ = 0;
};

TEST_F(SharedMemoryHostileTest, ACancelledSharedMemoryStepRetriedAppliesEachElementOnce) {
  StepBoth(1);
  // Step 2 for the first two pages through a region, one reply read, then
  // the call cancelled.
  std::vector<float> grad = RandomNormal(rng_, kElements, 1e-2f);
  auto region = OpenRegion(path_, 2 * kElements * 4);
  std::memcpy(region->base, grad.data(), kElements * 4);
  {
    grpc::ClientContext context;
    auto stream = stub_->Step(&context);
    for (uint64_t page = 0; page < 2; ++page) {
      ASSERT_TRUE(stream->Write(
          RegionChunk("w", 2, page, *region, page * kPage * 4, (kElements + page * kPage) * 4)));
    }
    v1::StepResponse response;
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_TRUE(response.params_in_region());
    EXPECT_TRUE(response.params().empty());
    context.TryCancel();
    stream->Finish().IgnoreError();
  }
  StepBoth(2, grad);  // Finishes step 2: each element once.
  EXPECT_EQ(params_, model_->params_fp32()) << "seed " << seed_;
  // A resent completed step changes nothing and returns the current params.
  std::vector<float> again(kElements);
  ASSERT_TRUE(
      client_->Step("w", 2, RandomNormal(rng_, kElements, 1.0f), absl::MakeSpan(again)).ok());
  EXPECT_EQ(again, model_->params_fp32());
  model_step_ = 2;
  ExpectExact();
}

TEST_F(SharedMemoryHostileTest, AnotherClientsRegionIsNotFound) {
  StepBoth(1);
  model_step_ = 1;
  auto mine = OpenRegion(path_, 2 * kPage * 4);
  auto theirs = OpenRegion(path_, 2 * kPage * 4);
  // Their region id with my session key; my id with a made-up key.
  v1::StepRequest chunk = RegionChunk("w", 2, 0, *theirs, 0, kPage * 4);
  chunk.set_region_session(mine->key);
  absl::Status status = SendAll({chunk});
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_NE(status.message().find("not registered by this client"), std::string::npos) << status;
  chunk = RegionChunk("w", 2, 0, *mine, 0, kPage * 4);
  chunk.set_region_session(std::string(16, 'x'));
  EXPECT_EQ(SendAll({chunk}).code(), absl::StatusCode::kNotFound);
  chunk.clear_region_session();
  EXPECT_EQ(SendAll({chunk}).code(), absl::StatusCode::kNotFound);
  ExpectExact();
}

TEST_F(SharedMemoryHostileTest, ReferencesPastTheRegionsEndAreOutOfRange) {
  StepBoth(1);
  model_step_ = 1;
  auto region = OpenRegion(path_, 2 * kPage * 4);
  // The gradient's last byte, then the params', one past the end; and an
  // offset that wraps around.
  EXPECT_EQ(SendAll({RegionChunk("w", 2, 0, *region, kPage * 4 + 1, 0)}).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(SendAll({RegionChunk("w", 2, 0, *region, 0, kPage * 4 + 4)}).code(),
            absl::StatusCode::kOutOfRange);
  absl::Status wrapped = SendAll({RegionChunk("w", 2, 0, *region, UINT64_MAX - 8, kPage * 4)});
  EXPECT_EQ(wrapped.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(wrapped.message().find("gradient_region"), std::string::npos) << wrapped;
  // A refusal in a packed chunk refuses its whole message.
  v1::StepRequest packed = RegionChunk("w", 2, 1, *region, 0, kPage * 4);
  *packed.add_more() = RegionChunk("w", 2, 2, *region, 2 * kPage * 4, 0);
  EXPECT_EQ(SendAll({packed}).code(), absl::StatusCode::kOutOfRange);
  ExpectExact();
}

TEST_F(SharedMemoryHostileTest, MalformedRegionChunksAreInvalidArgument) {
  StepBoth(1);
  model_step_ = 1;
  auto region = OpenRegion(path_, 3 * kPage * 4);
  // Gradient and params overlapping by one element.
  absl::Status overlap = SendAll({RegionChunk("w", 2, 0, *region, 0, kPage * 4 - 4)});
  EXPECT_EQ(overlap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(overlap.message().find("overlap"), std::string::npos) << overlap;
  // Both a gradient and a gradient_region.
  v1::StepRequest both = RegionChunk("w", 2, 0, *region, 0, kPage * 4);
  both.set_gradient(std::string(kPage * 4, '\0'));
  EXPECT_EQ(SendAll({both}).code(), absl::StatusCode::kInvalidArgument);
  // A params_region of another size than the params.
  v1::StepRequest short_params = RegionChunk("w", 2, 0, *region, 0, kPage * 4);
  short_params.mutable_params_region()->set_bytes(kPage * 2);
  EXPECT_EQ(SendAll({short_params}).code(), absl::StatusCode::kInvalidArgument);
  // A non-finite gradient in the region.
  std::vector<float> bad(kPage, 0.0f);
  bad[17] = std::nanf("");
  std::memcpy(region->base, bad.data(), kPage * 4);
  absl::Status not_finite = SendAll({RegionChunk("w", 2, 0, *region, 0, kPage * 4)});
  EXPECT_EQ(not_finite.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(not_finite.message().find("element 17"), std::string::npos) << not_finite;
  ExpectExact();
}

TEST_F(SharedMemoryHostileTest, ARegionUnregisteredWhileAStepUsesItIsSafe) {
  StepBoth(1);
  std::vector<float> grad = RandomNormal(rng_, kElements, 1e-2f);
  auto region = OpenRegion(path_, 2 * kElements * 4);
  std::memcpy(region->base, grad.data(), kElements * 4);
  {
    grpc::ClientContext context;
    auto stream = stub_->Step(&context);
    for (uint64_t page = 0; page < 4; ++page) {
      ASSERT_TRUE(stream->Write(
          RegionChunk("w", 2, page, *region, page * kPage * 4, (kElements + page * kPage) * 4)));
    }
    ASSERT_TRUE(region->Unregister().ok());  // While the chunks are read and applied.
    stream->WritesDone();
    v1::StepResponse response;
    while (stream->Read(&response)) {
    }
    const grpc::Status status = stream->Finish();
    // Chunks looked up before the unregistration were applied (from a
    // mapping that stays until they are done), later ones refused.
    EXPECT_TRUE(status.ok() || status.error_code() == grpc::StatusCode::NOT_FOUND)
        << status.error_message();
  }
  EXPECT_EQ(SendAll({RegionChunk("w", 2, 0, *region, 0, kElements * 4)}).code(),
            absl::StatusCode::kNotFound);
  StepBoth(2, grad);  // Whatever was applied, step 2 ends applied once.
  EXPECT_EQ(params_, model_->params_fp32()) << "seed " << seed_;
  model_step_ = 2;
  ExpectExact();
}

TEST_F(SharedMemoryHostileTest, SigkilledClientsLeaveNoRegionAndOthersStayExact) {
  ASSERT_TRUE(client_->RegisterGroup("kill", kElements).ok());
  const std::string target = daemon_->target();
  auto run_child = [&](int delay_ms) {
    int out[2];
    ASSERT_EQ(pipe(out), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    std::vector<std::string> args = {SHM_STEP_CHILD_PATH, target, "kill"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    pollfd p{out[0], POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 20000), 1) << "the child never stepped";
    char buffer[16];
    ASSERT_GT(read(out[0], buffer, sizeof(buffer)), 0) << "the child failed";
    absl::SleepFor(absl::Milliseconds(delay_ms));  // Somewhere in a later step.
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status)) << "the child exited by itself: " << status;
    close(out[0]);
  };
  StepBoth(1);
  run_child(5);  // Warms the daemon up (its heap, gRPC's buffers).
  auto settled = [&] {
    for (int i = 0; i < 500 && RegionMappings(daemon_->pid(), "optstate-region") > 1; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return RegionMappings(daemon_->pid(), "optstate-region");
  };
  ASSERT_EQ(settled(), 1) << "only this test's own client's region is mapped";
  const uint64_t baseline = ResidentBytes(daemon_->pid());
  for (int i = 0; i < 100; ++i) {
    run_child(static_cast<int>(rng_() % 20));
    StepBoth(2 + i);  // Another client, meanwhile, stays exact.
  }
  EXPECT_EQ(params_, model_->params_fp32()) << "seed " << seed_;
  EXPECT_EQ(settled(), 1) << "the killed clients' regions are unmapped";
  const uint64_t after = ResidentBytes(daemon_->pid());
  std::printf("daemon RSS after the warm-up child %llu bytes, after 100 SIGKILLed clients %llu\n",
              static_cast<unsigned long long>(baseline), static_cast<unsigned long long>(after));
#ifndef __SANITIZE_ADDRESS__
  // Under AddressSanitizer the daemon's allocator keeps freed memory in its
  // quarantine, so RSS says nothing there; `make test` checks it.
  EXPECT_LE(after, baseline + baseline / 20) << "RSS " << baseline << " -> " << after;
#endif
  absl::StatusOr<GroupInfo> kill_group = client_->DescribeGroup("kill");
  ASSERT_TRUE(kill_group.ok()) << "the daemon is up";
  EXPECT_GE(kill_group->min_step, 100u) << "every child stepped";
}

TEST(SharedMemoryChoiceTest, AutoFallsBackToTheWireAndSharedMemoryFailsWithoutASocket) {
  for (const char* how : {"--region_socket=none", "socket file removed"}) {
    SCOPED_TRACE(how);
    std::vector<std::string> flags;
    if (std::string(how) == "--region_socket=none") flags.push_back(how);
    auto daemon = DaemonProcess::Start(flags);
    ASSERT_TRUE(daemon.ok());
    if (flags.empty()) {
      const std::string path = RegionSocketOf((*daemon)->target());
      ASSERT_FALSE(path.empty());
      ASSERT_EQ(unlink(path.c_str()), 0);
    }
    ClientOptions automatic;
    automatic.data_plane = DataPlane::kAuto;
    auto client = Client::Connect((*daemon)->target(), automatic);
    ASSERT_TRUE(client.ok());
    std::mt19937 rng(FreshSeed());
    std::vector<float> initial = RandomNormal(rng, 1000, 1.0f);
    ASSERT_TRUE((*client)->RegisterGroup("g", initial).ok());
    GroupModel model(initial, Hyperparameters{});
    std::vector<float> grad = RandomNormal(rng, 1000, 1e-2f), params(1000);
    ASSERT_TRUE((*client)->Step("g", 1, grad, absl::MakeSpan(params)).ok());
    model.Step(1, grad);
    EXPECT_EQ(params, model.params_fp32());

    ClientOptions shared;
    shared.data_plane = DataPlane::kSharedMemory;
    auto strict = Client::Connect((*daemon)->target(), shared);
    ASSERT_TRUE(strict.ok());
    absl::Status status = (*strict)->Step("g", 2, grad, absl::MakeSpan(params));
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_NE(
        status.message().find(flags.empty() ? "cannot be reached" : "offers no region socket"),
        std::string::npos)
        << status;
    EXPECT_NE(status.message().find("kWire"), std::string::npos) << status;
    // Nothing was applied: the group is still at step 1.
    EXPECT_EQ((*client)->DescribeGroup("g")->max_step, 1u);
  }
}

TEST(SharedMemoryChoiceTest, AutoTakesTheWireForGroupsPastTheDaemonsRegionLimit) {
  auto daemon = DaemonProcess::Start({"--max_region_bytes=1048576"});
  ASSERT_TRUE(daemon.ok());
  std::mt19937 rng(FreshSeed());
  const size_t n = 1 << 18;  // 2 MiB of gradient and params: past the limit.
  std::vector<float> initial = RandomNormal(rng, n, 1.0f);
  std::vector<float> grad = RandomNormal(rng, n, 1e-2f), params(n);
  GroupModel model(initial, Hyperparameters{});
  model.Step(1, grad);
  ClientOptions shared;
  shared.data_plane = DataPlane::kSharedMemory;
  auto strict = Client::Connect((*daemon)->target(), shared);
  ASSERT_TRUE(strict.ok());
  ASSERT_TRUE((*strict)->RegisterGroup("g", initial).ok());
  absl::Status refused = (*strict)->Step("g", 1, grad, absl::MakeSpan(params));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("--max_region_bytes"), std::string::npos) << refused;
  ClientOptions auto_options;
  auto_options.data_plane = DataPlane::kAuto;
  auto automatic = Client::Connect((*daemon)->target(), auto_options);
  ASSERT_TRUE(automatic.ok());
  absl::Status status = (*automatic)->Step("g", 1, grad, absl::MakeSpan(params));
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(params, model.params_fp32());
}

TEST(SharedMemoryRestartTest, AClientRegistersItsRegionAgainWithARestartedDaemon) {
  auto first = DaemonProcess::Start();
  ASSERT_TRUE(first.ok());
  const int port = (*first)->port();
  ClientOptions options;
  options.data_plane = DataPlane::kSharedMemory;
  options.initial_backoff = absl::Milliseconds(5);
  auto client = Client::Connect((*first)->target(), options);
  ASSERT_TRUE(client.ok());
  std::mt19937 rng(FreshSeed());
  std::vector<float> initial = RandomNormal(rng, 3000, 1.0f);
  std::vector<float> grad = RandomNormal(rng, 3000, 1e-2f), params(3000);
  ASSERT_TRUE((*client)->RegisterGroup("g", initial).ok());
  ASSERT_TRUE((*client)->Step("g", 1, grad, absl::MakeSpan(params)).ok());
  ASSERT_EQ(*(*first)->Stop(), 0);
  // A new daemon on the same port knows neither the group nor the region.
  auto second = DaemonProcess::Start({absl::StrCat("--listen=127.0.0.1:", port)});
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE((*client)->RegisterGroup("g", initial).ok());
  GroupModel model(initial, Hyperparameters{});
  model.Step(1, grad);
  absl::Status status = (*client)->Step("g", 1, grad, absl::MakeSpan(params));
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(params, model.params_fp32());
}

TEST(SharedMemoryRestartTest, AClientRegistersItsSharedBufferAgainWithARestartedDaemon) {
  auto first = DaemonProcess::Start();
  ASSERT_TRUE(first.ok());
  const int port = (*first)->port();
  ClientOptions options;
  options.data_plane = DataPlane::kSharedMemory;
  options.initial_backoff = absl::Milliseconds(5);
  auto client = Client::Connect((*first)->target(), options);
  ASSERT_TRUE(client.ok());
  constexpr uint64_t kN = 3000;
  auto buffer = (*client)->AllocateSharedBuffer(2 * kN * sizeof(float));
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  float* grad = static_cast<float*>((*buffer)->data());
  float* params = grad + kN;
  std::mt19937 rng(FreshSeed());
  std::vector<float> initial = RandomNormal(rng, kN, 1.0f);
  std::vector<float> g = RandomNormal(rng, kN, 1e-2f);
  std::copy(g.begin(), g.end(), grad);
  ASSERT_TRUE((*client)->RegisterGroup("g", initial).ok());
  ASSERT_TRUE(
      (*client)->Step("g", 1, absl::MakeConstSpan(grad, kN), absl::MakeSpan(params, kN)).ok());
  ASSERT_EQ(*(*first)->Stop(), 0);
  // A new daemon on the same port knows neither the group nor the buffer's region.
  auto second = DaemonProcess::Start({absl::StrCat("--listen=127.0.0.1:", port)});
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE((*client)->RegisterGroup("g", initial).ok());
  GroupModel model(initial, Hyperparameters{});
  model.Step(1, g);
  std::fill(params, params + kN, 0.0f);
  absl::Status status =
      (*client)->Step("g", 1, absl::MakeConstSpan(grad, kN), absl::MakeSpan(params, kN));
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(std::vector<float>(params, params + kN), model.params_fp32())
      << "written by the new daemon into the buffer, registered anew";
}

TEST(UnixListenTest, ClientsReachAUnixSocketDaemonOnBothDataPlanes) {
  const std::string path = absl::StrCat("/tmp/optstate-unix-test-", getpid(), ".sock");
  for (const char* mode : {"0660", "0600"}) {
    SCOPED_TRACE(mode);
    auto daemon = DaemonProcess::Start(
        {absl::StrCat("--listen=unix:", path), absl::StrCat("--socket_mode=", mode)});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, std::stoul(mode, nullptr, 8));
    ASSERT_EQ(stat((path + ".regions").c_str(), &st), 0) << "a region socket beside it";
    EXPECT_EQ(st.st_mode & 0777, std::stoul(mode, nullptr, 8));
    std::mt19937 rng(FreshSeed());
    std::vector<float> initial = RandomNormal(rng, 5000, 1.0f);
    GroupModel model(initial, Hyperparameters{});
    std::vector<float> grad = RandomNormal(rng, 5000, 1e-2f);
    model.Step(1, grad);
    for (DataPlane plane : {DataPlane::kWire, DataPlane::kSharedMemory}) {
      ClientOptions options;
      options.data_plane = plane;
      auto client = Client::Connect("unix:" + path, options);
      ASSERT_TRUE(client.ok());
      const std::string name = plane == DataPlane::kWire ? "wire" : "shm";
      ASSERT_TRUE((*client)->RegisterGroup(name, initial).ok());
      std::vector<float> params(5000);
      absl::Status status = (*client)->Step(name, 1, grad, absl::MakeSpan(params));
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_EQ(params, model.params_fp32());
    }
    EXPECT_EQ(*(*daemon)->Stop(), 0);
  }
}

}  // namespace
}  // namespace optstate
