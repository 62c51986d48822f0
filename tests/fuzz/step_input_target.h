// The daemon's handling of Step bytes, driven without gRPC for fuzzing: the
// bytes are read as the reactor reads them (ReadStepRequest, over slices cut
// where the input says) and applied as it applies them (ApplyStepMessage) to
// two small groups, with the invariants every input must keep checked.
#ifndef OPTSTATE_TESTS_FUZZ_STEP_INPUT_TARGET_H_
#define OPTSTATE_TESTS_FUZZ_STEP_INPUT_TARGET_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "server/backends/cpu/cpu_backend.h"
#include "server/base/thread_pool.h"
#include "server/engine/state_store.h"
#include "server/engine/step_engine.h"
#include "server/regions/region_registry.h"

namespace optstate::fuzz {

// Not thread-safe. State carries over from one input to the next, as a
// daemon's does.
class StepInputTarget {
 public:
  // The daemon's limits, scaled down: pages of kPage elements, and replies of
  // at most kMaxReplyBytes.
  static constexpr uint64_t kPage = 1024;
  static constexpr size_t kMaxReplyBytes = 1 << 20;
  static constexpr uint64_t kRegionBytes = 65536;

  StepInputTarget();

  // Runs one input: its first byte says where to cut the rest into up to
  // three slices. Returns an empty string when every invariant held, else
  // what broke:
  //  - ReadStepRequest accepts exactly what protobuf's parser accepts, and
  //    reads the same fields and gradients;
  //  - a message refused with INVALID_ARGUMENT (or OUT_OF_RANGE: a region
  //    slice past the region's end) changed no byte of state;
  //  - an applied message's reply parses as a StepResponse with one reply
  //    per chunk, each echoing its chunk and carrying its params, and left
  //    every page of its chunks at the message's step.
  // Chunks naming region slices are given the session key of the target's
  // one region (id 1, kRegionBytes), so the input chooses ids, offsets and
  // sizes; their params are checked to be in the region, not the reply.
  std::string Run(const uint8_t* data, size_t size);

  // How the inputs run so far ended: read or not, then applied or the
  // refusal's code, with counts ("applied: 120, FAILED_PRECONDITION: 800, ...").
  std::string Outcomes() const;

 private:
  std::string Snapshot() const;

  ThreadPool pool_;
  CpuBackend backend_;
  StateStore store_;
  StepEngine engine_;
  RegionRegistry regions_{RegionLimits{}};
  std::string session_;
  std::map<std::string, int> outcomes_;
};

}  // namespace optstate::fuzz

#endif  // OPTSTATE_TESTS_FUZZ_STEP_INPUT_TARGET_H_
