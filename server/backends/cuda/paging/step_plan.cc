// Step and upload planning: page runs to bring in, bytes each way.
#include "server/backends/cuda/paging/step_plan.h"

#include <algorithm>

namespace optstate {

void AddTraffic(const StepTraffic& t, PagingCounters* c) {
  if (t.page_ins != 0) c->page_ins.fetch_add(t.page_ins, std::memory_order_relaxed);
  if (t.page_outs != 0) c->page_outs.fetch_add(t.page_outs, std::memory_order_relaxed);
  if (t.bytes_host_to_device != 0) {
    c->bytes_host_to_device.fetch_add(t.bytes_host_to_device, std::memory_order_relaxed);
  }
  if (t.bytes_device_to_host != 0) {
    c->bytes_device_to_host.fetch_add(t.bytes_device_to_host, std::memory_order_relaxed);
  }
}

void PageResidency::MarkOnDevice(uint64_t first, uint64_t end) {
  for (uint64_t p = first; p < end; ++p) on_device_[p] = true;
}

void PageResidency::MarkOffDevice(uint64_t first, uint64_t end) {
  for (uint64_t p = first; p < end; ++p) on_device_[p] = false;
}

uint64_t PageResidency::CountOnDevice() const {
  uint64_t n = 0;
  for (uint64_t p = 0; p < num_pages_; ++p) n += on_device_[p] ? 1 : 0;
  return n;
}

uint64_t PageGeometry::PageEnd(uint64_t page) const {
  const uint64_t end = (page + 1) * page_elements;
  return end < num_elements ? end : num_elements;
}

namespace {

// Maximal runs of pages in [first, end) whose on_device() equals `wanted`.
std::vector<ElementRange> PageRuns(const PageResidency& residency, const PageGeometry& g,
                                   uint64_t first, uint64_t end, bool wanted) {
  std::vector<ElementRange> runs;
  uint64_t p = first;
  while (p < end) {
    if (residency.on_device(p) != wanted) {
      ++p;
      continue;
    }
    uint64_t q = p;
    while (q < end && residency.on_device(q) == wanted) ++q;
    runs.push_back({g.PageBegin(p), g.PageEnd(q - 1)});
    p = q;
  }
  return runs;
}

}  // namespace

StepPlan PlanStep(Placement placement, const PageResidency& residency, const PageGeometry& geometry,
                  uint64_t begin, uint64_t end, size_t grad_element_size) {
  StepPlan plan;
  const uint64_t elements = end - begin;
  plan.first_page = geometry.FirstPage(begin);
  plan.end_page = geometry.EndPage(end);
  const uint64_t pages = plan.end_page - plan.first_page;
  if (placement != Placement::kDeviceResident) {
    plan.on_device_arrays = false;
    plan.traffic.page_ins = pages;
    plan.traffic.page_outs = pages;
    plan.traffic.bytes_host_to_device = elements * (kStateBytesPerElement + grad_element_size);
    plan.traffic.bytes_device_to_host = elements * kStateBytesPerElement;
    return plan;
  }
  plan.on_device_arrays = true;
  plan.page_ins = PageRuns(residency, geometry, plan.first_page, plan.end_page, false);
  for (const ElementRange& r : plan.page_ins) {
    plan.traffic.page_ins += geometry.EndPage(r.end) - geometry.FirstPage(r.begin);
    plan.traffic.bytes_host_to_device += (r.end - r.begin) * kStateBytesPerElement;
  }
  plan.traffic.bytes_host_to_device += elements * grad_element_size;
  plan.traffic.bytes_device_to_host += elements * 4;
  return plan;
}

ParamsUploadPlan PlanParamsUpload(Placement placement, const PageResidency& residency,
                                  const PageGeometry& geometry, uint64_t begin, uint64_t end) {
  ParamsUploadPlan plan;
  if (placement != Placement::kDeviceResident) return plan;
  plan.uploads =
      PageRuns(residency, geometry, geometry.FirstPage(begin), geometry.EndPage(end), true);
  for (ElementRange& r : plan.uploads) {
    // Clip to the range written (begin and end are page-aligned in practice).
    if (r.begin < begin) r.begin = begin;
    if (r.end > end) r.end = end;
    plan.traffic.bytes_host_to_device += (r.end - r.begin) * 4;
  }
  return plan;
}

}  // namespace optstate

namespace optstate {

ParamsUploadPlan PlanSyncToHost(Placement placement, const PageResidency& residency,
                                const PageGeometry& geometry) {
  return PlanStateToHost(placement, residency, geometry, 0, geometry.num_elements);
}

ParamsUploadPlan PlanStateToHost(Placement placement, const PageResidency& residency,
                                 const PageGeometry& geometry, uint64_t begin, uint64_t end) {
  ParamsUploadPlan plan;
  if (placement != Placement::kDeviceResident || begin >= end) return plan;
  plan.uploads =
      PageRuns(residency, geometry, geometry.FirstPage(begin), geometry.EndPage(end), true);
  for (ElementRange& r : plan.uploads) {
    if (r.begin < begin) r.begin = begin;
    if (r.end > end) r.end = end;
    plan.traffic.page_outs += geometry.EndPage(r.end) - geometry.FirstPage(r.begin);
    plan.traffic.bytes_device_to_host += (r.end - r.begin) * kStateBytesPerElement;
  }
  return plan;
}

StateWrittenPlan PlanStateWritten(Placement placement, const PageResidency& residency,
                                  const PageGeometry& geometry, uint64_t begin, uint64_t end) {
  StateWrittenPlan plan;
  if (begin >= end) return plan;
  const uint64_t first = geometry.FirstPage(begin);
  const uint64_t last = geometry.EndPage(end) - 1;
  // A page is wholly inside when the range starts at or before its start
  // and ends at or after its end (the last page ends at num_elements).
  const bool first_whole = begin == geometry.PageBegin(first) && end >= geometry.PageEnd(first);
  const bool last_whole = end == geometry.PageEnd(last);
  plan.first_stale_page = first_whole ? first : first + 1;
  plan.end_stale_page = last_whole ? last + 1 : last;
  if (plan.end_stale_page < plan.first_stale_page) plan.end_stale_page = plan.first_stale_page;
  if (placement != Placement::kDeviceResident) return plan;
  const uint64_t ends[2] = {first, last};  // Only these can be partly inside.
  for (int i = 0; i < (first == last ? 1 : 2); ++i) {
    const uint64_t p = ends[i];
    const bool whole = p >= plan.first_stale_page && p < plan.end_stale_page;
    if (whole || !residency.on_device(p)) continue;
    const ElementRange r{std::max(begin, geometry.PageBegin(p)),
                         std::min(end, geometry.PageEnd(p))};
    plan.uploads.push_back(r);
    plan.traffic.bytes_host_to_device += (r.end - r.begin) * kStateBytesPerElement;
  }
  return plan;
}

}  // namespace optstate
