// rss-soak: does the daemon's memory stay flat under steady load? Starts
// optstated, registers groups, and has N clients step them without pause
// for --seconds, sampling the daemon's VmRSS every second. After the first
// --warmup seconds RSS must stay within --tolerance of its value then (the
// issue 14 criterion: a 10-minute run stays within 10% after the first
// minute). Then deletes every group and reports RSS once the heap is trimmed.
//   rss-soak                                  # the 10-minute measurement
//   rss-soak --seconds=30 --warmup=6          # a short check
//   rss-soak --data_plane=auto                # the same through shared memory
// Each client steps its own groups of varied sizes (so messages and their
// receive buffers vary in size, as a mixed model's do), fp32 and bf16 wire.
#include <cstdio>
#include <fstream>
#include <random>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/child_process.h"
#include "optstate/client.h"

ABSL_FLAG(std::string, optstated, "", "Path of optstated (default: next to this binary).");
ABSL_FLAG(int, clients, 16, "Clients stepping at once, each on its own connection.");
ABSL_FLAG(int, groups_per_client, 8, "Groups each client steps in one Step call.");
ABSL_FLAG(uint64_t, max_group_elements, 200000, "Largest group (sizes vary from 1/64 of it).");
ABSL_FLAG(int, seconds, 600, "Length of the run.");
ABSL_FLAG(int, warmup, 60, "RSS after this many seconds is the reference.");
ABSL_FLAG(double, tolerance, 0.10, "Allowed drift of RSS from the reference after warmup.");
ABSL_FLAG(std::string, data_plane, "wire",
          "The clients' ClientOptions::data_plane: wire, auto or shared_memory.");
ABSL_FLAG(std::string, daemon_flags, "--threads=2",
          "Extra optstated flags, comma-separated (e.g. --heap_trim_interval=0 to compare).");

namespace optstate::bench {
namespace {

constexpr double kMiB = 1 << 20;

// The daemon's RssShmem (its resident pages of shared memory: the regions'),
// from /proc/PID/status; 0 when not there.
uint64_t ShmemResidentBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssShmem:", 0) == 0) return std::stoull(line.substr(9)) * 1024;
  }
  return 0;
}

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "rss-soak: %s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

int Run() {
  std::string path = absl::GetFlag(FLAGS_optstated);
  if (path.empty()) path = ExecutableDir() + "/../server/optstated";
  std::vector<std::string> argv = {path, "--listen=127.0.0.1:0", "--log_level=warning"};
  for (absl::string_view flag : absl::StrSplit(absl::GetFlag(FLAGS_daemon_flags), ',')) {
    if (!flag.empty()) argv.emplace_back(flag);
  }
  absl::StatusOr<std::unique_ptr<ChildProcess>> daemon = ChildProcess::Start(argv);
  Check(daemon.status(), "start optstated");
  const pid_t pid = (*daemon)->pid();
  const std::string target = absl::StrCat("127.0.0.1:", (*daemon)->port());
  const int clients = absl::GetFlag(FLAGS_clients);
  const int per_client = absl::GetFlag(FLAGS_groups_per_client);
  const uint64_t max_elements = absl::GetFlag(FLAGS_max_group_elements);
  const uint64_t idle_rss = ProcessResidentBytes(pid);
  ClientOptions client_options;
  const std::string plane = absl::GetFlag(FLAGS_data_plane);
  if (plane == "wire") {
    client_options.data_plane = DataPlane::kWire;
  } else if (plane == "auto") {
    client_options.data_plane = DataPlane::kAuto;
  } else if (plane == "shared_memory") {
    client_options.data_plane = DataPlane::kSharedMemory;
  } else {
    std::fprintf(stderr, "rss-soak: --data_plane must be wire, auto or shared_memory\n");
    return 2;
  }

  // Groups: sizes spread over [max/64, max], fixed by a seed.
  std::mt19937_64 rng(14);
  std::vector<std::vector<uint64_t>> sizes(clients);
  uint64_t total_elements = 0;
  for (auto& s : sizes) {
    for (int g = 0; g < per_client; ++g) {
      s.push_back(max_elements / 64 + rng() % (max_elements - max_elements / 64 + 1));
      total_elements += s.back();
    }
  }
  absl::Mutex mu;
  bool stop = false;
  uint64_t steps = 0;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target, client_options);
      Check(client.status(), "connect");
      std::vector<std::vector<float>> grads, params;
      std::vector<std::string> names;
      for (int g = 0; g < per_client; ++g) {
        names.push_back(absl::StrCat("c", c, ".g", g));
        grads.emplace_back(sizes[c][g], 1e-3f);
        params.emplace_back(sizes[c][g]);
        Check((*client)->RegisterGroup(names.back(), params.back()).status(), "register");
      }
      StepOptions options;
      for (uint64_t t = 1;; ++t) {
        {
          absl::MutexLock lock(&mu);
          if (stop) break;
        }
        std::vector<GroupStep> step;
        for (int g = 0; g < per_client; ++g) {
          step.push_back({names[g], grads[g], absl::MakeSpan(params[g])});
        }
        options.gradient_dtype = t % 2 == 0 ? WireType::kBFloat16 : WireType::kFloat32;
        Check((*client)->Step(step, t, options), "step");
        absl::MutexLock lock(&mu);
        ++steps;
      }
      for (const std::string& name : names) Check((*client)->DeleteGroup(name), "delete");
    });
  }

  const int seconds = absl::GetFlag(FLAGS_seconds);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const double tolerance = absl::GetFlag(FLAGS_tolerance);
  std::printf("clients %d, groups %d, state %.1f MiB (%llu elements), idle RSS %.1f MiB\n", clients,
              clients * per_client, total_elements * 12 / kMiB,
              static_cast<unsigned long long>(total_elements), idle_rss / kMiB);
  // Reads the daemon's region figures (GetStats, over the wire).
  absl::StatusOr<std::unique_ptr<Client>> monitor = Client::Connect(target);
  Check(monitor.status(), "connect the monitor");
  std::printf("  second  RSS MiB  shmem MiB  regions  mapped MiB  registrations  steps\n");
  uint64_t reference = 0, low = UINT64_MAX, high = 0;
  const absl::Time start = absl::Now();
  for (int s = 1; s <= seconds; ++s) {
    absl::SleepFor(start + absl::Seconds(s) - absl::Now());
    const uint64_t rss = ProcessResidentBytes(pid);
    uint64_t done;
    {
      absl::MutexLock lock(&mu);
      done = steps;
    }
    if (s % 10 == 0 || s == warmup || s == seconds) {
      absl::StatusOr<Stats> stats = (*monitor)->GetStats();
      Check(stats.status(), "GetStats");
      std::printf("  %6d  %7.1f  %9.1f  %7llu  %10.1f  %13llu  %llu\n", s, rss / kMiB,
                  ShmemResidentBytes(pid) / kMiB,
                  static_cast<unsigned long long>(stats->regions.regions),
                  stats->regions.mapped_bytes / kMiB,
                  static_cast<unsigned long long>(stats->regions.registrations),
                  static_cast<unsigned long long>(done));
      std::fflush(stdout);
    }
    if (s == warmup) reference = rss;
    if (s > warmup) {
      low = std::min(low, rss);
      high = std::max(high, rss);
    }
  }
  {
    absl::MutexLock lock(&mu);
    stop = true;
  }
  for (auto& t : threads) t.join();
  absl::SleepFor(absl::Seconds(1));  // Deletes ask for a trim; it follows within 100 ms.
  const uint64_t after = ProcessResidentBytes(pid);
  const double up = reference == 0 ? 0 : static_cast<double>(high) / reference - 1;
  const double down = reference == 0 ? 0 : static_cast<double>(low) / reference - 1;
  const bool ok = reference > 0 && up <= tolerance && down >= -tolerance;
  std::printf(
      "after %d s: RSS %.1f MiB (%.2fx the state); after that %.1f to %.1f MiB (%+.1f%% to "
      "%+.1f%%); within %.0f%%: %s\n",
      warmup, reference / kMiB, reference / (total_elements * 12.0), low / kMiB, high / kMiB,
      down * 100, up * 100, tolerance * 100, ok ? "yes" : "NO");
  std::printf("all groups deleted: RSS %.1f MiB (idle was %.1f)\n", after / kMiB, idle_rss / kMiB);
  return ok ? 0 : 3;
}

}  // namespace
}  // namespace optstate::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "rss-soak: the daemon's RSS under steady load. Usage: rss-soak [--seconds=600] "
      "[--warmup=60] [--clients=16] ...");
  absl::ParseCommandLine(argc, argv);
  return optstate::bench::Run();
}
