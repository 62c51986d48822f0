// A small model trained through the remote optimizer: linear regression
// y = X w + b on synthetic data, with w and b held and stepped by optstated.
// Exits non-zero unless the loss falls at least 100-fold.
//
// With --checkpoint_every=N it follows docs/durability.md's contract, so a
// restart of the daemon, even a crash, changes no result:
// 1. after step s (a multiple of N) it saves its own checkpoint of s (w, b)
//    in --checkpoint_dir, keeping the last two, as the daemon keeps two;
// 2. it asks the daemon for Checkpoint{wait_for_step: s} before step s+1;
// 3. when step k or a checkpoint fails, it waits for the daemon to answer
//    again and reads the steps its groups are at:
//    - between k-1 and k (the daemon kept running, or stopped with SIGTERM
//      and restored the final checkpoint it wrote then): it goes back to its
//      state before step k and sends step k again, which the daemon applies
//      exactly once;
//    - all at one earlier step s (the daemon crashed and restored its
//      checkpoint of s): it loads its own checkpoint of s;
//    - none of its groups (the daemon restored a checkpoint older than
//      them): it starts over;
//    and steps on from there.
// The run is deterministic, so the final parameters equal an uninterrupted
// run's: it prints their FNV-1a hash for a test to compare.
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "optstate/client.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "optstated address");
ABSL_FLAG(int, steps, 300, "optimizer steps");
ABSL_FLAG(int, features, 64, "input features");
ABSL_FLAG(std::string, run_name, "",
          "Prefix of the group names; empty: a random one, so a rerun against the same daemon "
          "starts fresh.");
ABSL_FLAG(int, checkpoint_every, 0,
          "Checkpoint (own and the daemon's) every this many steps, and resume from the last "
          "one when the daemon fails; 0: never (a failed step ends the run).");
ABSL_FLAG(std::string, checkpoint_dir, "/tmp",
          "Where the trainer's own checkpoints go (with --checkpoint_every).");
ABSL_FLAG(absl::Duration, step_delay, absl::ZeroDuration(),
          "Sleep this long per step, as a larger model's forward and backward pass would take.");
ABSL_FLAG(absl::Duration, resume_timeout, absl::Minutes(2),
          "How long to wait for a failed daemon to answer again before giving up.");

namespace {

// The trainer's side of the model: the data, and w and b as it holds them.
struct Model {
  int d = 0, n = 512;
  std::vector<float> x, y;  // n rows of d features, and the targets.
  std::vector<float> w, b;
};

Model MakeModel(int d) {
  Model m;
  m.d = d;
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> true_w(d);
  for (float& v : true_w) v = normal(rng);
  m.x.resize(static_cast<size_t>(m.n) * d);
  m.y.resize(m.n);
  for (int i = 0; i < m.n; ++i) {
    float sum = 0.5f;  // True bias.
    for (int j = 0; j < d; ++j) sum += (m.x[i * d + j] = normal(rng)) * true_w[j];
    m.y[i] = sum + 0.01f * normal(rng);
  }
  m.w.assign(d, 0.0f);
  m.b.assign(1, 0.0f);
  return m;
}

// The mean squared error's half and its gradient at the current w, b.
double LossAndGradient(const Model& m, std::vector<float>& grad_w, std::vector<float>& grad_b) {
  std::fill(grad_w.begin(), grad_w.end(), 0.0f);
  grad_b[0] = 0;
  double loss = 0;
  for (int i = 0; i < m.n; ++i) {
    float pred = m.b[0];
    for (int j = 0; j < m.d; ++j) pred += m.x[i * m.d + j] * m.w[j];
    const float err = pred - m.y[i];
    loss += 0.5 * err * err / m.n;
    for (int j = 0; j < m.d; ++j) grad_w[j] += err * m.x[i * m.d + j] / m.n;
    grad_b[0] += err / m.n;
  }
  return loss;
}

uint64_t Fnv1a64(const std::vector<float>& a, const std::vector<float>& b) {
  uint64_t h = 14695981039346656037ull;
  for (const std::vector<float>* v : {&a, &b}) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(v->data());
    for (size_t i = 0; i < v->size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

// The trainer's own checkpoint of step s: w and b, written crash-safely
// (temp file, fsync, rename).
std::string CheckpointPath(const std::string& run, uint64_t step) {
  return absl::StrCat(absl::GetFlag(FLAGS_checkpoint_dir), "/", run, ".step-", step);
}

bool SaveCheckpoint(const std::string& run, uint64_t step, const Model& m) {
  const std::string path = CheckpointPath(run, step), tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return false;
  bool ok = std::fwrite(m.w.data(), sizeof(float), m.w.size(), f) == m.w.size() &&
            std::fwrite(m.b.data(), sizeof(float), 1, f) == 1 && std::fflush(f) == 0 &&
            fsync(fileno(f)) == 0;
  ok = std::fclose(f) == 0 && ok;
  return ok && std::rename(tmp.c_str(), path.c_str()) == 0;
}

bool LoadCheckpoint(const std::string& run, uint64_t step, Model& m) {
  FILE* f = std::fopen(CheckpointPath(run, step).c_str(), "rb");
  if (f == nullptr) return false;
  const bool ok = std::fread(m.w.data(), sizeof(float), m.w.size(), f) == m.w.size() &&
                  std::fread(m.b.data(), sizeof(float), 1, f) == 1;
  std::fclose(f);
  return ok;
}

absl::Status RegisterGroups(optstate::Client& client, const std::vector<std::string>& names,
                            const Model& m) {
  optstate::Hyperparameters h;
  h.lr = 0.05;
  h.weight_decay = 0.0;
  for (size_t i = 0; i < names.size(); ++i) {
    auto info = client.RegisterGroup(names[i], i == 0 ? m.w : m.b, h);
    if (!info.ok()) return info.status();
  }
  return absl::OkStatus();
}

// Step 3 of the contract, after step `failed` did not complete: the step to
// go on after, with `m` set to the trainer's state at that step
// (`before_w`, `before_b`: its w and b before step `failed`).
absl::StatusOr<uint64_t> Resume(optstate::Client& client, const std::vector<std::string>& names,
                                const std::string& run, uint64_t failed,
                                const std::vector<float>& before_w,
                                const std::vector<float>& before_b, Model& m) {
  const absl::Time deadline = absl::Now() + absl::GetFlag(FLAGS_resume_timeout);
  absl::StatusOr<optstate::GroupInfo> info;
  while (true) {
    info = client.DescribeGroup(names[0]);
    if (info.ok() || absl::IsNotFound(info.status()) || absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(500));
  }
  if (absl::IsNotFound(info.status())) {
    std::printf("resume: optstated holds none of this run's groups; starting over at step 0\n");
    m.w.assign(m.w.size(), 0.0f);
    m.b.assign(1, 0.0f);
    for (const std::string& name : names) client.DeleteGroup(name).IgnoreError();
    if (absl::Status s = RegisterGroups(client, names, m); !s.ok()) return s;
    return 0;
  }
  if (!info.ok()) return info.status();
  uint64_t lo = info->min_step, hi = info->max_step;
  for (size_t i = 1; i < names.size(); ++i) {
    auto group = client.DescribeGroup(names[i]);
    if (!group.ok()) return group.status();
    lo = std::min(lo, group->min_step);
    hi = std::max(hi, group->max_step);
  }
  if (lo + 1 >= failed && hi <= failed) {
    std::printf("resume: optstated holds steps %" PRIu64 "..%" PRIu64 "; sending step %" PRIu64
                " again\n", lo, hi, failed);
    m.w = before_w;
    m.b = before_b;
    return failed - 1;
  }
  if (lo != hi || !LoadCheckpoint(run, lo, m)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "optstated holds steps ", lo, "..", hi, " after step ", failed,
        " failed, and the trainer has no checkpoint of that step (", CheckpointPath(run, lo),
        "): resume by hand (docs/durability.md)"));
  }
  std::printf("resume: optstated restored step %" PRIu64 "; loaded %s\n", lo,
              CheckpointPath(run, lo).c_str());
  return lo;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  Model m = MakeModel(absl::GetFlag(FLAGS_features));
  const int steps = absl::GetFlag(FLAGS_steps), every = absl::GetFlag(FLAGS_checkpoint_every);
  std::string run = absl::GetFlag(FLAGS_run_name);
  if (run.empty()) run = "linreg." + std::to_string(std::random_device()());
  const std::vector<std::string> names = {run + ".weight", run + ".bias"};

  auto client = optstate::Client::Connect(absl::GetFlag(FLAGS_target));
  if (!client.ok()) return std::fprintf(stderr, "%s\n", client.status().ToString().c_str()), 1;
  if (absl::Status s = RegisterGroups(**client, names, m); !s.ok()) {
    return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
  }

  double first_loss = 0, loss = 0;
  std::vector<float> grad_w(m.d), grad_b(1);
  std::vector<float> before_w, before_b;
  for (uint64_t step = 1; step <= static_cast<uint64_t>(steps); ++step) {
    loss = LossAndGradient(m, grad_w, grad_b);
    if (step == 1) first_loss = loss;
    if (step == 1 || step % 50 == 0) std::printf("step %4" PRIu64 "  loss %.6f\n", step, loss);
    std::fflush(stdout);
    absl::SleepFor(absl::GetFlag(FLAGS_step_delay));
    if (every > 0) {  // A failed Step may have filled w and b in part.
      before_w = m.w;
      before_b = m.b;
    }
    std::vector<optstate::GroupStep> groups = {{names[0], grad_w, absl::MakeSpan(m.w)},
                                               {names[1], grad_b, absl::MakeSpan(m.b)}};
    absl::Status s = (*client)->Step(groups, step);
    if (s.ok() && every > 0 && step % every == 0) {
      if (!SaveCheckpoint(run, step, m)) {
        return std::fprintf(stderr, "cannot write %s\n", CheckpointPath(run, step).c_str()), 1;
      }
      std::remove(CheckpointPath(run, step - 2 * every).c_str());
      optstate::Client::CheckpointRequestOptions request;
      request.groups = names;
      request.wait_for_step = step;
      auto ckpt = (*client)->Checkpoint(request);
      if (ckpt.ok()) std::printf("checkpoint at step %" PRIu64 ": %s\n", step, ckpt->id.c_str());
      s = ckpt.status();
    }
    if (s.ok()) continue;
    std::printf("step %" PRIu64 " failed: %s\n", step, s.ToString().c_str());
    if (every == 0) return 1;
    absl::StatusOr<uint64_t> resumed = Resume(**client, names, run, step, before_w, before_b, m);
    if (!resumed.ok()) return std::fprintf(stderr, "%s\n", resumed.status().ToString().c_str()), 1;
    step = *resumed;  // The loop's ++step makes it the next one to send.
  }
  for (const std::string& name : names) (*client)->DeleteGroup(name).IgnoreError();
  std::printf("loss %.6f -> %.6f (%.0fx lower)\n", first_loss, loss, first_loss / loss);
  std::printf("final parameters: fnv1a64 %016" PRIx64 " (w[0] %a, b %a)\n", Fnv1a64(m.w, m.b),
              m.w[0], m.b[0]);
  return loss * 100 < first_loss ? 0 : 1;
}
