// What the checkpoint tests share: small-page daemons on a state_dir, two
// groups stepped with fixed gradients, and the state an uninterrupted daemon
// reaches at each step (the reference every restored state must equal).
#ifndef OPTSTATE_TESTS_INTEGRATION_DURABILITY_TESTING_H_
#define OPTSTATE_TESTS_INTEGRATION_DURABILITY_TESTING_H_

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "optstate/client.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/random_tensors.h"

namespace optstate::testing {

constexpr uint64_t kCkptPage = 1024;
// Two groups: 64 pages, and 4 pages and a partial fifth.
const std::vector<std::pair<std::string, size_t>> kCkptGroups = {{"model.w", 64 * kCkptPage},
                                                                 {"model.b", 4 * kCkptPage + 77}};

inline Hyperparameters CkptHyperparameters() {
  Hyperparameters h;
  h.lr = 2e-3;
  h.beta1 = 0.85;
  h.beta2 = 0.995;
  h.weight_decay = 0.02;
  return h;
}

// Fixed initial values and gradients (seeded), so separate daemons can be
// stepped alike.
class CkptWorkload {
 public:
  explicit CkptWorkload(uint32_t seed, uint64_t max_step = 40) {
    std::mt19937 rng(seed);
    for (const auto& [name, n] : kCkptGroups) {
      initial_[name] = RandomNormal(rng, n, 1.0f);
      for (uint64_t t = 0; t < max_step; ++t) grads_[name].push_back(RandomNormal(rng, n, 1e-2f));
    }
  }
  void Register(Client& client) const {
    for (const auto& [name, n] : kCkptGroups) {
      absl::StatusOr<GroupInfo> info =
          client.RegisterGroup(name, initial_.at(name), CkptHyperparameters());
      ASSERT_TRUE(info.ok()) << info.status();
    }
  }
  // Steps [first, last] of every group, one Step call per step.
  void Steps(Client& client, uint64_t first, uint64_t last) const {
    for (uint64_t t = first; t <= last; ++t) {
      std::vector<std::vector<float>> out;
      std::vector<GroupStep> steps;
      for (const auto& [name, n] : kCkptGroups) out.emplace_back(n);
      size_t i = 0;
      for (const auto& [name, n] : kCkptGroups) {
        steps.push_back(GroupStep{name, grads_.at(name)[t - 1], absl::MakeSpan(out[i++])});
      }
      absl::Status s = client.Step(steps, t);
      ASSERT_TRUE(s.ok()) << "step " << t << ": " << s;
    }
  }
  const std::vector<float>& initial(const std::string& name) const { return initial_.at(name); }
  const std::vector<float>& grad(const std::string& name, uint64_t t) const {
    return grads_.at(name)[t - 1];
  }

 private:
  std::map<std::string, std::vector<float>> initial_;
  std::map<std::string, std::vector<std::vector<float>>> grads_;
};

using StateOfGroups = std::map<std::string, Client::GroupState>;

inline StateOfGroups ExportAll(Client& client) {
  StateOfGroups out;
  for (const auto& [name, n] : kCkptGroups) {
    absl::StatusOr<Client::GroupState> state = client.ExportState(name);
    EXPECT_TRUE(state.ok()) << name << ": " << state.status();
    if (state.ok()) out[name] = std::move(*state);
  }
  return out;
}

// True when every byte of params, m and v and every page step are equal.
inline ::testing::AssertionResult SameState(const StateOfGroups& got,
                                            const StateOfGroups& expected) {
  for (const auto& [name, e] : expected) {
    auto it = got.find(name);
    if (it == got.end()) return ::testing::AssertionFailure() << "group " << name << " missing";
    const Client::GroupState& g = it->second;
    if (g.params.size() != e.params.size()) {
      return ::testing::AssertionFailure() << name << ": size " << g.params.size();
    }
    const size_t bytes = e.params.size() * 4;
    if (std::memcmp(g.params.data(), e.params.data(), bytes) != 0) {
      return ::testing::AssertionFailure() << name << ": params differ";
    }
    if (std::memcmp(g.exp_avg.data(), e.exp_avg.data(), bytes) != 0) {
      return ::testing::AssertionFailure() << name << ": exp_avg differs";
    }
    if (std::memcmp(g.exp_avg_sq.data(), e.exp_avg_sq.data(), bytes) != 0) {
      return ::testing::AssertionFailure() << name << ": exp_avg_sq differs";
    }
    if (g.page_steps != e.page_steps) {
      return ::testing::AssertionFailure() << name << ": page steps differ (first "
                                           << g.page_steps[0] << " vs " << e.page_steps[0] << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// True when every page of group `name` in `got` equals, in params, m and v,
// the page of `references` at that page's own step (which must be one of
// theirs): the state of a group written without waiting for it, whose pages
// may each be caught before or after a step in flight.
inline ::testing::AssertionResult EachPageAtItsOwnStep(
    const StateOfGroups& got, const std::map<uint64_t, StateOfGroups>& references,
    const std::string& name) {
  auto it = got.find(name);
  if (it == got.end()) return ::testing::AssertionFailure() << "group " << name << " missing";
  const Client::GroupState& g = it->second;
  for (size_t page = 0; page < g.page_steps.size(); ++page) {
    const uint64_t step = g.page_steps[page];
    auto ref = references.find(step);
    if (ref == references.end()) {
      return ::testing::AssertionFailure()
             << name << " page " << page << " is at step " << step << ", which has no reference";
    }
    const Client::GroupState& e = ref->second.at(name);
    if (g.params.size() != e.params.size()) {
      return ::testing::AssertionFailure() << name << ": size " << g.params.size();
    }
    const size_t begin = page * kCkptPage;
    const size_t bytes = (std::min<size_t>(begin + kCkptPage, e.params.size()) - begin) * 4;
    if (std::memcmp(g.params.data() + begin, e.params.data() + begin, bytes) != 0 ||
        std::memcmp(g.exp_avg.data() + begin, e.exp_avg.data() + begin, bytes) != 0 ||
        std::memcmp(g.exp_avg_sq.data() + begin, e.exp_avg_sq.data() + begin, bytes) != 0) {
      return ::testing::AssertionFailure()
             << name << " page " << page << " differs from step " << step << "'s";
    }
  }
  return ::testing::AssertionSuccess();
}

// A fresh directory under the test's temporary directory, removed (with
// its ".paused" marker) when the test process exits.
inline std::string FreshDirectory(const std::string& name) {
  static std::vector<std::string>* const made = [] {
    static std::vector<std::string> dirs;
    std::atexit([] {
      for (const std::string& d : dirs) {
        std::error_code ignored;
        std::filesystem::remove_all(d, ignored);
        std::filesystem::remove(d + ".paused", ignored);
      }
    });
    return &dirs;
  }();
  const char* tmp = std::getenv("TMPDIR");
  std::string dir =
      std::string(tmp ? tmp : "/tmp") + "/optstate-" + name + "-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  made->push_back(dir);
  return dir;
}

// The names in a state_dir, sorted, but the daemon's LOCK: the checkpoints,
// complete (ckpt-N) and unfinished (ckpt-N.tmp).
inline std::vector<std::string> CheckpointNamesIn(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename() != "LOCK") names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

inline std::vector<std::string> CkptFlags(const std::string& state_dir,
                                          std::vector<std::string> extra = {}) {
  std::vector<std::string> flags = {"--threads=2", "--page_elements=1024",
                                    "--state_dir=" + state_dir};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

inline std::unique_ptr<Client> ConnectTo(const DaemonProcess& daemon, ClientOptions options = {}) {
  auto client = Client::Connect(daemon.target(), options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

// The state an uninterrupted daemon (no state_dir) reaches at each of `steps`.
inline std::map<uint64_t, StateOfGroups> ReferenceStates(const CkptWorkload& work,
                                                         const std::vector<uint64_t>& steps) {
  std::map<uint64_t, StateOfGroups> out;
  auto daemon = DaemonProcess::Start({"--threads=2", "--page_elements=1024"});
  EXPECT_TRUE(daemon.ok()) << daemon.status();
  if (!daemon.ok()) return out;
  auto client = ConnectTo(**daemon);
  work.Register(*client);
  uint64_t at = 0;
  for (uint64_t s : steps) {
    work.Steps(*client, at + 1, s);
    at = s;
    out[s] = ExportAll(*client);
  }
  return out;
}

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_INTEGRATION_DURABILITY_TESTING_H_
