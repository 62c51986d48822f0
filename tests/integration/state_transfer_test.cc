// ExportState and ImportState against real daemons: a state moved from one
// daemon to another continues bit for bit, and every refused or broken
// import leaves nothing visible and nothing changed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "grpcpp/grpcpp.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/random_tensors.h"

namespace optstate::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kPage = 1024;
constexpr size_t kElements = 7 * kPage + 300;  // 8 pages, the last one partial.
const std::vector<std::string> kFlags = {"--threads=2", "--page_elements=1024"};

std::unique_ptr<DaemonProcess> StartDaemon(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> flags = kFlags;
  flags.insert(flags.end(), extra.begin(), extra.end());
  auto daemon = DaemonProcess::Start(flags);
  EXPECT_TRUE(daemon.ok()) << daemon.status();
  return daemon.ok() ? std::move(*daemon) : nullptr;
}

std::unique_ptr<Client> Connect(const DaemonProcess& daemon, ClientOptions options = {}) {
  auto client = Client::Connect(daemon.target(), options);
  EXPECT_TRUE(client.ok()) << client.status();
  return std::move(*client);
}

Hyperparameters TestHyperparameters() {
  Hyperparameters h;
  h.lr = 3e-3;
  h.beta1 = 0.8;
  h.beta2 = 0.99;
  h.weight_decay = 0.05;
  return h;
}

void ExpectSameState(const Client::GroupState& a, const Client::GroupState& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.page_elements, b.page_elements);
  ASSERT_EQ(a.params.size(), b.params.size());
  EXPECT_EQ(0, std::memcmp(a.params.data(), b.params.data(), a.params.size() * 4)) << "params";
  EXPECT_EQ(0, std::memcmp(a.exp_avg.data(), b.exp_avg.data(), a.params.size() * 4)) << "exp_avg";
  EXPECT_EQ(0, std::memcmp(a.exp_avg_sq.data(), b.exp_avg_sq.data(), a.params.size() * 4))
      << "exp_avg_sq";
  EXPECT_EQ(a.page_steps, b.page_steps);
}

// Steps [first, last] of `grads` (index t-1) on `client`; checks every
// returned param against the scalar fp32 model, bit for bit.
void StepRange(Client& client, const std::string& name, uint64_t first, uint64_t last,
               const std::vector<std::vector<float>>& grads, GroupModel* model) {
  std::vector<float> params(kElements);
  for (uint64_t t = first; t <= last; ++t) {
    ASSERT_TRUE(client.Step(name, t, grads[t - 1], absl::MakeSpan(params)).ok()) << t;
    model->Step(t, grads[t - 1]);
    ASSERT_TRUE(params == model->params_fp32()) << "step " << t;
  }
}

TEST(StateTransferTest, ExportedStateImportedElsewhereContinuesBitForBit) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const Hyperparameters h = TestHyperparameters();
  const std::vector<float> initial = RandomNormal(rng, kElements, 1.0f);
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < 20; ++t) grads.push_back(RandomNormal(rng, kElements, 1e-2f));

  auto uninterrupted = StartDaemon();
  auto first = StartDaemon();
  auto second = StartDaemon();
  ASSERT_TRUE(uninterrupted && first && second);
  auto c0 = Connect(*uninterrupted), c1 = Connect(*first), c2 = Connect(*second);
  GroupModel reference(initial, h), moved(initial, h);
  ASSERT_TRUE(c0->RegisterGroup("w", initial, h).ok());
  StepRange(*c0, "w", 1, 20, grads, &reference);

  ASSERT_TRUE(c1->RegisterGroup("w", initial, h).ok());
  StepRange(*c1, "w", 1, 10, grads, &moved);
  absl::StatusOr<Client::GroupState> exported = c1->ExportState("w");
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->page_elements, kPage);
  EXPECT_EQ(exported->page_steps, std::vector<uint64_t>(8, 10));
  EXPECT_TRUE(exported->params == moved.params_fp32());
  ASSERT_TRUE(c2->ImportState(*exported).ok());
  absl::StatusOr<GroupInfo> info = c2->DescribeGroup("w");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->min_step, 10u);
  EXPECT_EQ(info->max_step, 10u);
  // The bias corrections of steps 11-20 use the imported steps: the params
  // match the uninterrupted model bit for bit.
  StepRange(*c2, "w", 11, 20, grads, &moved);

  absl::StatusOr<Client::GroupState> expected = c0->ExportState("w");
  absl::StatusOr<Client::GroupState> got = c2->ExportState("w");
  ASSERT_TRUE(expected.ok() && got.ok());
  ExpectSameState(*got, *expected);
  EXPECT_EQ(got->page_steps, std::vector<uint64_t>(8, 20));
}

// A state of kElements equal values, every page at `step`.
Client::GroupState UniformState(const std::string& name, uint64_t step) {
  Client::GroupState state;
  state.name = name;
  state.hyperparameters = TestHyperparameters();
  state.params.assign(kElements, 0.5f);
  state.exp_avg.assign(kElements, 0.25f);
  state.exp_avg_sq.assign(kElements, 0.125f);
  state.page_steps = {step};
  return state;
}

TEST(StateTransferTest, OneStepForEveryPageIsAccepted) {
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  auto client = Connect(*daemon);
  const Client::GroupState state = UniformState("one", 7);
  ASSERT_TRUE(client->ImportState(state).ok());
  absl::StatusOr<Client::GroupState> back = client->ExportState("one");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->page_steps, std::vector<uint64_t>(8, 7));
  EXPECT_EQ(back->params, state.params);
  EXPECT_EQ(back->exp_avg, state.exp_avg);
  EXPECT_EQ(back->exp_avg_sq, state.exp_avg_sq);
  // The next step is 8 and uses bias corrections of step 8.
  std::vector<float> grad(kElements, 0.01f), params(kElements);
  ASSERT_TRUE(client->Step("one", 8, grad, absl::MakeSpan(params)).ok());
  std::vector<float> p = state.params, m = state.exp_avg, v = state.exp_avg_sq;
  const Hyperparameters& h = state.hyperparameters;
  AdamWUpdateScalar(
      ComputeAdamWConstants({{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay}, 8, 1.0f}),
      p.data(), m.data(), v.data(), grad.data(), WireType::kFloat32, kElements);
  EXPECT_EQ(params, p);
  EXPECT_NE(params, state.params);
}

TEST(StateTransferTest, AGroupNotYetSteppedOrHalfSteppedMovesWithItsPagesAtStepZero) {
  // ExportState gives a page never stepped at step 0: a group registered and
  // not stepped, or one whose first step broke part-way. Such a state moves
  // (as Rebalance moves it) and continues on the target bit for bit, and it
  // answers a later RegisterGroup as the source does.
  auto source_daemon = StartDaemon();
  auto target_daemon = StartDaemon();
  ASSERT_TRUE(source_daemon && target_daemon);
  auto source = Connect(*source_daemon);
  auto target = Connect(*target_daemon);
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const Hyperparameters h = TestHyperparameters();
  const std::vector<float> initial = RandomNormal(rng, kElements, 1.0f);
  ASSERT_TRUE(source->RegisterGroup("fresh", initial, h).ok());
  absl::StatusOr<Client::GroupState> fresh = source->ExportState("fresh");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->page_steps, std::vector<uint64_t>(8, 0));
  ASSERT_TRUE(target->ImportState(*fresh).ok());
  absl::StatusOr<Client::GroupState> moved = target->ExportState("fresh");
  ASSERT_TRUE(moved.ok()) << moved.status();
  ExpectSameState(*fresh, *moved);
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < 2; ++t) grads.push_back(RandomNormal(rng, kElements, 1e-2f));
  GroupModel model(initial, h);
  StepRange(*target, "fresh", 1, 2, grads, &model);

  // Page 0 at step 1, the others at 0: the first step broke part-way.
  Client::GroupState half = *fresh;
  half.name = "half";
  half.page_steps.assign(8, 0);
  half.page_steps[0] = 1;
  ASSERT_TRUE(target->ImportState(half).ok());
  std::vector<float> params(kElements);
  absl::Status step = target->Step("half", 1, grads[0], absl::MakeSpan(params));
  ASSERT_TRUE(step.ok()) << step;
  GroupModel first(initial, h);
  first.Step(1, grads[0]);
  EXPECT_EQ(0, std::memcmp(params.data(), initial.data(), kPage * 4)) << "page 0 replayed";
  EXPECT_EQ(0, std::memcmp(params.data() + kPage, first.params_fp32().data() + kPage,
                           (kElements - kPage) * 4))
      << "pages 1-7 stepped";

  // Imported at step 0, then registered again with other initial values:
  // the group is found equal and keeps its values, as the source's does.
  Client::GroupState unstepped = *fresh;
  unstepped.name = "unstepped";
  ASSERT_TRUE(target->ImportState(unstepped).ok());
  const std::vector<float> other(kElements, 0.75f);
  ASSERT_TRUE(target->RegisterGroup("unstepped", other, h).ok());
  ASSERT_TRUE(source->RegisterGroup("fresh", other, h).ok());
  for (auto [client, name] : {std::pair{target.get(), "unstepped"}, {source.get(), "fresh"}}) {
    absl::StatusOr<Client::GroupState> kept = client->ExportState(name);
    ASSERT_TRUE(kept.ok());
    EXPECT_EQ(kept->params, initial) << name;
  }
}

TEST(StateTransferTest, APageAtTheLastStepReplaysAndTakesNoStepBeyondIt) {
  // 2^64-2 is the last step a page can reach (ImportState's range): a step
  // beyond it is refused, not taken to a step that could be neither
  // replayed nor exported and imported again.
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  auto client = Connect(*daemon);
  const Client::GroupState state = UniformState("last", UINT64_MAX - 1);
  ASSERT_TRUE(client->ImportState(state).ok());
  std::vector<float> grad(kElements, 0.01f), params(kElements);
  absl::Status beyond = client->Step("last", UINT64_MAX, grad, absl::MakeSpan(params));
  EXPECT_EQ(beyond.code(), absl::StatusCode::kInvalidArgument) << beyond;
  EXPECT_THAT(beyond.message(), HasSubstr("at most 2^64-2"));
  ASSERT_TRUE(client->Step("last", UINT64_MAX - 1, grad, absl::MakeSpan(params)).ok());
  EXPECT_EQ(params, state.params) << "a replay applies nothing";
  absl::StatusOr<Client::GroupState> back = client->ExportState("last");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->page_steps, std::vector<uint64_t>(8, UINT64_MAX - 1));
  ASSERT_TRUE(client->ImportState(*back).ok()) << "imports again";
}

TEST(StateTransferTest, ImportIntoAnEqualGroupReplacesItsWholeState) {
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  auto client = Connect(*daemon);
  const Hyperparameters h = TestHyperparameters();
  std::vector<float> initial(kElements, 1.0f), grad(kElements, 0.1f), params(kElements);
  ASSERT_TRUE(client->RegisterGroup("w", initial, h).ok());
  for (uint64_t t = 1; t <= 3; ++t) {
    ASSERT_TRUE(client->Step("w", t, grad, absl::MakeSpan(params)).ok());
  }
  absl::StatusOr<Client::GroupState> at3 = client->ExportState("w");
  ASSERT_TRUE(at3.ok());
  for (uint64_t t = 4; t <= 6; ++t) {
    ASSERT_TRUE(client->Step("w", t, grad, absl::MakeSpan(params)).ok());
  }
  // load_state_dict: back to step 3.
  ASSERT_TRUE(client->ImportState(*at3).ok());
  absl::StatusOr<Client::GroupState> now = client->ExportState("w");
  ASSERT_TRUE(now.ok());
  ExpectSameState(*now, *at3);
  // Step 4 again applies (the pages are at 3), from the step-3 state.
  std::vector<float> again(kElements);
  ASSERT_TRUE(client->Step("w", 4, grad, absl::MakeSpan(again)).ok());
  std::vector<float> p = at3->params, m = at3->exp_avg, v = at3->exp_avg_sq;
  AdamWUpdateScalar(
      ComputeAdamWConstants({{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay}, 4, 1.0f}),
      p.data(), m.data(), v.data(), grad.data(), WireType::kFloat32, kElements);
  EXPECT_EQ(again, p);
}

TEST(StateTransferTest, ImportIntoAGroupOfAnotherShapeIsAlreadyExists) {
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  auto client = Connect(*daemon);
  const Hyperparameters h = TestHyperparameters();
  std::vector<float> initial(kElements, 1.0f), grad(kElements, 0.1f), params(kElements);
  ASSERT_TRUE(client->RegisterGroup("w", initial, h).ok());
  ASSERT_TRUE(client->Step("w", 1, grad, absl::MakeSpan(params)).ok());
  absl::StatusOr<Client::GroupState> before = client->ExportState("w");
  ASSERT_TRUE(before.ok());

  Client::GroupState bigger = *before;
  bigger.params.push_back(1);
  bigger.exp_avg.push_back(0);
  bigger.exp_avg_sq.push_back(0);
  bigger.page_steps = {1};
  absl::Status s = client->ImportState(bigger);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("num_elements=7468"));

  Client::GroupState other_lr = *before;
  other_lr.hyperparameters.lr = 1e-4;
  s = client->ImportState(other_lr);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("the imported state has num_elements=7468 lr=1e-04"));

  absl::StatusOr<Client::GroupState> after = client->ExportState("w");
  ASSERT_TRUE(after.ok());
  ExpectSameState(*after, *before);
}

TEST(StateTransferTest, TheMessageLimitNeverBites) {
  // The least message limit the daemon takes (one float32 page of 262,144
  // elements and 4 KiB) and a group of 36 MiB of state.
  auto daemon = DaemonProcess::Start({"--threads=2", "--max_message_bytes=1052672"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ClientOptions options;
  options.max_message_bytes = 1052672;
  options.chunk_bytes = 4 << 20;  // More than fits: the client must cut to the limit.
  auto client = Connect(**daemon, options);
  Client::GroupState state;
  state.name = "big";
  const size_t n = 3 * 1024 * 1024 + 5;
  std::mt19937 rng(1);
  state.params = RandomNormal(rng, n, 1.0f);
  state.exp_avg = RandomNormal(rng, n, 1e-3f);
  state.exp_avg_sq.assign(n, 1e-6f);
  state.page_steps = {5};
  ASSERT_TRUE(client->ImportState(state).ok());
  absl::StatusOr<Client::GroupState> back = client->ExportState("big");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->page_elements, 262144u);
  EXPECT_EQ(back->page_steps, std::vector<uint64_t>(13, 5));
  EXPECT_TRUE(back->params == state.params);
  EXPECT_TRUE(back->exp_avg == state.exp_avg);
  EXPECT_TRUE(back->exp_avg_sq == state.exp_avg_sq);
}

// With pages smaller than the default the daemon takes a limit of 1 MiB,
// and an export still fits it: runs of pages leave room for the other
// fields.
TEST(StateTransferTest, AnExportOfSmallPagesFitsTheLeastMessageLimit) {
  auto daemon = DaemonProcess::Start(
      {"--threads=2", "--page_elements=1024", "--max_message_bytes=1048576"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ClientOptions options;
  options.chunk_bytes = 256 << 10;  // Imports well under the daemon's limit.
  auto client = Connect(**daemon, options);
  Client::GroupState state;
  state.name = "small-pages";
  const size_t n = 1024 * 1024 + 5;
  std::mt19937 rng(2);
  state.params = RandomNormal(rng, n, 1.0f);
  state.exp_avg = RandomNormal(rng, n, 1e-3f);
  state.exp_avg_sq.assign(n, 1e-6f);
  state.page_steps = {3};
  ASSERT_TRUE(client->ImportState(state).ok());
  absl::StatusOr<Client::GroupState> back = client->ExportState("small-pages");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->page_elements, 1024u);
  EXPECT_TRUE(back->params == state.params);
  EXPECT_TRUE(back->exp_avg == state.exp_avg);
  EXPECT_TRUE(back->exp_avg_sq == state.exp_avg_sq);
}

// ---- Refused and broken imports, through the raw stub ----

class RawImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = StartDaemon();
    ASSERT_TRUE(daemon_);
    client_ = Connect(*daemon_);
    channel_ = grpc::CreateChannel(daemon_->target(), grpc::InsecureChannelCredentials());
    stub_ = v1::OptimizerState::NewStub(channel_);
  }
  // Refused and broken imports leave nothing behind: under the sanitizers a
  // leak makes the daemon exit non-zero.
  void TearDown() override {
    client_.reset();
    stub_.reset();
    channel_.reset();
    if (daemon_ == nullptr) return;
    absl::StatusOr<int> exit_code = daemon_->Stop();
    ASSERT_TRUE(exit_code.ok()) << exit_code.status();
    EXPECT_EQ(*exit_code, 0);
  }

  static v1::ImportStateRequest Header(const std::string& name, uint64_t n) {
    v1::ImportStateRequest r;
    r.mutable_header()->set_name(name);
    r.mutable_header()->set_num_elements(n);
    return r;
  }
  static v1::ImportStateRequest Chunk(v1::StateTensor tensor, uint64_t offset,
                                      const std::string& data) {
    v1::ImportStateRequest r;
    r.mutable_chunk()->set_tensor(tensor);
    r.mutable_chunk()->set_offset(offset);
    r.mutable_chunk()->set_data(data);
    return r;
  }
  static std::string Floats(size_t n, float value) {
    std::vector<float> v(n, value);
    return std::string(reinterpret_cast<const char*>(v.data()), n * 4);
  }
  static std::string Steps(std::vector<uint64_t> steps) {
    return std::string(reinterpret_cast<const char*>(steps.data()), steps.size() * 8);
  }
  // A whole valid import of `n` elements at step 3.
  static std::vector<v1::ImportStateRequest> Whole(const std::string& name, size_t n) {
    return {Header(name, n), Chunk(v1::STATE_TENSOR_PAGE_STEPS, 0, Steps({3})),
            Chunk(v1::STATE_TENSOR_PARAMS, 0, Floats(n, 1.0f)),
            Chunk(v1::STATE_TENSOR_EXP_AVG, 0, Floats(n, 0.5f)),
            Chunk(v1::STATE_TENSOR_EXP_AVG_SQ, 0, Floats(n, 0.25f))};
  }

  // Sends `requests`; `cancel` breaks the stream after them instead of
  // ending it.
  grpc::Status Send(const std::vector<v1::ImportStateRequest>& requests, bool cancel = false) {
    grpc::ClientContext context;
    v1::ImportStateResponse response;
    auto writer = stub_->ImportState(&context, &response);
    for (const auto& r : requests) {
      if (!writer->Write(r)) break;
    }
    if (cancel) {
      context.TryCancel();
    } else {
      writer->WritesDone();
    }
    return writer->Finish();
  }

  void ExpectNotVisible(const std::string& name) {
    absl::StatusOr<GroupInfo> info = client_->DescribeGroup(name);
    EXPECT_EQ(info.status().code(), absl::StatusCode::kNotFound) << name;
    std::vector<float> grad(kElements, 0.1f), params(kElements);
    EXPECT_EQ(client_->Step(name, 4, grad, absl::MakeSpan(params)).code(),
              absl::StatusCode::kNotFound);
    // The staged memory was given back.
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    uint64_t host_bytes = 1;
    while (absl::Now() < deadline) {
      absl::StatusOr<Stats> stats = client_->GetStats();
      ASSERT_TRUE(stats.ok());
      host_bytes = stats->host_bytes;
      if (host_bytes == baseline_host_bytes_) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(host_bytes, baseline_host_bytes_);
  }

  void ExpectRefused(std::vector<v1::ImportStateRequest> requests, const std::string& message) {
    grpc::Status s = Send(requests);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(message));
    ExpectNotVisible(requests[0].header().name());
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::OptimizerState::Stub> stub_;
  uint64_t baseline_host_bytes_ = 0;
};

TEST_F(RawImportTest, AWholeImportIsVisible) {
  ASSERT_TRUE(Send(Whole("w", kElements)).ok());
  absl::StatusOr<GroupInfo> info = client_->DescribeGroup("w");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->min_step, 3u);
}

TEST_F(RawImportTest, ABrokenStreamLeavesNothingVisible) {
  std::vector<v1::ImportStateRequest> part = Whole("w", kElements);
  part.pop_back();  // exp_avg_sq never arrives.
  EXPECT_FALSE(Send(part, /*cancel=*/true).ok());
  ExpectNotVisible("w");
  // Every piece sent, but the stream broke before it ended: still nothing.
  EXPECT_FALSE(Send(Whole("w", kElements), /*cancel=*/true).ok());
  ExpectNotVisible("w");
}

TEST_F(RawImportTest, MissingPiecesAreRefused) {
  std::vector<v1::ImportStateRequest> r = Whole("w", kElements);
  r.erase(r.begin() + 3);  // No exp_avg.
  ExpectRefused(r, "exp_avg covering elements [0, 0) of 7468");
  r = Whole("w", kElements);
  r[2] = Chunk(v1::STATE_TENSOR_PARAMS, 0, Floats(kElements - 300, 1.0f));
  ExpectRefused(r, "params covering elements [0, 7168) of 7468");
  r = Whole("w", kElements);
  r[1] = Chunk(v1::STATE_TENSOR_PAGE_STEPS, 0, Steps({3, 3, 3}));
  ExpectRefused(r, "carried 3 page steps; send one per page (8 pages of 1024 elements");
  r = Whole("w", kElements);
  r.erase(r.begin() + 1);
  ExpectRefused(r, "carried 0 page steps");
  grpc::Status no_header = Send({Chunk(v1::STATE_TENSOR_PARAMS, 0, Floats(4, 1))});
  EXPECT_EQ(no_header.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(no_header.error_message(), HasSubstr("must carry a header"));
}

TEST_F(RawImportTest, ChunksOutOfRangeOrOrderAreRefused) {
  std::vector<v1::ImportStateRequest> r = Whole("w", kElements);
  r.insert(r.begin() + 3, Chunk(v1::STATE_TENSOR_PARAMS, kElements, Floats(1, 1.0f)));
  ExpectRefused(r, "params chunk covers 1 element from element 7468 but group 'w' has 7468 "
                "elements");
  // An offset near 2^64 is named as sent, not as a wrapped range.
  r = Whole("w", kElements);
  r.insert(r.begin() + 3, Chunk(v1::STATE_TENSOR_PARAMS, UINT64_MAX - 63, Floats(64, 1.0f)));
  ExpectRefused(r, "params chunk starts at element 18446744073709551552");
  r = Whole("w", kElements);
  r.insert(r.begin() + 1, v1::ImportStateRequest());
  ExpectRefused(r, "must carry a chunk (this one carries neither header nor chunk)");
  r = Whole("w", kElements);
  r[2] = Chunk(v1::STATE_TENSOR_PARAMS, 1024, Floats(kElements - 1024, 1.0f));
  ExpectRefused(r, "params chunk starts at element 1024; the next expected is element 0");
  r = Whole("w", kElements);
  r[1] = Chunk(v1::STATE_TENSOR_PAGE_STEPS, 0, Steps(std::vector<uint64_t>(9, 3)));
  ExpectRefused(r, "page_steps chunk covers pages [0, 9) but group 'w' has 8 pages");
  r = Whole("w", kElements);
  r[3] = Chunk(v1::STATE_TENSOR_UNSPECIFIED, 0, Floats(kElements, 0.5f));
  ExpectRefused(r, "is not a tensor of the state");
}

TEST_F(RawImportTest, WrongSizesAreRefused) {
  std::vector<v1::ImportStateRequest> r = Whole("w", kElements);
  r[2].mutable_chunk()->mutable_data()->push_back('x');
  ExpectRefused(r, "a params chunk holds 29873 bytes");
  r = Whole("w", kElements);
  r[1].mutable_chunk()->mutable_data()->pop_back();
  ExpectRefused(r, "a page_steps chunk holds 7 bytes");
  ExpectRefused({Header("w", 0)}, "num_elements must be at least 1");
}

TEST_F(RawImportTest, NonFiniteValuesNegativeSquaresAndBadStepsAreRefused) {
  std::vector<v1::ImportStateRequest> r = Whole("w", kElements);
  std::string data = Floats(kElements, 0.5f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&data[4 * 5000], &nan, 4);
  r[3] = Chunk(v1::STATE_TENSOR_EXP_AVG, 0, data);
  ExpectRefused(r, "exp_avg element 5000 is nan; values must be finite");
  r = Whole("w", kElements);
  data = Floats(kElements, 0.5f);
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(&data[4 * 7], &inf, 4);
  r[2] = Chunk(v1::STATE_TENSOR_PARAMS, 0, data);
  ExpectRefused(r, "params element 7 is inf; values must be finite");
  r = Whole("w", kElements);
  data = Floats(kElements, 0.25f);
  std::memcpy(&data[4 * 9], &nan, 4);
  r[4] = Chunk(v1::STATE_TENSOR_EXP_AVG_SQ, 0, data);
  ExpectRefused(r, "exp_avg_sq element 9 is nan; values must be finite (the squares may be +inf)");
  r = Whole("w", kElements);
  data = Floats(kElements, 0.25f);
  const float below = -1e-30f;
  std::memcpy(&data[4 * 5000], &below, 4);
  r[4] = Chunk(v1::STATE_TENSOR_EXP_AVG_SQ, 0, data);
  r[0].mutable_header()->set_accept_non_finite(true);  // Never below 0, accepted or not.
  ExpectRefused(r, "exp_avg_sq element 5000 is -1e-30; exp_avg_sq is never below 0");
  r = Whole("w", kElements);
  r[1] = Chunk(v1::STATE_TENSOR_PAGE_STEPS, 0, Steps({3, 3, 3, 3, 3, 3, 3, UINT64_MAX}));
  ExpectRefused(r, "page step 18446744073709551615 of page 7 is out of range");
}

// Finite gradients at float32's edge, with torch's default hyperparameters:
// 3.4e38 squares to +inf, and the next step's -3.4e38 leaves exp_avg -inf
// and params NaN (torch's AdamW does the same). ImportState refuses that
// state ("values must be finite") unless the header accepts it, as a
// Rebalance's move does; then it takes it, bit for bit.
TEST_F(RawImportTest, TheStateOfADivergedRunIsImportedBitForBit) {
  ASSERT_TRUE(
      client_->RegisterGroup("diverged", std::vector<float>(kElements, 1.0f), Hyperparameters{})
          .ok());
  std::vector<float> params(kElements);
  ASSERT_TRUE(
      client_->Step("diverged", 1, std::vector<float>(kElements, 3.4e38f), absl::MakeSpan(params))
          .ok());
  ASSERT_TRUE(
      client_->Step("diverged", 2, std::vector<float>(kElements, -3.4e38f), absl::MakeSpan(params))
          .ok());
  absl::StatusOr<Client::GroupState> exported = client_->ExportState("diverged");
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_TRUE(std::isnan(exported->params[0])) << exported->params[0];
  ASSERT_TRUE(std::isinf(exported->exp_avg[0])) << exported->exp_avg[0];
  ASSERT_TRUE(std::isinf(exported->exp_avg_sq[0])) << exported->exp_avg_sq[0];
  Client::GroupState copy = *exported;
  copy.name = "diverged.copy";
  absl::Status refused = client_->ImportState(copy);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("accept_non_finite"));
  EXPECT_EQ(client_->DescribeGroup("diverged.copy").status().code(), absl::StatusCode::kNotFound);
  copy.accept_non_finite = true;
  ASSERT_TRUE(client_->ImportState(copy).ok());
  absl::StatusOr<Client::GroupState> again = client_->ExportState("diverged.copy");
  ASSERT_TRUE(again.ok()) << again.status();
  const size_t bytes = kElements * sizeof(float);
  EXPECT_EQ(std::memcmp(again->params.data(), exported->params.data(), bytes), 0);
  EXPECT_EQ(std::memcmp(again->exp_avg.data(), exported->exp_avg.data(), bytes), 0);
  EXPECT_EQ(std::memcmp(again->exp_avg_sq.data(), exported->exp_avg_sq.data(), bytes), 0);
  EXPECT_EQ(again->page_steps, exported->page_steps);
}

TEST_F(RawImportTest, ARefusedImportLeavesAnExistingGroupAsItWas) {
  const Hyperparameters h;
  std::vector<float> initial(kElements, 1.0f), grad(kElements, 0.1f), params(kElements);
  ASSERT_TRUE(client_->RegisterGroup("w", initial, h).ok());
  ASSERT_TRUE(client_->Step("w", 1, grad, absl::MakeSpan(params)).ok());
  absl::StatusOr<Client::GroupState> before = client_->ExportState("w");
  ASSERT_TRUE(before.ok());
  absl::StatusOr<Stats> stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  std::vector<v1::ImportStateRequest> r = Whole("w", kElements);
  r[1] = Chunk(v1::STATE_TENSOR_PAGE_STEPS, 0, Steps({UINT64_MAX}));
  EXPECT_EQ(Send(r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = Whole("w", kElements);
  EXPECT_FALSE(Send(r, /*cancel=*/true).ok());
  absl::StatusOr<Client::GroupState> after = client_->ExportState("w");
  ASSERT_TRUE(after.ok());
  ExpectSameState(*after, *before);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline && client_->GetStats()->host_bytes != stats->host_bytes) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(client_->GetStats()->host_bytes, stats->host_bytes);
}

TEST_F(RawImportTest, ExportOfAnUnknownGroupIsNotFound) {
  absl::StatusOr<Client::GroupState> s = client_->ExportState("nope");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("no group named 'nope'"));
}

}  // namespace
}  // namespace optstate::testing
