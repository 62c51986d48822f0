// StepEngine calls in one piece, for tests: a whole chunk into a string
// (Validate then Apply), and initial values by group name.
#ifndef OPTSTATE_TESTS_TESTING_STEP_ENGINE_CALLS_H_
#define OPTSTATE_TESTS_TESTING_STEP_ENGINE_CALLS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/engine/step_engine.h"

namespace optstate::testing {

// Validate, then Apply with the params written into `params_out`; the first
// refusal is returned, as the Step reactor would see it.
inline absl::StatusOr<StepChunkResult> ApplyChunk(StepEngine& engine, const StepChunk& chunk,
                                                  std::string* params_out) {
  absl::StatusOr<ValidatedChunk> validated = engine.Validate(chunk);
  if (!validated.ok()) return validated.status();
  return engine.Apply(chunk, *validated, [params_out](size_t bytes) {
    params_out->resize(bytes);
    return params_out->data();
  });
}

// StepEngine::WriteInitialValues for the group of that name (NOT_FOUND when
// there is none).
inline absl::Status WriteInitialValues(StepEngine& engine, const GroupKey& key, uint64_t offset,
                                       WireType type, absl::string_view data) {
  absl::StatusOr<std::shared_ptr<Group>> found = engine.store()->Find(key);
  if (!found.ok()) return found.status();
  return engine.WriteInitialValues(**found, offset, type, data);
}

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_TESTING_STEP_ENGINE_CALLS_H_
