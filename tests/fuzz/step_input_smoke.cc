// The fuzz target without libFuzzer, for ctest: runs the seed messages, then
// random mutations of them (bytes flipped, cut, inserted or spliced), with a
// fresh, printed seed (OPTSTATE_TEST_SEED replays one). Files given as
// arguments are run first (a libFuzzer crash file, say); --write_seeds=DIR
// writes the seeds out as a corpus instead.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "tests/fuzz/step_input_seeds.h"
#include "tests/fuzz/step_input_target.h"
#include "tests/unit/test_seed.h"

namespace {

// One random edit of `input` (its first byte is the slice cut).
std::string Mutate(std::string input, const std::vector<std::string>& seeds, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t at = input.empty() ? 0 : rng() % input.size();
    switch (rng() % 5) {
      case 0:  // Flip a byte.
        if (!input.empty()) input[at] = static_cast<char>(rng());
        break;
      case 1:  // Cut the tail.
        input.resize(at);
        break;
      case 2:  // Insert bytes.
        input.insert(at, std::string(1 + rng() % 8, static_cast<char>(rng())));
        break;
      case 3: {  // Splice in part of another seed.
        const std::string& other = seeds[rng() % seeds.size()];
        const size_t from = other.empty() ? 0 : rng() % other.size();
        input.insert(at, other.substr(from, rng() % 64));
        break;
      }
      default:  // A small varint-sized change: set a byte to an edge value.
        if (!input.empty()) input[at] = "\x00\x01\x7f\x80\xff"[rng() % 5];
        break;
    }
  }
  return input;
}

}  // namespace

int main(int argc, char** argv) {
  // --write_seeds=DIR: write the seeds as files (a libFuzzer corpus), and stop.
  const std::string kWrite = "--write_seeds=";
  if (argc == 2 && std::string(argv[1]).rfind(kWrite, 0) == 0) {
    const std::string dir = std::string(argv[1]).substr(kWrite.size());
    const std::vector<std::string> seeds = optstate::fuzz::StepInputSeeds();
    for (size_t i = 0; i < seeds.size(); ++i) {
      std::ofstream(dir + "/seed-" + std::to_string(i), std::ios::binary) << seeds[i];
    }
    return 0;
  }
  optstate::fuzz::StepInputTarget target;
  int failures = 0;
  auto run = [&](const std::string& input, const std::string& what) {
    const std::string broken =
        target.Run(reinterpret_cast<const uint8_t*>(input.data()), input.size());
    if (!broken.empty()) {
      std::fprintf(stderr, "%s: invariant broken: %s\n", what.c_str(), broken.c_str());
      ++failures;
    }
  };
  for (int i = 1; i < argc; ++i) {
    std::ifstream file(argv[i], std::ios::binary);
    run(std::string(std::istreambuf_iterator<char>(file), {}), argv[i]);
  }
  const std::vector<std::string> seeds = optstate::fuzz::StepInputSeeds();
  for (size_t i = 0; i < seeds.size(); ++i) run(seeds[i], "seed " + std::to_string(i));

  const uint64_t seed = optstate::testing::TestSeed();
  std::printf("%s\n", optstate::testing::SeedTrace(seed).c_str());
  std::mt19937_64 rng(seed);
  constexpr int kMutations = 20000;
  for (int i = 0; i < kMutations && failures < 10; ++i) {
    run(Mutate(seeds[rng() % seeds.size()], seeds, rng), "mutation " + std::to_string(i));
  }
  std::printf("%zu seeds and %d mutations run (%s), %d broke an invariant\n", seeds.size(),
              kMutations, target.Outcomes().c_str(), failures);
  return failures == 0 ? 0 : 1;
}
