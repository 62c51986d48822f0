// Bytes that arrived in pieces: a message's payload as the transport's slices
// hold it, read in place instead of gathered into one buffer first.
#ifndef OPTSTATE_SERVER_BASE_SEGMENTED_BYTES_H_
#define OPTSTATE_SERVER_BASE_SEGMENTED_BYTES_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"

namespace optstate {

// A view of contiguous segments, in order; the bytes are not owned and must
// outlive it. Not thread-safe to modify; const methods may run concurrently.
class SegmentedBytes {
 public:
  SegmentedBytes() = default;
  // One segment: the whole of `bytes` (implicit, so a contiguous buffer can
  // stand wherever segmented bytes are taken).
  SegmentedBytes(absl::string_view bytes) { Append(bytes); }  // NOLINT(runtime/explicit)
  SegmentedBytes(const std::string& bytes)                    // NOLINT(runtime/explicit)
      : SegmentedBytes(absl::string_view(bytes)) {}

  // Adds `segment` after those already held (an empty one is dropped).
  void Append(absl::string_view segment);
  void Clear();

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t segment_count() const { return segments_.size(); }

  // Bytes [begin, begin + length) when a single segment holds them all (any
  // range when length is 0), else null. The range must lie within size().
  const char* Contiguous(size_t begin, size_t length) const;
  // Copies bytes [begin, begin + length) to `out`; the range must lie within
  // size().
  void CopyTo(size_t begin, size_t length, char* out) const;

  // Visits `count` elements of `element_size` bytes (at most 8) starting at
  // byte `begin`, in order, as runs of whole elements: visit(first, n, data)
  // gets elements [first, first + n) (counted from `begin`) at `data`, which
  // points into a segment, or, for an element split across segments, into a
  // buffer holding that element alone (n is then 1). Stops as soon as visit
  // returns false, and returns false then; true when every element was
  // visited. The elements must lie within size().
  bool ForEachElementRun(
      size_t begin, size_t element_size, size_t count,
      absl::FunctionRef<bool(size_t first, size_t n, const char* data)> visit) const;

 private:
  // The segment holding byte `at` (< size()).
  size_t SegmentAt(size_t at) const;

  struct Segment {
    absl::string_view bytes;
    size_t start;  // Its first byte's offset in the whole.
    size_t end() const { return start + bytes.size(); }
  };
  std::vector<Segment> segments_;
  size_t size_ = 0;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BASE_SEGMENTED_BYTES_H_
