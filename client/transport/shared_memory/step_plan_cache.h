// The step plans (StepRequest.plan) a client keeps with the daemon for its
// steps wholly in SharedBuffers: which chunks the daemon keeps under which
// number, so a step with the same chunks as one before sends only the
// number, its step and the per-step fields that changed. Not API.
#ifndef OPTSTATE_CLIENT_TRANSPORT_SHARED_MEMORY_STEP_PLAN_CACHE_H_
#define OPTSTATE_CLIENT_TRANSPORT_SHARED_MEMORY_STEP_PLAN_CACHE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/transport/chunk_fields.h"
#include "optstate/dtype.h"

namespace optstate::client_internal {

// One chunk as a step sends it, but for its step number.
struct PlanChunk {
  absl::string_view group;  // The caller's name, alive for the step.
  uint64_t offset = 0;
  uint64_t count = 0;
  uint64_t group_elements = 0;
  uint64_t gradient_region = 0;
  uint64_t gradient_offset = 0;
  uint64_t params_region = 0;
  uint64_t params_offset = 0;
  PerStepFields fields;
};

// How a step uses the kept plan: its number, and the per-step fields to
// set (each then the value of every chunk).
struct PlanUse {
  uint64_t plan = 0;
  PerStepFields overrides;
};

// Not thread-safe: the SharedMemoryPlane that holds it serves one step at
// a time.
class StepPlanCache {
 public:
  // Plans kept at once, numbered 1 to kMaxPlans: a trainer that alternates
  // a few layouts (groups stepped on alternate steps) uses each. A new
  // plan takes the number of the one least recently used, which the daemon
  // then replaces, so a client never holds more than this many there.
  static constexpr size_t kMaxPlans = 4;

  // How a step of `chunks`, sent in `session` with these dtypes, uses a
  // plan kept; std::nullopt when it must define one: none kept has these
  // chunks (but for their per-step fields), or a per-step field differs
  // from the plan's and is not one value (set) in every chunk.
  // A plan used counts as used (for which a new one replaces).
  std::optional<PlanUse> Match(absl::string_view session, WireType gradient_dtype,
                               WireType param_dtype, absl::Span<const PlanChunk> chunks);
  // The number under which to define a plan of `chunks` (sent with their
  // message); the plan is kept once Defined(number) is called, when the
  // message's reply came and said the daemon kept it (until then no plan
  // has that number).
  uint64_t Define(absl::string_view session, WireType gradient_dtype, WireType param_dtype,
                  absl::Span<const PlanChunk> chunks);
  void Defined(uint64_t number);
  // Forgets plan `number` (the daemon refused a use of it).
  void Forget(uint64_t number);

 private:
  struct Kept {
    uint64_t number = 0;    // 0: none.
    uint64_t last_use = 0;  // Of use_clock_.
    std::string session;
    WireType gradient_dtype = WireType::kFloat32;
    WireType param_dtype = WireType::kFloat32;
    std::vector<std::string> groups;  // Chunk k's group: groups[k] (chunks[k].group unused).
    std::vector<PlanChunk> chunks;
  };
  // The plan a step would use, or nullptr.
  Kept* Find(absl::string_view session, WireType gradient_dtype, WireType param_dtype,
             absl::Span<const PlanChunk> chunks);

  Kept kept_[kMaxPlans];  // kept_[k] has number k + 1, or none.
  Kept pending_;
  uint64_t use_clock_ = 0;
};

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_TRANSPORT_SHARED_MEMORY_STEP_PLAN_CACHE_H_
