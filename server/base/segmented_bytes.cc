// Segment lookup by binary search over the segments' start offsets.
#include "server/base/segmented_bytes.h"

#include <algorithm>
#include <cstring>

namespace optstate {

void SegmentedBytes::Append(absl::string_view segment) {
  if (segment.empty()) return;
  segments_.push_back(Segment{segment, size_});
  size_ += segment.size();
}

void SegmentedBytes::Clear() {
  segments_.clear();
  size_ = 0;
}

size_t SegmentedBytes::SegmentAt(size_t at) const {
  // The last segment starting at or before `at`.
  const auto after = std::upper_bound(
      segments_.begin(), segments_.end(), at,
      [](size_t offset, const Segment& segment) { return offset < segment.start; });
  return static_cast<size_t>(after - segments_.begin()) - 1;
}

const char* SegmentedBytes::Contiguous(size_t begin, size_t length) const {
  if (length == 0) return segments_.empty() ? "" : segments_.front().bytes.data();
  const Segment& segment = segments_[SegmentAt(begin)];
  if (segment.end() - begin < length) return nullptr;
  return segment.bytes.data() + (begin - segment.start);
}

void SegmentedBytes::CopyTo(size_t begin, size_t length, char* out) const {
  if (length == 0) return;
  for (size_t s = SegmentAt(begin); length > 0; ++s) {
    const Segment& segment = segments_[s];
    const size_t take = std::min(length, segment.end() - begin);
    std::memcpy(out, segment.bytes.data() + (begin - segment.start), take);
    out += take;
    begin += take;
    length -= take;
  }
}

bool SegmentedBytes::ForEachElementRun(
    size_t begin, size_t element_size, size_t count,
    absl::FunctionRef<bool(size_t first, size_t n, const char* data)> visit) const {
  if (count == 0) return true;
  size_t s = SegmentAt(begin);
  size_t done = 0;
  while (done < count) {
    const size_t at = begin + done * element_size;
    while (segments_[s].end() <= at) ++s;
    const Segment& segment = segments_[s];
    const size_t whole = std::min((segment.end() - at) / element_size, count - done);
    if (whole > 0) {
      if (!visit(done, whole, segment.bytes.data() + (at - segment.start))) return false;
      done += whole;
      continue;
    }
    // The element at `at` continues in the next segment(s).
    char element[8];
    CopyTo(at, element_size, element);
    if (!visit(done, 1, element)) return false;
    ++done;
  }
  return true;
}

}  // namespace optstate
