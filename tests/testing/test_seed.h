// Seeds for the randomised unit tests: fresh each run, printed so a failure
// can be replayed with OPTSTATE_TEST_SEED=<seed>.
#ifndef OPTSTATE_TESTS_TESTING_TEST_SEED_H_
#define OPTSTATE_TESTS_TESTING_TEST_SEED_H_

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

namespace optstate::testing {

// OPTSTATE_TEST_SEED when set, otherwise 64 bits from std::random_device.
inline uint64_t TestSeed() {
  if (const char* fixed = std::getenv("OPTSTATE_TEST_SEED"); fixed != nullptr && *fixed != '\0') {
    return std::strtoull(fixed, nullptr, 0);
  }
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

// The text a SCOPED_TRACE carries so that a failure names its seed.
inline std::string SeedTrace(uint64_t seed) {
  return "seed " + std::to_string(seed) +
         " (replay with OPTSTATE_TEST_SEED=" + std::to_string(seed) + ")";
}

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_TESTING_TEST_SEED_H_
