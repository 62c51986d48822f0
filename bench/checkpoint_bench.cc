// checkpoint-bench: what a checkpoint costs, against baselines measured in
// the same run in the same directory (docs/durability.md):
//   write: a checkpoint's bytes / its time, against a plain sequential write
//          (8 MiB writes, then fsync) of as many bytes;
//   restore: the checkpoint's bytes / the restart's time to serving, against
//          a plain sequential read of the same file size;
//   steps: elements stepped per second while a second checkpoint is
//          written, against without (the write figure is taken from a
//          checkpoint with no steps competing);
//   memory: the daemon's peak RSS (sampled every millisecond) while it
//          writes the first, against its RSS before.
// Prints one line per figure with its baseline and ratio. The default state
// is 2 GB (params, m and v of 178,956,970 elements).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/child_process.h"
#include "optstate/client.h"

ABSL_FLAG(uint64_t, elements, 178956970, "Elements of the one group (12 bytes of state each).");
ABSL_FLAG(std::string, dir, "/tmp/optstate-checkpoint-bench",
          "Directory for the state_dir and the baseline file (removed first).");
ABSL_FLAG(std::string, optstated, "", "Path of optstated; default: ../server/optstated.");
ABSL_FLAG(int, threads, 2, "The daemon's --threads.");
ABSL_FLAG(bool, keep, false, "Keep --dir afterwards (to look at the checkpoint).");

namespace optstate::bench {
namespace {

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "checkpoint-bench: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

// Plain sequential write of `bytes` (8 MiB at a time) and fsync; seconds.
double PlainWrite(const std::string& path, uint64_t bytes) {
  std::vector<char> buffer(8 << 20, 1);
  const absl::Time start = absl::Now();
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (uint64_t done = 0; done < bytes;) {
    const size_t n = std::min<uint64_t>(buffer.size(), bytes - done);
    if (write(fd, buffer.data(), n) != static_cast<ssize_t>(n)) std::exit(2);
    done += n;
  }
  fsync(fd);
  close(fd);
  return Seconds(start);
}

double PlainRead(const std::string& path) {
  std::vector<char> buffer(8 << 20);
  const absl::Time start = absl::Now();
  const int fd = open(path.c_str(), O_RDONLY);
  while (read(fd, buffer.data(), buffer.size()) > 0) {
  }
  close(fd);
  return Seconds(start);
}

struct RssSampler {
  explicit RssSampler(pid_t pid) : pid(pid) {
    thread = std::thread([this] {
      while (!stop) {
        peak = std::max<uint64_t>(peak, ProcessResidentBytes(this->pid));
        absl::SleepFor(absl::Milliseconds(1));
      }
    });
  }
  uint64_t Finish() {
    stop = true;
    thread.join();
    return peak;
  }
  pid_t pid;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> peak{0};
  std::thread thread;
};

void Report(const char* figure, double value, double baseline, const char* unit) {
  std::printf("%-34s %10.3f %-6s baseline %10.3f  ratio %.3f\n", figure, value, unit, baseline,
              value / baseline);
}

int Main() {
  const uint64_t n = absl::GetFlag(FLAGS_elements);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  std::string optstated = absl::GetFlag(FLAGS_optstated);
  if (optstated.empty()) optstated = ExecutableDir() + "/../server/optstated";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string state_dir = dir + "/state";
  const std::vector<std::string> argv = {optstated,
                                         "--listen=127.0.0.1:0",
                                         "--log_level=warning",
                                         absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads)),
                                         "--state_dir=" + state_dir,
                                         "--checkpoints_to_keep=1"};
  absl::StatusOr<std::unique_ptr<ChildProcess>> daemon = ChildProcess::Start(argv);
  Check(daemon.status(), "start optstated");
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(absl::StrCat("127.0.0.1:", (*daemon)->port()));
  Check(client.status(), "connect");
  Check((*client)->RegisterGroup("bench", n).status(), "register");
  std::vector<float> grad(n, 1e-3f), params(n);
  // Step 1 touches every page of params, m and v.
  Check((*client)->Step("bench", 1, grad, absl::MakeSpan(params)), "step 1");
  std::printf("state: %.3f GB in one group of %lu elements\n", n * 12 / 1e9,
              static_cast<unsigned long>(n));

  // Steps without a checkpoint.
  uint64_t step = 1;
  absl::Time start = absl::Now();
  for (int i = 0; i < 3; ++i)
    Check((*client)->Step("bench", ++step, grad, absl::MakeSpan(params)), "step");
  const double steps_alone = 3 * n / Seconds(start);

  // A checkpoint alone (the write figure), with the daemon's RSS sampled.
  const uint64_t rss_before = ProcessResidentBytes((*daemon)->pid());
  RssSampler sampler((*daemon)->pid());
  start = absl::Now();
  absl::StatusOr<Client::CheckpointResult> ckpt = (*client)->Checkpoint({});
  const double write_seconds = Seconds(start);
  const uint64_t rss_peak = sampler.Finish();
  Check(ckpt.status(), "checkpoint");

  // Another checkpoint with steps going on (the steps figure).
  std::atomic<bool> writing{true};
  uint64_t stepped_during = 0;
  absl::Duration step_time_during;
  std::thread stepper([&] {
    while (writing) {
      const absl::Time t = absl::Now();
      Check((*client)->Step("bench", ++step, grad, absl::MakeSpan(params)), "step during");
      if (writing) {
        stepped_during += n;
        step_time_during += absl::Now() - t;
      }
    }
  });
  absl::StatusOr<Client::CheckpointResult> during = (*client)->Checkpoint({});
  writing = false;
  stepper.join();
  Check(during.status(), "checkpoint during steps");

  // Restore: kill -9 (no final checkpoint), restart, time to serving.
  kill((*daemon)->pid(), SIGKILL);
  daemon->reset();
  start = absl::Now();
  absl::StatusOr<std::unique_ptr<ChildProcess>> restarted = ChildProcess::Start(argv);
  const double restore_seconds = Seconds(start);
  Check(restarted.status(), "restart");
  restarted->reset();

  // Baselines: the same number of bytes, the same directory, this run.
  const std::string plain = dir + "/plain";
  const double plain_write = PlainWrite(plain, ckpt->bytes);
  const double plain_read = PlainRead(plain);
  if (!absl::GetFlag(FLAGS_keep)) std::filesystem::remove_all(dir);

  const double gb = ckpt->bytes / 1e9;
  std::printf("checkpoint %s: %lu bytes\n", ckpt->id.c_str(),
              static_cast<unsigned long>(ckpt->bytes));
  Report("checkpoint write GB/s", gb / write_seconds, gb / plain_write, "GB/s");
  Report("restore (start to serving) GB/s", gb / restore_seconds, gb / plain_read, "GB/s");
  if (stepped_during > 0) {
    Report("step Melem/s during a checkpoint",
           stepped_during / absl::ToDoubleSeconds(step_time_during) / 1e6, steps_alone / 1e6,
           "M/s");
  } else {
    std::printf("step Melem/s during a checkpoint: no step finished while it was written\n");
  }
  std::printf("%-34s %10.1f MiB (before %.1f MiB, peak %.1f MiB; target +64)\n",
              "daemon RSS growth while writing",
              (static_cast<double>(rss_peak) - rss_before) / 1048576.0, rss_before / 1048576.0,
              rss_peak / 1048576.0);
  return 0;
}

}  // namespace
}  // namespace optstate::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return optstate::bench::Main();
}
