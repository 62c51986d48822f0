// A trainer process for shared_memory_hostile_test: connects to the daemon
// at argv[1] through shared memory, and steps group argv[2] from its current
// step on, forever, printing "stepping" after its first step (the test then
// SIGKILLs it at some point of a later one).
#include <cstdio>
#include <vector>

#include "optstate/client.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  optstate::ClientOptions options;
  options.data_plane = optstate::DataPlane::kSharedMemory;
  auto client = optstate::Client::Connect(argv[1], options);
  if (!client.ok()) return 3;
  auto info = (*client)->DescribeGroup(argv[2]);
  if (!info.ok()) return 4;
  std::vector<float> grad(info->num_elements, 1e-3f), params(info->num_elements);
  for (uint64_t t = info->min_step + 1;; ++t) {
    absl::Status status = (*client)->Step(argv[2], t, grad, absl::MakeSpan(params));
    if (!status.ok()) {
      std::fprintf(stderr, "shm_step_child: %s\n", status.ToString().c_str());
      return 5;
    }
    if (t == info->min_step + 1) {
      std::printf("stepping\n");
      std::fflush(stdout);
    }
  }
}
