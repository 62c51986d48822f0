// Parts of about equal bytes, the first on the calling thread.
#include "client/step/group_ranges.h"

#include <algorithm>
#include <thread>
#include <vector>

namespace optstate::client_internal {
namespace {

constexpr size_t kMaxPrepareThreads = 4;
constexpr uint64_t kBytesPerPrepareThread = 8 << 20;

// A part's first element: `item`, element `element` of it.
struct Cut {
  size_t item;
  uint64_t element;
};

}  // namespace

absl::Status ForEachElementSplit(
    absl::Span<const ElementItem> items,
    const std::function<absl::Status(size_t item, uint64_t begin, uint64_t end)>& run) {
  if (items.empty()) return absl::OkStatus();
  uint64_t total = 0;
  for (const ElementItem& item : items) total += item.elements * item.element_bytes;
  // Read once: glibc reads it from /sys on every call (60 us a step).
  static const size_t cpus = std::max(1u, std::thread::hardware_concurrency());
  const size_t parts = std::min<uint64_t>(
      {kMaxPrepareThreads, cpus, std::max<uint64_t>(1, total / kBytesPerPrepareThread)});
  // Part p runs from cuts[p] up to cuts[p + 1]; the last cut is the end.
  std::vector<Cut> cuts = {{0, 0}};
  uint64_t before = 0;  // Bytes of the items before item i.
  for (size_t i = 0; i < items.size() && cuts.size() < parts; ++i) {
    const uint64_t size = items[i].element_bytes;
    const uint64_t bytes = items[i].elements * size;
    // Every part boundary that falls inside item i, at an aligned element.
    while (cuts.size() < parts) {
      const uint64_t boundary = total * cuts.size() / parts;  // In bytes of the step.
      if (boundary >= before + bytes) break;
      // (A boundary before item i fell inside an item too small to cut: it
      // becomes item i's start.)
      const uint64_t element = boundary <= before || size == 0
                                   ? 0
                                   : (boundary - before) / size / kElementSplitAlignment *
                                         kElementSplitAlignment;
      const Cut cut{i, element};
      if (cut.item == cuts.back().item && cut.element <= cuts.back().element) {
        break;  // Item i is too small to cut there: a later item may be.
      }
      cuts.push_back(cut);
    }
    before += bytes;
  }
  cuts.push_back({items.size(), 0});
  std::vector<absl::Status> failed(cuts.size() - 1);
  auto run_part = [&](size_t p) {
    const Cut from = cuts[p], to = cuts[p + 1];
    for (size_t i = from.item; i <= to.item && i < items.size(); ++i) {
      const uint64_t begin = i == from.item ? from.element : 0;
      const uint64_t end = i == to.item ? to.element : items[i].elements;
      if (begin >= end) continue;
      if (absl::Status s = run(i, begin, end); !s.ok()) {
        failed[p] = std::move(s);
        return;
      }
    }
  };
  std::vector<std::thread> helpers;
  for (size_t p = 1; p + 1 < cuts.size(); ++p) helpers.emplace_back(run_part, p);
  run_part(0);
  for (std::thread& helper : helpers) helper.join();
  for (absl::Status& status : failed) {
    if (!status.ok()) return std::move(status);  // Parts are in element order.
  }
  return absl::OkStatus();
}

}  // namespace optstate::client_internal
