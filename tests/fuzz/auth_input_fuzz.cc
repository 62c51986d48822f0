// libFuzzer entry point of the credential input (auth_input_target.h); `make
// fuzz` runs it beside the Step one.
#include <cstdio>
#include <cstdlib>

#include "tests/fuzz/auth_input_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static optstate::fuzz::AuthInputTarget* target = new optstate::fuzz::AuthInputTarget();
  const std::string broken = target->Run(data, size);
  if (!broken.empty()) {
    std::fprintf(stderr, "invariant broken: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
