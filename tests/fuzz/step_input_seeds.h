// Seed inputs for the Step fuzz target: well-formed Step messages for its
// groups (each preceded by the byte that says where to cut it into slices),
// covering every dtype, packing, replays, refusals and unknown fields.
#ifndef OPTSTATE_TESTS_FUZZ_STEP_INPUT_SEEDS_H_
#define OPTSTATE_TESTS_FUZZ_STEP_INPUT_SEEDS_H_

#include <string>
#include <vector>

namespace optstate::fuzz {

std::vector<std::string> StepInputSeeds();

}  // namespace optstate::fuzz

#endif  // OPTSTATE_TESTS_FUZZ_STEP_INPUT_SEEDS_H_
