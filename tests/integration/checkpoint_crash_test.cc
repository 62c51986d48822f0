// A daemon killed with SIGKILL at named moments of writing a checkpoint
// (the writer's test-only pause hook), and checkpoints damaged on disk:
// after a restart the state equals one complete checkpoint, never a mix,
// every damaged one is refused with its own message, the previous complete
// checkpoint is used, and the next steps continue exactly.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iterator>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/durability_testing.h"

namespace optstate::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kSeed = 15;
const char kFirst[] = "ckpt-0000000000000001";
const char kSecond[] = "ckpt-0000000000000002";

const std::map<uint64_t, StateOfGroups>& References() {
  static const auto* states =
      new std::map<uint64_t, StateOfGroups>(ReferenceStates(CkptWorkload(kSeed), {3, 5, 7}));
  return *states;
}

// Pages of 1024 elements and a writer buffer of 4 pages: model.b (group 0)
// is written in 2 runs, model.w (group 1) in 16.
std::vector<std::string> CrashFlags(const std::string& dir) {
  return CkptFlags(dir, {"--checkpoints_to_keep=1", "--checkpoint_buffer_bytes=49152"});
}

bool WaitForFile(const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (std::filesystem::exists(path)) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

struct Moment {
  const char* point;
  bool second_is_complete;  // The rename of step 5 of the writer happened.
};

void PrintTo(const Moment& moment, std::ostream* os) { *os << moment.point; }

class KillDuringCheckpointTest : public ::testing::TestWithParam<Moment> {};

TEST_P(KillDuringCheckpointTest, RestartFindsOneWholeCheckpointAndContinuesExactly) {
  const Moment moment = GetParam();
  const CkptWorkload work(kSeed);
  const auto& reference = References();
  const std::string dir = FreshDirectory("crash");
  const std::string paused =
      dir + "/../" + std::filesystem::path(dir).filename().string() + ".paused";
  std::filesystem::remove(paused);
  setenv("OPTSTATE_TEST_CHECKPOINT_PAUSE", absl::StrCat("2:", moment.point).c_str(), 1);
  setenv("OPTSTATE_TEST_CHECKPOINT_PAUSE_FILE", paused.c_str(), 1);
  auto daemon = DaemonProcess::Start(CrashFlags(dir));
  unsetenv("OPTSTATE_TEST_CHECKPOINT_PAUSE");
  unsetenv("OPTSTATE_TEST_CHECKPOINT_PAUSE_FILE");
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  {
    ClientOptions options;
    options.max_attempts = 1;
    auto client = ConnectTo(**daemon, options);
    work.Register(*client);
    work.Steps(*client, 1, 3);
    Client::CheckpointRequestOptions at3;
    at3.wait_for_step = 3;
    absl::StatusOr<Client::CheckpointResult> first = client->Checkpoint(at3);
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_EQ(first->id, kFirst);
    work.Steps(*client, 4, 5);
    std::thread second([&] {
      Client::CheckpointRequestOptions at5;
      at5.wait_for_step = 5;
      absl::StatusOr<Client::CheckpointResult> r = client->Checkpoint(at5);
      EXPECT_FALSE(r.ok()) << "the daemon was killed before it answered";
    });
    const bool reached = WaitForFile(paused, absl::Seconds(20));
    (*daemon).reset();  // SIGKILL while the writer is stopped at the point.
    second.join();
    ASSERT_TRUE(reached) << "the writer never reached " << moment.point;
  }
  if (!moment.second_is_complete) {
    ASSERT_THAT(CheckpointNamesIn(dir), ::testing::Contains(std::string(kSecond) + ".tmp"))
        << "the crash left the unfinished checkpoint behind";
  }
  auto restarted = DaemonProcess::Start(CrashFlags(dir));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  // Before it served, the restart removed the unfinished checkpoint.
  EXPECT_THAT(CheckpointNamesIn(dir), ::testing::Each(::testing::Not(::testing::EndsWith(".tmp"))));
  auto client = ConnectTo(**restarted);
  absl::StatusOr<Stats> stats = client->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->restored_checkpoint_id, moment.second_is_complete ? kSecond : kFirst);
  EXPECT_EQ(stats->restore_refusals.size(), 0) << stats->restore_refusals[0];
  const uint64_t step = moment.second_is_complete ? 5 : 3;
  EXPECT_TRUE(SameState(ExportAll(*client), reference.at(step)));
  work.Steps(*client, step + 1, 7);
  EXPECT_TRUE(SameState(ExportAll(*client), reference.at(7)));
  // The next checkpoint of the restarted daemon gets a fresh id (past the
  // unfinished one's) and prunes the older ones.
  absl::StatusOr<Client::CheckpointResult> next = client->Checkpoint({});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->id, "ckpt-0000000000000003");
  EXPECT_EQ(CheckpointNamesIn(dir), std::vector<std::string>{"ckpt-0000000000000003"});
  std::filesystem::remove(paused);
}

// 20 moments: every step of the crash-safety argument and runs across both
// data files.
INSTANTIATE_TEST_SUITE_P(
    Moments, KillDuringCheckpointTest,
    ::testing::Values(Moment{"dir_created", false}, Moment{"run:0:0", false},
                      Moment{"run:0:1", false}, Moment{"data_synced:0", false},
                      Moment{"run:1:0", false}, Moment{"run:1:1", false}, Moment{"run:1:2", false},
                      Moment{"run:1:3", false}, Moment{"run:1:5", false}, Moment{"run:1:7", false},
                      Moment{"run:1:9", false}, Moment{"run:1:12", false},
                      Moment{"run:1:15", false}, Moment{"data_synced:1", false},
                      Moment{"manifest_written", false}, Moment{"manifest_synced", false},
                      Moment{"manifest_renamed", false}, Moment{"dir_renamed", true},
                      Moment{"dir_synced", true}, Moment{"pruned:0", true}),
    [](const ::testing::TestParamInfo<Moment>& info) {
      std::string name = info.param.point;
      for (char& c : name) {
        if (c == ':') c = '_';
      }
      return name;
    });

// ---- Changes while a checkpoint is written ----

// A checkpoint paused after its first run of model.w's pages (the writer's
// pause hook, told to go on once its file is removed), and the daemon of it.
class DuringCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshDirectory("during");
    paused_ = dir_ + ".paused";
    std::filesystem::remove(paused_);
  }
  void TearDown() override { std::filesystem::remove(paused_); }

  void StartPausingAt(const std::string& point) {
    setenv("OPTSTATE_TEST_CHECKPOINT_PAUSE", absl::StrCat("2:", point).c_str(), 1);
    setenv("OPTSTATE_TEST_CHECKPOINT_PAUSE_FILE", paused_.c_str(), 1);
    setenv("OPTSTATE_TEST_CHECKPOINT_RESUME", "1", 1);
    auto daemon = DaemonProcess::Start(CrashFlags(dir_));
    unsetenv("OPTSTATE_TEST_CHECKPOINT_PAUSE");
    unsetenv("OPTSTATE_TEST_CHECKPOINT_PAUSE_FILE");
    unsetenv("OPTSTATE_TEST_CHECKPOINT_RESUME");
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    client_ = ConnectTo(*daemon_);
    work_.Register(*client_);
    work_.Steps(*client_, 1, 3);
    ASSERT_TRUE(client_->Checkpoint({}).ok());  // ckpt 1, not paused.
  }

  // SIGKILL (no final checkpoint), a restart, and client_ on it: the
  // restart must have restored ckpt 2.
  void KillAndRestoreTheSecondCheckpoint() {
    client_.reset();
    daemon_.reset();
    auto restarted = DaemonProcess::Start(CrashFlags(dir_));
    ASSERT_TRUE(restarted.ok()) << restarted.status();
    daemon_ = std::move(*restarted);
    client_ = ConnectTo(*daemon_);
    absl::StatusOr<Stats> stats = client_->GetStats();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->restored_checkpoint_id, kSecond);
  }

  std::string dir_, paused_;
  const CkptWorkload work_{kSeed};
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
};

// An ImportState over model.w landed between two runs of a checkpoint's
// pages: the checkpoint held some pages of the old state and the rest of the
// imported one, at the same step, and was restored as such. The import now
// waits for the checkpoint, which holds the old state whole.
TEST_F(DuringCheckpointTest, AnImportWaitsForTheCheckpointBeingWritten) {
  StartPausingAt("run:1:0");
  absl::StatusOr<Client::GroupState> old = client_->ExportState("model.w");
  ASSERT_TRUE(old.ok());
  Client::GroupState imported = *old;
  for (float& p : imported.params) p += 1.0f;
  std::thread checkpoint([&] { EXPECT_TRUE(client_->Checkpoint({}).ok()); });
  ASSERT_TRUE(WaitForFile(paused_, absl::Seconds(20)));
  std::atomic<bool> imported_done{false};
  std::thread import([&] {
    EXPECT_TRUE(client_->ImportState(imported).ok());
    imported_done = true;
  });
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_FALSE(imported_done.load()) << "the import landed in the middle of the checkpoint";
  std::filesystem::remove(paused_);  // The writer goes on.
  checkpoint.join();
  import.join();
  ASSERT_NO_FATAL_FAILURE(KillAndRestoreTheSecondCheckpoint());
  EXPECT_TRUE(SameState(ExportAll(*client_), References().at(3)));
}

// A Checkpoint naming a group waited behind another checkpoint while the
// group was deleted: it answered OK with step 2^64 - 1 for a checkpoint
// without the group, and the checkpoint it waited behind failed ABORTED.
// Now the named one is NOT_FOUND, and the other is written without the group.
TEST_F(DuringCheckpointTest, AGroupDeletedWhileCheckpointsWaitIsLeftOutOrNotFound) {
  StartPausingAt("dir_created");
  std::thread whole([&] {
    absl::StatusOr<Client::CheckpointResult> r = client_->Checkpoint({});
    EXPECT_TRUE(r.ok()) << r.status();
  });
  ASSERT_TRUE(WaitForFile(paused_, absl::Seconds(20)));
  std::thread named([&] {
    Client::CheckpointRequestOptions options;
    options.groups = {"model.b"};
    absl::StatusOr<Client::CheckpointResult> r = client_->Checkpoint(options);
    // Deleted while it waited behind the paused checkpoint ("was deleted"),
    // or, on a machine slow to start this thread, before it looked ("no
    // group named"): NOT_FOUND either way, never OK.
    EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("'model.b'"));
  });
  absl::SleepFor(absl::Milliseconds(500));  // The named call waits behind the paused one.
  ASSERT_TRUE(client_->DeleteGroup("model.b").ok());
  std::filesystem::remove(paused_);
  whole.join();
  named.join();
  ASSERT_NO_FATAL_FAILURE(KillAndRestoreTheSecondCheckpoint());
  absl::StatusOr<std::vector<GroupInfo>> groups = client_->ListGroups();
  ASSERT_TRUE(groups.ok());
  ASSERT_EQ(groups->size(), 1u);
  EXPECT_EQ((*groups)[0].name, "model.w");
}

// A group deleted after its pages were captured, while the rest of the
// checkpoint was written: the delete was answered first, yet the checkpoint
// held the group, and a restart brought it back. It is left out now (as if
// the delete came first); named by the call, the checkpoint is NOT_FOUND.
TEST_F(DuringCheckpointTest, AGroupDeletedAfterItsPagesWereWrittenIsLeftOutOrNotFound) {
  StartPausingAt("data_synced:0");  // model.b, the first group, written whole.
  std::thread whole([&] {
    absl::StatusOr<Client::CheckpointResult> r = client_->Checkpoint({});
    EXPECT_TRUE(r.ok()) << r.status();
  });
  ASSERT_TRUE(WaitForFile(paused_, absl::Seconds(20)));
  ASSERT_TRUE(client_->DeleteGroup("model.b").ok());
  std::filesystem::remove(paused_);
  whole.join();
  ASSERT_NO_FATAL_FAILURE(KillAndRestoreTheSecondCheckpoint());
  absl::StatusOr<std::vector<GroupInfo>> groups = client_->ListGroups();
  ASSERT_TRUE(groups.ok());
  ASSERT_EQ(groups->size(), 1u);
  EXPECT_EQ((*groups)[0].name, "model.w");
}

// A delete answered while the manifest was written (its list of groups
// fixed) was answered before the checkpoint, which still held the group. It
// waits for the checkpoint's commit now, and comes after it.
TEST_F(DuringCheckpointTest, ADeleteDuringTheCommitWaitsAndComesAfterTheCheckpoint) {
  StartPausingAt("manifest_written");
  std::thread whole([&] {
    absl::StatusOr<Client::CheckpointResult> r = client_->Checkpoint({});
    EXPECT_TRUE(r.ok()) << r.status();
  });
  ASSERT_TRUE(WaitForFile(paused_, absl::Seconds(20)));
  std::atomic<bool> deleted{false};
  std::thread remove([&] {
    EXPECT_TRUE(client_->DeleteGroup("model.b").ok());
    deleted = true;
  });
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_FALSE(deleted.load()) << "the delete was answered while the checkpoint committed";
  std::filesystem::remove(paused_);
  whole.join();
  remove.join();
  ASSERT_NO_FATAL_FAILURE(KillAndRestoreTheSecondCheckpoint());
  absl::StatusOr<std::vector<GroupInfo>> groups = client_->ListGroups();
  ASSERT_TRUE(groups.ok());
  EXPECT_EQ(groups->size(), 2u) << "the checkpoint, which came first, holds model.b";
}

TEST_F(DuringCheckpointTest, ANamedGroupDeletedAfterItsPagesWereWrittenFailsTheCheckpoint) {
  StartPausingAt("data_synced:0");
  std::thread named([&] {
    Client::CheckpointRequestOptions options;
    options.groups = {"model.b"};
    absl::StatusOr<Client::CheckpointResult> r = client_->Checkpoint(options);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("'model.b' was deleted while it was checkpointed"));
  });
  ASSERT_TRUE(WaitForFile(paused_, absl::Seconds(20)));
  ASSERT_TRUE(client_->DeleteGroup("model.b").ok());
  std::filesystem::remove(paused_);
  named.join();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/" + kSecond)) << "nothing is written";
}

// ---- A signal while the daemon starts ----

// SIGTERM while the restore runs (a large state takes minutes) waited for
// the restore, then served, then wrote a final checkpoint. It now ends the
// start at once, exit 0, and the checkpoints are as they were.
TEST(StartUpSignalTest, SigtermDuringTheRestoreExitsAtOnceAndWritesNothing) {
  const std::string dir = FreshDirectory("start_signal");
  {
    auto daemon = DaemonProcess::Start(CkptFlags(dir));
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    auto client = ConnectTo(**daemon);
    const CkptWorkload work(kSeed);
    work.Register(*client);
    work.Steps(*client, 1, 3);
    absl::StatusOr<int> exit = (*daemon)->Stop();  // Its final checkpoint: ckpt 1.
    ASSERT_TRUE(exit.ok() && *exit == 0);
  }
  const std::vector<std::string> before = CheckpointNamesIn(dir);
  ASSERT_EQ(before, std::vector<std::string>{kFirst});
  const std::string paused = dir + ".restoring";
  const std::string log = dir + ".log";
  std::filesystem::remove(paused);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("OPTSTATE_TEST_RESTORE_PAUSE_FILE", paused.c_str(), 1);
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(out, 2);
    std::vector<std::string> args = {OPTSTATED_PATH, "--listen=127.0.0.1:0", "--log_level=info"};
    for (const std::string& flag : CkptFlags(dir)) args.push_back(flag);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(OPTSTATED_PATH, argv.data());
    _exit(127);
  }
  const bool restoring = WaitForFile(paused, absl::Seconds(20));
  kill(pid, SIGTERM);
  int status = 0;
  bool exited = false;
  for (int i = 0; i < 500 && !exited; ++i) {  // 5 s: the restore itself never ends.
    exited = waitpid(pid, &status, WNOHANG) == pid;
    if (!exited) absl::SleepFor(absl::Milliseconds(10));
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  ASSERT_TRUE(restoring) << "the restore never started";
  EXPECT_TRUE(exited) << "SIGTERM did not end the start";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("signal 15 during start-up: exiting; nothing was served or written"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("listening on")));
  EXPECT_EQ(CheckpointNamesIn(dir), before);
  std::filesystem::remove(paused);
  std::filesystem::remove(log);
}

// ---- Damaged checkpoints ----

class DamagedCheckpointTest : public ::testing::Test {
 protected:
  // ckpt 1 holds step 3, ckpt 2 step 5; the daemon is then killed (no final
  // checkpoint).
  void SetUp() override {
    dir_ = FreshDirectory("damaged");
    auto daemon = DaemonProcess::Start(CkptFlags(dir_));
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    auto client = ConnectTo(**daemon);
    work_.Register(*client);
    work_.Steps(*client, 1, 3);
    ASSERT_TRUE(client->Checkpoint({}).ok());
    work_.Steps(*client, 4, 5);
    ASSERT_TRUE(client->Checkpoint({}).ok());
  }

  std::string File(const std::string& name) const { return dir_ + "/" + kSecond + "/" + name; }
  bool Exists(const std::string& name) const { return std::filesystem::exists(dir_ + "/" + name); }

  // Rewrites ckpt 2's MANIFEST with its first `from` replaced by `to`.
  void ReplaceInManifest(const std::string& from, const std::string& to) {
    std::string text;
    {
      std::ifstream in(File("MANIFEST"));
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    std::ofstream(File("MANIFEST")) << text;
  }

  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  // CRC32C (Castagnoli, reflected), bit by bit: the manifest's checksums.
  static std::string Crc32cHex(const std::string& bytes) {
    uint32_t crc = ~0u;
    for (unsigned char c : bytes) {
      crc ^= c;
      for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
    char hex[9];
    std::snprintf(hex, sizeof(hex), "%08x", ~crc);
    return hex;
  }

  // After `data_file` of ckpt 2 was edited: its CRC put into its manifest
  // line, and the manifest's own recomputed, so every checksum matches.
  void Reseal(const std::string& data_file) {
    const std::string manifest = Read(File("MANIFEST"));
    const size_t end_at = manifest.rfind("\nend ");
    ASSERT_NE(end_at, std::string::npos);
    std::string body = manifest.substr(0, end_at + 1);
    ASSERT_EQ(manifest.substr(end_at + 5, 8), Crc32cHex(body));  // This CRC is the writer's.
    const size_t at = body.find(" " + data_file + " ");
    ASSERT_NE(at, std::string::npos);
    const size_t crc_at = body.find(' ', at + data_file.size() + 2) + 1;  // After its bytes.
    body.replace(crc_at, 8, Crc32cHex(Read(File(data_file))));
    std::ofstream(File("MANIFEST"), std::ios::binary) << body << "end " << Crc32cHex(body) << "\n";
  }

  // Overwrites `bytes` at `offset` of ckpt 2's `data_file`.
  void Overwrite(const std::string& data_file, std::streamoff offset, const void* bytes, size_t n) {
    std::fstream f(File(data_file), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(offset);
    f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
  }

  // Restarts on the damaged directory: ckpt 2 must be refused with
  // `message` (naming `file`), ckpt 1 restored, and the steps continue.
  void ExpectFallback(const std::string& file, const std::string& message,
                      std::vector<std::string> extra = {}) {
    auto daemon = DaemonProcess::Start(CkptFlags(dir_, extra));
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    auto client = ConnectTo(**daemon);
    absl::StatusOr<Stats> stats = client->GetStats();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->restored_checkpoint_id, kFirst);
    ASSERT_EQ(stats->restore_refusals.size(), 1);
    EXPECT_THAT(stats->restore_refusals[0], HasSubstr(file));
    EXPECT_THAT(stats->restore_refusals[0], HasSubstr(message));
    EXPECT_TRUE(SameState(ExportAll(*client), References().at(3)));
    work_.Steps(*client, 4, 7);
    EXPECT_TRUE(SameState(ExportAll(*client), References().at(7)));
  }

  std::string dir_;
  const CkptWorkload work_{kSeed};
};

TEST_F(DamagedCheckpointTest, AFlippedByteInADataFileFailsItsChecksum) {
  {
    std::fstream f(File("group-1.data"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(123457);
    char c;
    f.seekg(123457);
    f.get(c);
    f.seekp(123457);
    f.put(static_cast<char>(c ^ 0x10));
  }
  ExpectFallback("group-1.data", "fails its checksum");
}

// Damage that every checksum agrees with (a file written by hand, or by a
// daemon with a bug) is refused by what it holds.
TEST_F(DamagedCheckpointTest, ASquareBelowZeroIsRefusedThoughEveryChecksumMatches) {
  // Page 0 of group 1: its header, then its params, exp_avg and exp_avg_sq.
  const float negative = -0.5f;
  Overwrite("group-1.data", 16 + (2 * kCkptPage + 3) * sizeof(float), &negative, sizeof(negative));
  Reseal("group-1.data");
  ExpectFallback("group-1.data",
                 "holds -0.5 at element 3 of exp_avg_sq, which no step leaves (a square is "
                 "never below 0)");
}

TEST_F(DamagedCheckpointTest, ASteppedPageWithoutValuesIsRefusedThoughEveryChecksumMatches) {
  const uint64_t no_flags = 0;
  Overwrite("group-0.data", 8, &no_flags, sizeof(no_flags));  // Page 0's header: step, flags.
  Reseal("group-0.data");
  ExpectFallback("group-0.data", "page 0 is at step 5 with flags 0, which no checkpoint writes");
}

TEST_F(DamagedCheckpointTest, AFileUnderACheckpointsNameIsRefusedAsDamage) {
  std::filesystem::remove_all(dir_ + "/" + kSecond);
  std::ofstream(dir_ + "/" + kSecond) << "not a checkpoint\n";
  // Damage, not a cause to fix: checkpoints are written past it.
  ExpectFallback(kSecond, "is not a directory");
  auto daemon = DaemonProcess::Start(CkptFlags(dir_));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto written = ConnectTo(**daemon)->Checkpoint({});
  EXPECT_TRUE(written.ok()) << written.status();
}

TEST_F(DamagedCheckpointTest, ATruncatedDataFileIsRefused) {
  std::filesystem::resize_file(File("group-0.data"), 1000);
  ExpectFallback("group-0.data", "is 1000 bytes, the manifest says 50156 (truncated)");
}

TEST_F(DamagedCheckpointTest, AMissingManifestIsRefused) {
  std::filesystem::remove(File("MANIFEST"));
  ExpectFallback("MANIFEST", "is missing");
}

TEST_F(DamagedCheckpointTest, AMissingDataFileIsRefused) {
  std::filesystem::remove(File("group-1.data"));
  ExpectFallback("group-1.data", "is missing (the manifest names it)");
}

// A FIFO where the manifest was blocked the daemon's start in open()
// until something wrote to it.
TEST_F(DamagedCheckpointTest, AManifestThatIsAFifoIsRefusedWithoutBlockingTheStart) {
  std::filesystem::remove(File("MANIFEST"));
  ASSERT_EQ(mkfifo(File("MANIFEST").c_str(), 0600), 0);
  ExpectFallback("MANIFEST", "is not a regular file");
}

// A data file that is a FIFO or a directory was refused as "0 bytes" or
// "4096 bytes, the manifest says ..." (damage); it is what the manifest's
// is: not a regular file (never opened in a way that blocks).
TEST_F(DamagedCheckpointTest, ADataFileThatIsAFifoIsRefusedAsNoRegularFile) {
  std::filesystem::remove(File("group-1.data"));
  ASSERT_EQ(mkfifo(File("group-1.data").c_str(), 0600), 0);
  ExpectFallback("group-1.data", "is not a regular file");
}

// A MANIFEST grown to a gigabyte (zeros, as a crash can leave a file) was
// read whole into memory before it was refused; one larger than memory
// would have ended every start. Its header's group count bounds it now.
TEST_F(DamagedCheckpointTest, AGrownManifestIsRefusedBeforeItIsRead) {
  std::filesystem::resize_file(File("MANIFEST"), uint64_t{1} << 30);  // Sparse: no disk used.
  ExpectFallback("MANIFEST", "more than a manifest of the groups its header counts takes");
}

// A damaged checkpoint can never be restored: new checkpoints are written
// beside it as if it were not there.
TEST_F(DamagedCheckpointTest, ARefusedCheckpointNeitherCountsAmongTheKeptNorIsRemoved) {
  // ckpt 2 refused, ckpt 1 restored: new checkpoints are kept beside ckpt 1
  // as if ckpt 2 were not there (counting it pushed ckpt 1, the only good
  // older one, out at the first new checkpoint), and ckpt 2 stays for its
  // cause to be found.
  std::filesystem::remove(File("MANIFEST"));
  auto daemon = DaemonProcess::Start(CkptFlags(dir_, {"--checkpoints_to_keep=2"}));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = ConnectTo(**daemon);
  absl::StatusOr<Stats> stats = client->GetStats();
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->restored_checkpoint_id, kFirst);
  ASSERT_EQ(stats->restore_refusals.size(), 1u);
  work_.Steps(*client, 4, 4);
  ASSERT_TRUE(client->Checkpoint({}).ok());  // ckpt 3
  EXPECT_TRUE(Exists(kFirst)) << "the good older checkpoint is kept";
  EXPECT_TRUE(Exists(kSecond)) << "the refused one is left";
  EXPECT_TRUE(Exists("ckpt-0000000000000003"));
  work_.Steps(*client, 5, 5);
  ASSERT_TRUE(client->Checkpoint({}).ok());  // ckpt 4: ckpt 1 is now the third good one
  EXPECT_FALSE(Exists(kFirst));
  EXPECT_TRUE(Exists(kSecond));
  EXPECT_TRUE(Exists("ckpt-0000000000000003"));
  EXPECT_TRUE(Exists("ckpt-0000000000000004"));
}

TEST_F(DamagedCheckpointTest, WhileANewerCheckpointNeedsAnotherDaemonNoneIsWrittenOrRemoved) {
  // ckpt 2 refused for a cause that can be fixed (a format this daemon does
  // not read: a newer optstated wrote it), ckpt 1 restored and served. A
  // checkpoint written now would be the newest: the next start would restore
  // it, not ckpt 2, and prune ckpt 2 once it can be read. So none is written,
  // when asked or at shutdown, and both stay.
  ReplaceInManifest("format_version 3\n", "format_version 4\n");
  {
    auto daemon = DaemonProcess::Start(CkptFlags(dir_, {"--checkpoints_to_keep=1"}));
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    auto client = ConnectTo(**daemon);
    absl::StatusOr<Stats> stats = client->GetStats();
    ASSERT_TRUE(stats.ok());
    ASSERT_EQ(stats->restored_checkpoint_id, kFirst);
    ASSERT_EQ(stats->restore_refusals.size(), 1u);
    work_.Steps(*client, 4, 4);
    absl::StatusOr<Client::CheckpointResult> refused = client->Checkpoint({});
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr("newer than the restored " + std::string(kFirst)));
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("upgrade optstated"));
    // Counted as a failure, which the checkpoint alert watches.
    absl::StatusOr<Stats> after = client->GetStats();
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(after->checkpoint_failures, 1u);
    EXPECT_THAT(after->last_checkpoint_error, HasSubstr("no checkpoint is written"));
  }
  EXPECT_TRUE(Exists(kFirst));
  EXPECT_TRUE(Exists(kSecond));
  EXPECT_FALSE(Exists("ckpt-0000000000000003"));
  // The cause fixed (here: the format read again): ckpt 2, the newest, is
  // restored, and checkpoints are written and pruned again.
  ReplaceInManifest("format_version 4\n", "format_version 3\n");
  auto daemon = DaemonProcess::Start(CkptFlags(dir_, {"--checkpoints_to_keep=1"}));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = ConnectTo(**daemon);
  absl::StatusOr<Stats> stats = client->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->restored_checkpoint_id, kSecond);
  EXPECT_TRUE(SameState(ExportAll(*client), References().at(5)));
  work_.Steps(*client, 6, 6);
  ASSERT_TRUE(client->Checkpoint({}).ok());
  EXPECT_FALSE(Exists(kFirst));
  EXPECT_FALSE(Exists(kSecond));
  EXPECT_TRUE(Exists("ckpt-0000000000000003"));
}

// A copy of ckpt 1 put back under a newer number (a backup restored by
// hand, a link) was restored in place of ckpt 2, the newest acknowledged,
// which the next checkpoints then pruned: step 5 lost without a word.
TEST_F(DamagedCheckpointTest, ACheckpointUnderAnotherNumberIsRefusedAndTheNewestRestored) {
  const std::string copy = "ckpt-0000000000000009";
  std::filesystem::copy(dir_ + "/" + kFirst, dir_ + "/" + copy,
                        std::filesystem::copy_options::recursive);
  auto daemon = DaemonProcess::Start(CkptFlags(dir_, {"--checkpoints_to_keep=1"}));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = ConnectTo(**daemon);
  absl::StatusOr<Stats> stats = client->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->restored_checkpoint_id, kSecond);
  ASSERT_EQ(stats->restore_refusals.size(), 1u);
  EXPECT_THAT(stats->restore_refusals[0],
              HasSubstr(absl::StrCat("holds checkpoint ", kFirst, ", not ", copy)));
  EXPECT_TRUE(SameState(ExportAll(*client), References().at(5)));
  // Which of the two is wrong is the operator's to say: nothing is written
  // (a new checkpoint would prune ckpt 2) until the copy is put right.
  work_.Steps(*client, 6, 6);
  absl::StatusOr<Client::CheckpointResult> refused = client->Checkpoint({});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(Exists(kFirst));
  EXPECT_TRUE(Exists(kSecond));
  EXPECT_TRUE(Exists(copy));
}

TEST_F(DamagedCheckpointTest, AManifestThatDoesNotParseIsRefused) {
  { std::ofstream(File("MANIFEST")) << "{\"this\": \"is not a manifest\"}\n"; }
  ExpectFallback("MANIFEST", "not a checkpoint manifest");
}

TEST_F(DamagedCheckpointTest, AFlippedByteInTheManifestFailsItsChecksum) {
  std::string text;
  {
    std::ifstream in(File("MANIFEST"));
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = text.find("step 5");
  ASSERT_NE(at, std::string::npos);
  text[at + 5] = '9';
  { std::ofstream(File("MANIFEST")) << text; }
  ExpectFallback("MANIFEST", "manifest checksum mismatch");
}

TEST_F(DamagedCheckpointTest, AFutureFormatVersionIsRefused) {
  ReplaceInManifest("format_version 3\n", "format_version 4\n");
  ExpectFallback("MANIFEST", "format version 4 is newer than this daemon reads (3)");
}

TEST_F(DamagedCheckpointTest, AnotherPageSizeIsRefusedAndNothingIsWrittenOverTheCheckpoints) {
  // A daemon on the same directory with pages of 2048 elements refuses both
  // (written with 1024) and, since nothing could be restored, writes no
  // checkpoint that would become the newest and prune them: neither when
  // asked nor at shutdown.
  const CkptWorkload other(99);
  {
    auto daemon = DaemonProcess::Start(CkptFlags(dir_, {"--page_elements=2048"}));
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    auto client = ConnectTo(**daemon);
    absl::StatusOr<Stats> stats = client->GetStats();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->restored_checkpoint_id, "");
    ASSERT_EQ(stats->restore_refusals.size(), 2u);
    EXPECT_THAT(stats->restore_refusals[0],
                HasSubstr("written with pages of 1024 elements, but this daemon runs with "
                          "--page_elements=2048"));
    absl::StatusOr<GroupInfo> none = client->DescribeGroup("model.w");
    EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
    other.Register(*client);
    absl::StatusOr<Client::CheckpointResult> refused = client->Checkpoint({});
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr("restart with --page_elements=1024"));
  }
  // Back to 1024: the newest checkpoint, ckpt 2, is restored whole.
  auto daemon = DaemonProcess::Start(CkptFlags(dir_, {"--checkpoints_to_keep=5"}));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = ConnectTo(**daemon);
  absl::StatusOr<Stats> stats = client->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->restored_checkpoint_id, kSecond);
  EXPECT_TRUE(stats->restore_refusals.empty());
  EXPECT_TRUE(SameState(ExportAll(*client), References().at(5)));
}

// Runs optstated to its exit; returns the exit code.
int RunToExit(std::vector<std::string> args) {
  args.insert(args.begin(), OPTSTATED_PATH);
  args.push_back("--listen=127.0.0.1:0");
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST_F(DamagedCheckpointTest, RequireStateExitsNonZeroWhenNoCheckpointIsUsable) {
  std::filesystem::remove(dir_ + "/" + kFirst + "/MANIFEST");
  std::filesystem::resize_file(File("group-1.data"), 10);
  EXPECT_NE(RunToExit({"--state_dir=" + dir_, "--page_elements=1024", "--require_state"}), 0);
  // An empty directory is no usable state either.
  const std::string empty = FreshDirectory("empty");
  EXPECT_NE(RunToExit({"--state_dir=" + empty, "--require_state"}), 0);
  // Without --require_state the daemon starts empty.
  auto daemon = DaemonProcess::Start(CkptFlags(dir_));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = ConnectTo(**daemon);
  absl::StatusOr<Stats> stats = client->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->num_groups, 0u);
  EXPECT_EQ(stats->restore_refusals.size(), 2u);
  // Nothing is written over the refused checkpoints: a new, empty one would
  // become the newest and prune them, losing what they hold.
  absl::StatusOr<Client::CheckpointResult> written = client->Checkpoint();
  EXPECT_EQ(written.status().code(), absl::StatusCode::kFailedPrecondition) << written.status();
  EXPECT_THAT(std::string(written.status().message()), HasSubstr("was refused at start"));
  client.reset();
  // No final checkpoint either, and the exit code says so (3): the state
  // since the start is not saved.
  absl::StatusOr<int> exit_code = (*daemon)->Stop();
  ASSERT_TRUE(exit_code.ok());
  EXPECT_EQ(*exit_code, 3);
  int checkpoints = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    checkpoints += entry.path().filename().string().rfind("ckpt-", 0) == 0;
  }
  EXPECT_EQ(checkpoints, 2);
}

}  // namespace
}  // namespace optstate::testing
