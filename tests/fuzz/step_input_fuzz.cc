// libFuzzer entry point (built with clang and OPTSTATE_LIBFUZZER=ON; `make
// fuzz`): any input that breaks an invariant of StepInputTarget aborts.
#include <cstdio>
#include <cstdlib>

#include "tests/fuzz/step_input_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static optstate::fuzz::StepInputTarget* target = new optstate::fuzz::StepInputTarget();
  const std::string broken = target->Run(data, size);
  if (!broken.empty()) {
    std::fprintf(stderr, "invariant broken: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
