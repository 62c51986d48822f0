// Ranges of about equal gradient bytes, the first on the calling thread.
#include "client/step/group_ranges.h"

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace optstate::client_internal {
namespace {

constexpr size_t kMaxPrepareThreads = 4;
constexpr uint64_t kBytesPerPrepareThread = 8 << 20;

}  // namespace

absl::Status ForEachGroupSplit(absl::Span<const GroupStep> groups,
                               const std::function<absl::Status(size_t)>& prepare) {
  uint64_t total = 0;
  for (const GroupStep& group : groups) {
    total += group.gradient.size() * group.gradient.element_bytes();
  }
  const size_t cpus = std::max(1u, std::thread::hardware_concurrency());
  const size_t ranges = std::min<uint64_t>(
      {kMaxPrepareThreads, cpus, std::max<uint64_t>(1, total / kBytesPerPrepareThread)});
  // Range r covers groups [bounds[r], bounds[r + 1]).
  std::vector<size_t> bounds = {0};
  uint64_t seen = 0;
  for (size_t i = 0; i < groups.size() && bounds.size() < ranges; ++i) {
    seen += groups[i].gradient.size() * groups[i].gradient.element_bytes();
    if (seen * ranges >= total * bounds.size()) bounds.push_back(i + 1);
  }
  bounds.push_back(groups.size());
  std::vector<absl::Status> first_error(bounds.size() - 1);
  std::vector<size_t> failed_at(bounds.size() - 1, SIZE_MAX);
  auto run = [&](size_t r) {
    for (size_t i = bounds[r]; i < bounds[r + 1]; ++i) {
      absl::Status s = prepare(i);
      if (s.ok()) continue;
      first_error[r] = std::move(s);
      failed_at[r] = i;
      return;
    }
  };
  std::vector<std::thread> helpers;
  for (size_t r = 1; r + 1 < bounds.size(); ++r) helpers.emplace_back(run, r);
  run(0);
  for (std::thread& helper : helpers) helper.join();
  for (size_t r = 0; r < failed_at.size(); ++r) {
    if (failed_at[r] != SIZE_MAX) return first_error[r];  // Ranges are in order.
  }
  return absl::OkStatus();
}

}  // namespace optstate::client_internal
