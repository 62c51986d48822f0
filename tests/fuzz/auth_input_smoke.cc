// The credential fuzz target without libFuzzer, for ctest: the seeds, then
// 50,000 random mutations of them (bytes flipped, cut, inserted, spliced)
// with a printed seed (OPTSTATE_TEST_SEED replays one). Files given as
// arguments run first; --write_seeds=DIR writes the corpus instead.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "tests/fuzz/auth_input_target.h"
#include "tests/testing/test_seed.h"

namespace {

std::string Mutate(std::string input, const std::vector<std::string>& seeds, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t at = input.empty() ? 0 : rng() % input.size();
    switch (rng() % 4) {
      case 0:
        if (!input.empty()) input[at] = static_cast<char>(rng());
        break;
      case 1:
        input.resize(at);
        break;
      case 2:
        input.insert(at, std::string(1 + rng() % 8, " \n\t#=ab0"[rng() % 8]));
        break;
      default: {
        const std::string& other = seeds[rng() % seeds.size()];
        const size_t from = other.empty() ? 0 : rng() % other.size();
        input.insert(at, other.substr(from, rng() % 40));
        break;
      }
    }
  }
  return input;
}

int RunOne(optstate::fuzz::AuthInputTarget& target, const std::string& input) {
  const std::string broken =
      target.Run(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  if (broken.empty()) return 0;
  std::fprintf(stderr, "invariant broken: %s\n", broken.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> seeds = optstate::fuzz::AuthInputSeeds();
  optstate::fuzz::AuthInputTarget target;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--write_seeds=", 0) == 0) {
      for (size_t s = 0; s < seeds.size(); ++s) {
        std::ofstream(arg.substr(14) + "/auth_seed_" + std::to_string(s), std::ios::binary)
            << seeds[s];
      }
      return 0;
    }
    std::ifstream in(arg, std::ios::binary);
    if (RunOne(target, std::string(std::istreambuf_iterator<char>(in), {})) != 0) return 1;
  }
  for (const std::string& seed : seeds) {
    if (RunOne(target, seed) != 0) return 1;
  }
  const uint64_t seed = optstate::testing::TestSeed();
  std::printf("auth_input_smoke: %s\n", optstate::testing::SeedTrace(seed).c_str());
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 50000; ++i) {
    const std::string input = Mutate(seeds[rng() % seeds.size()], seeds, rng);
    if (RunOne(target, input) != 0) {
      std::fprintf(stderr, "input %d of %s\n", i, optstate::testing::SeedTrace(seed).c_str());
      return 1;
    }
  }
  std::printf("auth_input_smoke: %zu seeds and 50000 mutations held every invariant\n",
              seeds.size());
  return 0;
}
