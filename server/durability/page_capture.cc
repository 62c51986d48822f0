// Page-by-page copies under the page mutexes.
#include "server/durability/page_capture.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace optstate {

uint64_t PagesPerCapture(const Group& group, uint64_t max_bytes) {
  const uint64_t page_bytes = group.page_elements() * StateBytesPerElement(group.config());
  return std::max<uint64_t>(1, max_bytes / page_bytes);
}

absl::Status CapturePages(StepBackend& backend, Group& group, uint64_t first_page,
                          uint64_t end_page, CapturedPages* out) {
  out->first_page = first_page;
  out->end_page = end_page;
  out->begin = group.PageBegin(first_page);
  out->end = group.PageEnd(end_page - 1);
  const uint64_t count = out->end - out->begin;
  out->params.resize(count);
  out->exp_avg.resize(count);
  out->exp_avg_sq.resize(count);
  out->max_exp_avg_sq.resize(group.max_exp_avg_sq() != nullptr ? count : 0);
  out->steps.resize(end_page - first_page);
  out->has_values.resize(end_page - first_page);
  for (uint64_t p = first_page; p < end_page; ++p) {
    absl::MutexLock lock(&group.page_mutex(p));
    if (group.deleted()) {
      return absl::NotFoundError(absl::StrCat("group '", group.key().name, "' was deleted"));
    }
    if (group.broken()) {
      // Its pages may hold a step their step numbers do not say: a copy
      // would let a retry apply that step twice after a restore or import.
      return absl::DataLossError(absl::StrCat(
          "group '", group.key().name,
          "' failed part-way through an update, so its state cannot be saved or exported; "
          "delete it and register it again"));
    }
    const uint64_t begin = group.PageBegin(p);
    const uint64_t end = group.PageEnd(p);
    if (absl::Status s = backend.ReadStateToHost(group, begin, end); !s.ok()) return s;
    const size_t bytes = (end - begin) * sizeof(float);
    const uint64_t at = begin - out->begin;
    std::memcpy(out->params.data() + at, group.params() + begin, bytes);
    std::memcpy(out->exp_avg.data() + at, group.exp_avg() + begin, bytes);
    std::memcpy(out->exp_avg_sq.data() + at, group.exp_avg_sq() + begin, bytes);
    if (group.max_exp_avg_sq() != nullptr) {
      std::memcpy(out->max_exp_avg_sq.data() + at, group.max_exp_avg_sq() + begin, bytes);
    }
    out->steps[p - first_page] = group.page_step(p);
    out->has_values[p - first_page] = group.page_has_values(p) ? 1 : 0;
  }
  return absl::OkStatus();
}

}  // namespace optstate
