// What one backend operation must copy between host and device, and what it
// adds to the group's paging counters. Pure planning: the CUDA backend
// carries a plan out; CPU tests check plans and counters without a device.
#ifndef OPTSTATE_SERVER_BACKENDS_CUDA_PAGING_STEP_PLAN_H_
#define OPTSTATE_SERVER_BACKENDS_CUDA_PAGING_STEP_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "server/state/group.h"
#include "server/state/group_counters.h"

namespace optstate {

// Counter increments. A page-in copies a page's whole state (params, m, v)
// host to device; a page-out copies it back. Bytes count every copy,
// gradients and params-only copies included.
struct StepTraffic {
  uint64_t page_ins = 0;
  uint64_t page_outs = 0;
  uint64_t bytes_host_to_device = 0;
  uint64_t bytes_device_to_host = 0;

  StepTraffic& operator+=(const StepTraffic& o) {
    page_ins += o.page_ins;
    page_outs += o.page_outs;
    bytes_host_to_device += o.bytes_host_to_device;
    bytes_device_to_host += o.bytes_device_to_host;
    return *this;
  }
  bool operator==(const StepTraffic& o) const {
    return page_ins == o.page_ins && page_outs == o.page_outs &&
           bytes_host_to_device == o.bytes_host_to_device &&
           bytes_device_to_host == o.bytes_device_to_host;
  }
};

// Adds `traffic` to `counters` (copy_wait_us is measured, not planned).
void AddTraffic(const StepTraffic& traffic, PagingCounters* counters);

// Which pages of a group hold their current state on the device. All start
// off the device. Entry p may be read or written only while holding the
// group's page_mutex(p), or before the group is visible to steps.
class PageResidency {
 public:
  explicit PageResidency(uint64_t num_pages)
      : num_pages_(num_pages), on_device_(new bool[num_pages]()) {}

  uint64_t num_pages() const { return num_pages_; }
  bool on_device(uint64_t page) const { return on_device_[page]; }
  // Pages [first, end).
  void MarkOnDevice(uint64_t first, uint64_t end);
  // Pages [first, end): their current state is on the host now (the host
  // arrays were overwritten), so a resident step copies them in again.
  void MarkOffDevice(uint64_t first, uint64_t end);
  uint64_t CountOnDevice() const;

 private:
  const uint64_t num_pages_;
  std::unique_ptr<bool[]> on_device_;
};

// A half-open range of elements of a group.
struct ElementRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  bool operator==(const ElementRange& o) const { return begin == o.begin && end == o.end; }
};

// The pages [begin, end) of a group cover: page geometry for planning.
struct PageGeometry {
  uint64_t page_elements = 0;
  uint64_t num_elements = 0;
  uint64_t FirstPage(uint64_t begin) const { return begin / page_elements; }
  uint64_t EndPage(uint64_t end) const { return (end + page_elements - 1) / page_elements; }
  uint64_t PageBegin(uint64_t page) const { return page * page_elements; }
  uint64_t PageEnd(uint64_t page) const;
};

struct StepPlan {
  // True: the kernel runs on the group's device arrays (resident); only the
  // gradient goes in and the params come back. False: p, m, v and the
  // gradient go through staging slots and p, m, v come back (paged).
  bool on_device_arrays = false;
  // Resident only: maximal runs of pages of [begin, end) not yet on the
  // device, whose state is copied in (page-ins) before the step.
  std::vector<ElementRange> page_ins;
  // Resident only: pages [first_page, end_page) to mark on the device once
  // the plan has been carried out.
  uint64_t first_page = 0;
  uint64_t end_page = 0;
  StepTraffic traffic;
};

// Plans one AdamW step over [begin, end) (page-aligned begin, as the engine
// guarantees) of a group placed at `placement`, with gradients of
// `grad_element_size` bytes. `residency` is read for the pages of the range
// only (the caller holds their page mutexes).
StepPlan PlanStep(Placement placement, const PageResidency& residency, const PageGeometry& geometry,
                  uint64_t begin, uint64_t end, size_t grad_element_size);

// Copies of page runs that are on the device (not part of a step).
struct ParamsUploadPlan {
  // For an upload of fresh host params: the pages of [begin, end) already
  // on the device of a resident group (pages not on the device pick the
  // params up with their page-in). For a sync: every page on the device.
  std::vector<ElementRange> uploads;
  StepTraffic traffic;
};

// Plans the copy after host params of [begin, end) were overwritten.
ParamsUploadPlan PlanParamsUpload(Placement placement, const PageResidency& residency,
                                  const PageGeometry& geometry, uint64_t begin, uint64_t end);

// Plans copying a resident group's state back to its host arrays: the page
// runs on the device, each a page-out of params, m and v.
ParamsUploadPlan PlanSyncToHost(Placement placement, const PageResidency& residency,
                                const PageGeometry& geometry);

// Plans bringing the state of elements [begin, end) to the host arrays (a
// checkpoint or an export, StepBackend::ReadStateToHost): the runs of pages
// of the range on the device of a resident group, clipped to the range, each
// a page-out of params, m and v. Empty for other placements: a paged step
// copies p, m and v back before it returns, so the host arrays of a paged
// group hold its state whenever no step runs on the page. `residency` is
// read for the pages of the range only.
ParamsUploadPlan PlanStateToHost(Placement placement, const PageResidency& residency,
                                 const PageGeometry& geometry, uint64_t begin, uint64_t end);

// What follows an overwrite of the host params, m and v of [begin, end) (an
// import or a restore, StepBackend::StateWritten).
struct StateWrittenPlan {
  // Pages wholly inside the range, for any placement: marked off the device
  // (PageResidency::MarkOffDevice), so a resident step copies the new state
  // in with its page-in. No copy now.
  uint64_t first_stale_page = 0;
  uint64_t end_stale_page = 0;
  // Resident only: the written parts of the (at most two) pages only partly
  // inside the range that are on the device, copied host to device (p, m,
  // v), since the rest of such a page is current only on the device.
  std::vector<ElementRange> uploads;
  StepTraffic traffic;
};

// Plans the above; `residency` is read for the pages of the range only.
StateWrittenPlan PlanStateWritten(Placement placement, const PageResidency& residency,
                                  const PageGeometry& geometry, uint64_t begin, uint64_t end);

// Bytes of VRAM a resident group of `num_elements` takes (params, m, v).
inline uint64_t ResidentBytesFor(uint64_t num_elements) {
  return num_elements * kStateBytesPerElement;
}

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BACKENDS_CUDA_PAGING_STEP_PLAN_H_
