// Segment lookup by binary search over the segments' start offsets.
#include "server/segmented_bytes.h"

#include <algorithm>
#include <cstring>

namespace optstate {

void SegmentedBytes::Append(absl::string_view segment) {
  if (segment.empty()) return;
  segments_.push_back(segment);
  starts_.push_back(size_);
  size_ += segment.size();
}

void SegmentedBytes::Clear() {
  segments_.clear();
  starts_.clear();
  size_ = 0;
}

size_t SegmentedBytes::SegmentAt(size_t at) const {
  // The last segment starting at or before `at`.
  return static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), at) -
                             starts_.begin()) -
         1;
}

const char* SegmentedBytes::Contiguous(size_t begin, size_t length) const {
  if (length == 0) return segments_.empty() ? "" : segments_.front().data();
  const size_t s = SegmentAt(begin);
  const size_t within = begin - starts_[s];
  if (segments_[s].size() - within < length) return nullptr;
  return segments_[s].data() + within;
}

void SegmentedBytes::CopyTo(size_t begin, size_t length, char* out) const {
  if (length == 0) return;
  for (size_t s = SegmentAt(begin); length > 0; ++s) {
    const size_t within = begin - starts_[s];
    const size_t take = std::min(length, segments_[s].size() - within);
    std::memcpy(out, segments_[s].data() + within, take);
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
    while (starts_[s] + segments_[s].size() <= at) ++s;
    const size_t within = at - starts_[s];
    const size_t whole = std::min((segments_[s].size() - within) / element_size, count - done);
    if (whole > 0) {
      if (!visit(done, whole, segments_[s].data() + within)) return false;
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
