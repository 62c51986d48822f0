// Checkpoints of real daemons: the round trip across SIGTERM, the trainer's
// Checkpoint{wait_for_step} contract and its refusals, GetStats, and steps
// taken while checkpoints are written (every result exact, every checkpoint
// consistent per page, read back by an independent reader of the format).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/kernels/adamw_kernel.h"
#include "tests/integration/durability_testing.h"

namespace optstate::testing {
namespace {

using ::testing::HasSubstr;

TEST(CheckpointTest, RoundTripAcrossSigtermIsBitIdenticalToAnUninterruptedRun) {
  const CkptWorkload work(FreshSeed());
  std::map<uint64_t, StateOfGroups> reference = ReferenceStates(work, {40});
  const std::string dir = FreshDirectory("roundtrip");
  {
    auto daemon = DaemonProcess::Start(CkptFlags(dir));
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    auto client = ConnectTo(**daemon);
    work.Register(*client);
    work.Steps(*client, 1, 20);
    Client::CheckpointRequestOptions ask;
    ask.wait_for_step = 20;
    absl::StatusOr<Client::CheckpointResult> ckpt = client->Checkpoint(ask);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    EXPECT_EQ(ckpt->id, "ckpt-0000000000000001");
    EXPECT_EQ(ckpt->step, 20u);
    EXPECT_GT(ckpt->bytes, (64 * 1024 + 4 * 1024 + 77) * 12u);
    client.reset();  // A connected client delays gRPC's shutdown by seconds.
    absl::StatusOr<int> exit_code = (*daemon)->Stop();
    ASSERT_TRUE(exit_code.ok());
    EXPECT_EQ(*exit_code, 0);
  }
  auto daemon = DaemonProcess::Start(CkptFlags(dir, {"--require_state"}));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = ConnectTo(**daemon);
  absl::StatusOr<Stats> stats = client->GetStats();
  ASSERT_TRUE(stats.ok());
  // SIGTERM wrote a second checkpoint (the final one), which is restored.
  EXPECT_EQ(stats->restored_checkpoint_id, "ckpt-0000000000000002");
  EXPECT_EQ(stats->restore_refusals.size(), 0);
  absl::StatusOr<GroupInfo> info = client->DescribeGroup("model.w");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->min_step, 20u);
  EXPECT_EQ(info->max_step, 20u);
  // Steps 21-40 use bias corrections of steps 21-40 (the steps survived).
  work.Steps(*client, 21, 40);
  EXPECT_TRUE(SameState(ExportAll(*client), reference[40]));
}

// Two daemons on one state_dir would remove each other's checkpoints: the
// second is refused at start, naming the first, and the first goes on; once
// the first has exited the directory is free again.
TEST(CheckpointTest, ASecondDaemonOnTheSameStateDirIsRefusedAtStart) {
  const CkptWorkload work(FreshSeed());
  std::map<uint64_t, StateOfGroups> reference = ReferenceStates(work, {4});
  const std::string dir = FreshDirectory("locked");
  const std::string second_log = FreshDirectory("locked-log") + "/second.log";
  auto first = DaemonProcess::Start(CkptFlags(dir));
  ASSERT_TRUE(first.ok()) << first.status();
  auto client = ConnectTo(**first);
  work.Register(*client);
  work.Steps(*client, 1, 2);
  ASSERT_TRUE(client->Checkpoint({}).ok());

  auto second = DaemonProcess::Start(CkptFlags(dir), second_log);
  EXPECT_FALSE(second.ok()) << "a second daemon served on the first one's state_dir";
  std::ifstream log(second_log);
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text,
              HasSubstr(absl::StrCat("--state_dir=", dir, " is in use by another optstated (pid ",
                                     (*first)->pid(), ")")));

  work.Steps(*client, 3, 4);
  absl::StatusOr<Client::CheckpointResult> after = client->Checkpoint({});
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->id, "ckpt-0000000000000002");
  client.reset();
  ASSERT_TRUE((*first)->Stop().ok());

  auto third = DaemonProcess::Start(CkptFlags(dir, {"--require_state"}));
  ASSERT_TRUE(third.ok()) << third.status();
  client = ConnectTo(**third);
  EXPECT_TRUE(SameState(ExportAll(*client), reference[4]));
}

TEST(CheckpointTest, WaitForStepWaitsUntilEveryPageReachesIt) {
  const CkptWorkload work(FreshSeed());
  std::map<uint64_t, StateOfGroups> reference = ReferenceStates(work, {3, 4});
  const std::string dir = FreshDirectory("wait");
  auto daemon = DaemonProcess::Start(CkptFlags(dir));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = ConnectTo(**daemon);
  work.Register(*client);
  work.Steps(*client, 1, 3);
  absl::StatusOr<Client::CheckpointResult> result = absl::UnknownError("not run");
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    Client::CheckpointRequestOptions ask;
    ask.wait_for_step = 4;
    ask.groups = {"model.w"};
    result = client->Checkpoint(ask);
    returned = true;
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(returned) << "returned before step 4";
  work.Steps(*client, 4, 4);
  waiter.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->step, 4u);
  // What was written is the step-4 state: restore it elsewhere and compare.
  (*daemon).reset();  // kill -9: no final checkpoint.
  auto restored = DaemonProcess::Start(CkptFlags(dir));
  ASSERT_TRUE(restored.ok()) << restored.status();
  auto again = ConnectTo(**restored);
  const StateOfGroups back = ExportAll(*again);
  // model.w was waited for: all of it is at step 4.
  EXPECT_TRUE(SameState(back, {{"model.w", reference[4].at("model.w")}}));
  // model.b was not: its pages were written as they were, each at step 3 or
  // 4 (step 4's Step call may still have been applying them).
  EXPECT_TRUE(EachPageAtItsOwnStep(back, reference, "model.b"));
}

TEST(CheckpointTest, BadCheckpointCallsGetTheirCodesAndWriteNothing) {
  const CkptWorkload work(1);
  const std::string dir = FreshDirectory("badcalls");
  auto daemon = DaemonProcess::Start(CkptFlags(dir));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ClientOptions options;
  options.attempt_timeout = absl::Milliseconds(400);
  auto client = ConnectTo(**daemon, options);
  work.Register(*client);
  work.Steps(*client, 1, 5);

  Client::CheckpointRequestOptions unknown;
  unknown.groups = {"no.such.group"};
  absl::StatusOr<Client::CheckpointResult> r = client->Checkpoint(unknown);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no.such.group"));

  Client::CheckpointRequestOptions past;
  past.wait_for_step = 3;
  r = client->Checkpoint(past);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("is at step 5, past step 3"));

  Client::CheckpointRequestOptions future;
  future.wait_for_step = 1000000;
  const absl::Time started = absl::Now();
  r = client->Checkpoint(future);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_LT(absl::Now() - started, absl::Seconds(5));

  // Nothing was written by any of them.
  absl::StatusOr<Stats> stats = client->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->checkpoints_written, 0u);
  EXPECT_FALSE(stats->last_checkpoint.has_value());
  EXPECT_THAT(CheckpointNamesIn(dir), ::testing::IsEmpty());
  // The daemon still serves and steps.
  work.Steps(*client, 6, 6);
  r = client->Checkpoint({});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 6u);
  client.reset();
  absl::StatusOr<int> exit_code = (*daemon)->Stop();
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
}

TEST(CheckpointTest, WithoutStateDirCheckpointIsFailedPrecondition) {
  auto daemon = DaemonProcess::Start({"--threads=2"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = ConnectTo(**daemon);
  absl::StatusOr<Client::CheckpointResult> r = client->Checkpoint({});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("--state_dir"));
}

TEST(CheckpointTest, GetStatsReportsTheLastCheckpointAndFailures) {
  const CkptWorkload work(2);
  const std::string dir = FreshDirectory("stats");
  auto daemon = DaemonProcess::Start(CkptFlags(dir, {"--checkpoints_to_keep=1"}));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = ConnectTo(**daemon);
  work.Register(*client);
  work.Steps(*client, 1, 2);
  const int64_t before = absl::ToUnixMicros(absl::Now());
  absl::StatusOr<Client::CheckpointResult> r = client->Checkpoint({});
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<Stats> stats = client->GetStats();
  ASSERT_TRUE(stats.ok());
  ASSERT_TRUE(stats->last_checkpoint.has_value());
  EXPECT_EQ(stats->last_checkpoint->id, r->id);
  EXPECT_EQ(stats->last_checkpoint->step, 2u);
  EXPECT_EQ(stats->last_checkpoint->bytes, r->bytes);
  EXPECT_GT(stats->last_checkpoint->duration_seconds, 0.0);
  EXPECT_GE(stats->last_checkpoint->finished_unix_micros, before);
  EXPECT_LE(stats->last_checkpoint->finished_unix_micros, absl::ToUnixMicros(absl::Now()));
  EXPECT_EQ(stats->checkpoints_written, 1u);
  EXPECT_EQ(stats->checkpoint_failures, 0u);
  // A state_dir that can no longer take files: the checkpoint fails and is counted.
  std::filesystem::remove_all(dir);
  { std::ofstream(dir) << "not a directory"; }
  r = client->Checkpoint({});
  EXPECT_FALSE(r.ok());
  stats = client->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->checkpoint_failures, 1u);
  EXPECT_THAT(stats->last_checkpoint_error, HasSubstr(dir));
  ASSERT_TRUE(stats->last_checkpoint.has_value());
  EXPECT_EQ(stats->last_checkpoint->id, "ckpt-0000000000000001");
  std::filesystem::remove(dir);
}

TEST(CheckpointTest, TheIntervalWritesCheckpointsAndOnlyTheNewestAreKept) {
  const CkptWorkload work(3);
  const std::string dir = FreshDirectory("interval");
  auto daemon = DaemonProcess::Start(
      CkptFlags(dir, {"--checkpoint_interval=50ms", "--checkpoints_to_keep=2"}));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = ConnectTo(**daemon);
  work.Register(*client);
  work.Steps(*client, 1, 2);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  uint64_t written = 0;
  Stats stats;
  while (absl::Now() < deadline &&
         (written < 4 || !stats.last_checkpoint || stats.last_checkpoint->step != 2)) {
    absl::SleepFor(absl::Milliseconds(20));
    absl::StatusOr<Stats> s = client->GetStats();
    ASSERT_TRUE(s.ok());
    stats = *s;
    written = stats.checkpoints_written;
  }
  ASSERT_GE(written, 4u) << "the timer wrote too few checkpoints";
  ASSERT_TRUE(stats.last_checkpoint.has_value());
  EXPECT_EQ(stats.last_checkpoint->step, 2u);
  EXPECT_EQ(stats.checkpoint_failures, 0u);
  client.reset();
  ASSERT_TRUE((*daemon)->Stop().ok());
  // Two complete checkpoints remain, the newest ones, and no temporary ones.
  const std::vector<std::string> names = CheckpointNamesIn(dir);
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].substr(0, 5), "ckpt-");
  EXPECT_EQ(names[0].find(".tmp"), std::string::npos);
  EXPECT_EQ(std::stoull(names[1].substr(5)), std::stoull(names[0].substr(5)) + 1);
}

TEST(CheckpointTest, ByDefaultNoTimerWrites) {
  const CkptWorkload work(4);
  const std::string dir = FreshDirectory("notimer");
  auto daemon = DaemonProcess::Start(CkptFlags(dir));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = ConnectTo(**daemon);
  work.Register(*client);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(client->GetStats()->checkpoints_written, 0u);
  EXPECT_THAT(CheckpointNamesIn(dir), ::testing::IsEmpty());
}

// An independent reader of the data file format (docs/durability.md): per
// page a uint64 step, uint64 flags, then params, exp_avg, exp_avg_sq.
struct PageRecord {
  uint64_t step;
  std::vector<float> p, m, v;
};
std::vector<PageRecord> ReadDataFile(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::vector<PageRecord> pages;
  for (size_t begin = 0; begin < n; begin += kCkptPage) {
    const size_t count = std::min<size_t>(kCkptPage, n - begin);
    PageRecord r;
    uint64_t header[2];
    in.read(reinterpret_cast<char*>(header), 16);
    r.step = header[0];
    for (auto* t : {&r.p, &r.m, &r.v}) {
      t->resize(count);
      in.read(reinterpret_cast<char*>(t->data()), count * 4);
    }
    pages.push_back(std::move(r));
  }
  EXPECT_TRUE(in.good()) << path;
  return pages;
}

TEST(CheckpointTest, StepsDuringCheckpointsAreExactAndEachCheckpointIsConsistentPerPage) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  constexpr uint64_t kSteps = 30;
  const CkptWorkload work(seed, kSteps);
  // The reference for every step: the scalar fp32 kernel, kept per step.
  const std::string name = kCkptGroups[0].first;
  const size_t n = kCkptGroups[0].second;
  const Hyperparameters h = CkptHyperparameters();
  std::vector<std::vector<float>> ref_p(kSteps + 1), ref_m(kSteps + 1), ref_v(kSteps + 1);
  ref_p[0] = work.initial(name);
  ref_m[0].assign(n, 0.0f);
  ref_v[0].assign(n, 0.0f);
  for (uint64_t t = 1; t <= kSteps; ++t) {
    ref_p[t] = ref_p[t - 1];
    ref_m[t] = ref_m[t - 1];
    ref_v[t] = ref_v[t - 1];
    AdamWUpdateScalar(
        ComputeAdamWConstants({{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay}, t, 1.0f}),
        ref_p[t].data(), ref_m[t].data(), ref_v[t].data(), work.grad(name, t).data(),
        WireType::kFloat32, n);
  }
  const std::string dir = FreshDirectory("during");
  // A small writer buffer (4 pages): a checkpoint takes many runs.
  auto daemon = DaemonProcess::Start(
      CkptFlags(dir, {"--checkpoints_to_keep=1000", "--checkpoint_buffer_bytes=49152"}));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = ConnectTo(**daemon);
  work.Register(*client);
  std::atomic<bool> done{false};
  std::thread stepper([&] {
    std::vector<float> params(n);
    for (uint64_t t = 1; t <= kSteps; ++t) {
      ASSERT_TRUE(client->Step(name, t, work.grad(name, t), absl::MakeSpan(params)).ok()) << t;
      EXPECT_TRUE(params == ref_p[t]) << "step " << t;
    }
    done = true;
  });
  std::vector<std::string> ids;
  while (!done) {
    absl::StatusOr<Client::CheckpointResult> r = client->Checkpoint({});
    ASSERT_TRUE(r.ok()) << r.status();
    ids.push_back(r->id);
  }
  stepper.join();
  ASSERT_FALSE(ids.empty());
  int mixed = 0;
  for (const std::string& id : ids) {
    // group-0 is model.b and group-1 model.w (sorted by name).
    std::vector<PageRecord> pages = ReadDataFile(dir + "/" + id + "/group-1.data", n);
    std::set<uint64_t> steps;
    for (size_t p = 0; p < pages.size(); ++p) {
      const uint64_t s = pages[p].step;
      steps.insert(s);
      ASSERT_LE(s, kSteps);
      const size_t begin = p * kCkptPage;
      const size_t count = pages[p].p.size();
      ASSERT_EQ(0, std::memcmp(pages[p].p.data(), ref_p[s].data() + begin, count * 4))
          << id << " page " << p << " step " << s;
      ASSERT_EQ(0, std::memcmp(pages[p].m.data(), ref_m[s].data() + begin, count * 4));
      ASSERT_EQ(0, std::memcmp(pages[p].v.data(), ref_v[s].data() + begin, count * 4));
    }
    if (steps.size() > 1) ++mixed;
  }
  std::cout << ids.size() << " checkpoints during " << kSteps << " steps, " << mixed
            << " caught pages at different steps\n";
}

}  // namespace
}  // namespace optstate::testing
