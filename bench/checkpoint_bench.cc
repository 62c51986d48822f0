// checkpoint-bench: what a checkpoint costs, against baselines measured in
// the same run in the same directory (docs/durability.md, BENCHMARKS.md):
//   write: a checkpoint's bytes / its time (both fsync), against a plain
//          sequential write (8 MiB writes, then fsync) of as many bytes,
//          taken just before and just after it (the mean is the baseline);
//   restore: the checkpoint's bytes / the restart's time to serving (kill -9,
//          so no final checkpoint; the files are in the page cache, the
//          fraction is printed), against a plain sequential read of a file of
//          the same size, equally cached, into a reused 8 MiB buffer and into
//          freshly mapped memory (which pays page faults, as a restore does);
//          the start-to-serving time with nothing to restore is printed too;
//   steps: elements stepped per second while a second checkpoint is
//          written, against without (the write figure is taken from a
//          checkpoint with no steps competing);
//   memory: the daemon's peak RSS (sampled every millisecond) while it
//          writes the first, against its RSS before.
// Prints one line per figure with its baseline and ratio. The default state
// is 2 GB (params, m and v of 178,956,970 elements).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
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
ABSL_FLAG(std::string, daemon_log_level, "warning",
          "The daemon's --log_level (info shows where a checkpoint's and a restore's time went).");
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

// Plain sequential read of the file (8 MiB at a time) into one reused
// buffer, which stays in the CPU's cache; seconds.
double PlainRead(const std::string& path) {
  std::vector<char> buffer(8 << 20);
  const absl::Time start = absl::Now();
  const int fd = open(path.c_str(), O_RDONLY);
  while (read(fd, buffer.data(), buffer.size()) > 0) {
  }
  close(fd);
  return Seconds(start);
}

// Plain sequential read of the whole file (8 MiB at a time) into memory
// mapped for it just before, as the daemon's state arrays are (anonymous,
// MADV_HUGEPAGE): what a restore must at least do, paying its page faults;
// seconds, the mapping included.
double PlainReadIntoFreshMemory(const std::string& path, uint64_t bytes) {
  const absl::Time start = absl::Now();
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) std::exit(2);
  madvise(memory, bytes, MADV_HUGEPAGE);
  const int fd = open(path.c_str(), O_RDONLY);
  auto* at = static_cast<char*>(memory);
  for (uint64_t done = 0; done < bytes;) {
    const ssize_t n = read(fd, at + done, std::min<uint64_t>(8 << 20, bytes - done));
    if (n <= 0) break;
    done += static_cast<uint64_t>(n);
  }
  close(fd);
  const double seconds = Seconds(start);
  munmap(memory, bytes);
  return seconds;
}

// The fraction of a file's pages in the page cache (mincore).
double CachedFraction(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return 0;
  const off_t size = lseek(fd, 0, SEEK_END);
  if (size <= 0) {
    close(fd);
    return 0;
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return 0;
  const long page = sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> resident((size + page - 1) / page);
  double fraction = 0;
  if (mincore(map, size, resident.data()) == 0) {
    uint64_t in = 0;
    for (unsigned char r : resident) in += r & 1;
    fraction = static_cast<double>(in) / resident.size();
  }
  munmap(map, size);
  return fraction;
}

// The checkpoint's data files in state_dir's newest checkpoint directory.
std::vector<std::string> CheckpointDataFiles(const std::string& state_dir) {
  std::vector<std::string> files;
  std::string newest;
  for (const auto& entry : std::filesystem::directory_iterator(state_dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && name.find('.') == std::string::npos && name > newest) {
      newest = name;
    }
  }
  if (newest.empty()) return files;
  for (const auto& entry : std::filesystem::directory_iterator(state_dir + "/" + newest)) {
    if (entry.path().extension() == ".data") files.push_back(entry.path().string());
  }
  return files;
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
                                         "--log_level=" + absl::GetFlag(FLAGS_daemon_log_level),
                                         absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads)),
                                         "--state_dir=" + state_dir,
                                         "--checkpoints_to_keep=1"};
  absl::StatusOr<std::unique_ptr<ChildProcess>> daemon = ChildProcess::Start(argv);
  Check(daemon.status(), "start optstated");
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(absl::StrCat("127.0.0.1:", (*daemon)->port()));
  Check(client.status(), "connect");
  absl::StatusOr<GroupInfo> info = (*client)->RegisterGroup("bench", n);
  Check(info.status(), "register");
  const uint64_t page_elements = info->page_elements;
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

  // The write baseline just before and just after the checkpoint (the disk
  // may be shared: the two bracket it), as many bytes as the checkpoint.
  const std::string plain = dir + "/plain";
  const uint64_t expected_bytes =
      n * 12 + 16 * ((n + page_elements - 1) / page_elements);  // Without the manifest.
  const double plain_write_before = PlainWrite(plain, expected_bytes);

  // A checkpoint alone (the write figure), with the daemon's RSS sampled.
  const uint64_t rss_before = ProcessResidentBytes((*daemon)->pid());
  RssSampler sampler((*daemon)->pid());
  start = absl::Now();
  absl::StatusOr<Client::CheckpointResult> ckpt = (*client)->Checkpoint({});
  const double write_seconds = Seconds(start);
  const uint64_t rss_peak = sampler.Finish();
  Check(ckpt.status(), "checkpoint");
  const double plain_write_after = PlainWrite(plain, ckpt->bytes);

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

  // Restore: kill -9 (no final checkpoint), restart, time to serving. The
  // checkpoint was just written, so its files are (mostly) in the page
  // cache, as the baselines' file is: both fractions are printed.
  kill((*daemon)->pid(), SIGKILL);
  daemon->reset();
  double checkpoint_cached = 0;
  uint64_t data_bytes = 0;
  for (const std::string& file : CheckpointDataFiles(state_dir)) {
    const uint64_t size = std::filesystem::file_size(file);
    checkpoint_cached += CachedFraction(file) * size;
    data_bytes += size;
  }
  if (data_bytes > 0) checkpoint_cached /= data_bytes;
  start = absl::Now();
  absl::StatusOr<std::unique_ptr<ChildProcess>> restarted = ChildProcess::Start(argv);
  const double restore_seconds = Seconds(start);
  Check(restarted.status(), "restart");
  restarted->reset();

  // What a start costs with nothing to restore (an empty state_dir).
  std::vector<std::string> empty_argv = argv;
  for (std::string& arg : empty_argv) {
    if (arg.rfind("--state_dir=", 0) == 0) arg = "--state_dir=" + dir + "/empty";
  }
  start = absl::Now();
  absl::StatusOr<std::unique_ptr<ChildProcess>> empty = ChildProcess::Start(empty_argv);
  const double empty_start_seconds = Seconds(start);
  Check(empty.status(), "start with an empty state_dir");
  empty->reset();

  // Read baselines: the same file as the write baseline (just written, in
  // the page cache like the checkpoint's), same directory, this run.
  const double plain_cached = CachedFraction(plain);
  const double plain_read = PlainRead(plain);
  const double plain_read_fresh = PlainReadIntoFreshMemory(plain, ckpt->bytes);
  if (!absl::GetFlag(FLAGS_keep)) std::filesystem::remove_all(dir);

  const double gb = ckpt->bytes / 1e9;
  std::printf("checkpoint %s: %lu bytes\n", ckpt->id.c_str(),
              static_cast<unsigned long>(ckpt->bytes));
  const double plain_write = (plain_write_before + plain_write_after) / 2;
  std::printf("plain write + fsync: %.3f GB/s before the checkpoint, %.3f GB/s after\n",
              gb / plain_write_before, gb / plain_write_after);
  Report("checkpoint write GB/s", gb / write_seconds, gb / plain_write, "GB/s");
  std::printf(
      "page cache before the restart: %.0f%% of the checkpoint's data, %.0f%% of the "
      "plain file\n",
      100 * checkpoint_cached, 100 * plain_cached);
  std::printf("start to serving with an empty state_dir: %.3f s (restore: %.3f s)\n",
              empty_start_seconds, restore_seconds);
  Report("restore vs read into a hot buffer", gb / restore_seconds, gb / plain_read, "GB/s");
  Report("restore vs read into fresh memory", gb / restore_seconds, gb / plain_read_fresh, "GB/s");
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
