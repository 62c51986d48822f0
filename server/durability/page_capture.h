// Copies of a group's pages, each taken under its page mutex together with
// its step: what ExportState sends and a checkpoint writes.
#ifndef OPTSTATE_SERVER_DURABILITY_PAGE_CAPTURE_H_
#define OPTSTATE_SERVER_DURABILITY_PAGE_CAPTURE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "server/backends/step_backend.h"
#include "server/state/group.h"

namespace optstate {

// Pages [first_page, end_page) of a group: elements [begin, end) of its
// params, exp_avg and exp_avg_sq (and max_exp_avg_sq for an amsgrad group,
// else empty), and per page its step and values flag.
struct CapturedPages {
  uint64_t first_page = 0, end_page = 0;
  uint64_t begin = 0, end = 0;
  std::vector<float> params, exp_avg, exp_avg_sq, max_exp_avg_sq;
  std::vector<uint64_t> steps;
  std::vector<uint8_t> has_values;
};

// How many pages one capture of `group` takes so that it holds at most
// `max_bytes` of copies (12 bytes per element, 16 with amsgrad), at least
// one page.
uint64_t PagesPerCapture(const Group& group, uint64_t max_bytes);

// Fills `out` with pages [first_page, end_page), locking one page at a time:
// a page is held only while it is copied, so steps of other pages go on, and
// each page's copy is consistent with its step. `out`'s vectors are reused.
// NOT_FOUND once the group is deleted; the backend's error when it cannot
// bring the state to the host (StepBackend::ReadStateToHost).
absl::Status CapturePages(StepBackend& backend, Group& group, uint64_t first_page,
                          uint64_t end_page, CapturedPages* out);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_DURABILITY_PAGE_CAPTURE_H_
