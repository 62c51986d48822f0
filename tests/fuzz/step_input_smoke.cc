// The fuzz target without libFuzzer, for ctest: runs the seed messages, then
// random mutations of them (half of them bytes flipped, cut, inserted or
// spliced; half of them fields changed in well-formed messages), with a
// fresh, printed seed (OPTSTATE_TEST_SEED replays one). Files given as
// arguments are run first (a libFuzzer crash file, say); --write_seeds=DIR
// writes the seeds out as a corpus instead.
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "optstate/v1/optstate.pb.h"
#include "tests/fuzz/step_input_seeds.h"
#include "tests/fuzz/step_input_target.h"
#include "tests/testing/test_seed.h"

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

// A field-level edit of `input`, kept well-formed so that it reaches the
// engine: its chunks' groups, steps, offsets, dtypes, lr, grad_scale,
// group_elements or gradient bytes changed, chunks dropped or repeated.
std::string MutateFields(const std::string& input, std::mt19937_64& rng) {
  optstate::v1::StepRequest request;
  if (input.empty() || !request.ParseFromString(input.substr(1))) return input;
  std::vector<optstate::v1::StepRequest> chunks;
  optstate::v1::StepRequest outer = request;
  outer.clear_more();
  chunks.push_back(outer);
  for (const auto& packed : request.more()) chunks.push_back(packed);
  for (int e = 1 + static_cast<int>(rng() % 3); e > 0; --e) {
    optstate::v1::StepRequest& chunk = chunks[rng() % chunks.size()];
    switch (rng() % 10) {
      case 0:
        chunk.set_group(std::string(1, "abcx"[rng() % 4]));
        break;
      case 1:
        chunk.set_step(rng() % 4);
        break;
      case 2:
        chunk.set_offset((rng() % 4) * 1024 + (rng() % 8 == 0 ? rng() % 1024 : 0));
        break;
      case 3:
        chunk.set_gradient_dtype(static_cast<optstate::v1::DType>(rng() % 5));
        break;
      case 4:
        chunk.set_param_dtype(static_cast<optstate::v1::DType>(rng() % 5));
        break;
      case 5:
        if (rng() % 8 == 0) {  // Retired (float32) or beyond float32's range: refused.
          if (rng() % 2 == 0) {
            chunk.set_lr_float32(1e-3f);
          } else {
            chunk.set_lr(1e39);
          }
          break;
        }
        chunk.set_lr(
            std::ldexp(static_cast<double>(rng() % 1000) - 500.0, -static_cast<int>(rng() % 20)));
        break;
      case 6:
        chunk.set_grad_scale(std::ldexp(1.0f, static_cast<int>(rng() % 260) - 130));
        break;
      case 7:
        chunk.set_group_elements(rng() % 2 == 0 ? 0 : 1024 * (rng() % 4) + 952 * (rng() % 2));
        break;
      case 8: {  // Gradient bytes: one changed, or a new length.
        std::string* gradient = chunk.mutable_gradient();
        if (!gradient->empty() && rng() % 2 == 0) {
          (*gradient)[rng() % gradient->size()] = static_cast<char>(rng());
        } else {
          gradient->resize(rng() % 4 == 0 ? rng() % 8192 : (rng() % 4) * 2048);
        }
        break;
      }
      default:  // Drop a chunk, or repeat one.
        if (chunks.size() > 1 && rng() % 2 == 0) {
          chunks.erase(chunks.begin() + static_cast<std::ptrdiff_t>(rng() % chunks.size()));
        } else {
          chunks.push_back(chunks[rng() % chunks.size()]);
        }
        break;
    }
  }
  optstate::v1::StepRequest edited = chunks[0];
  for (size_t i = 1; i < chunks.size(); ++i) *edited.add_more() = chunks[i];
  return input.substr(0, 1) + edited.SerializeAsString();
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
    const std::string& seed_input = seeds[rng() % seeds.size()];
    run(rng() % 2 == 0 ? Mutate(seed_input, seeds, rng) : MutateFields(seed_input, rng),
        "mutation " + std::to_string(i));
  }
  std::printf("%zu seeds and %d mutations run (%s), %d broke an invariant\n", seeds.size(),
              kMutations, target.Outcomes().c_str(), failures);
  return failures == 0 ? 0 : 1;
}
