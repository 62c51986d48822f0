// optstate-client-step: the C++ client's side of bench/python/remote_adamw_step.py.
// Registers groups of the given sizes, then for each line read from stdin
// ("fp32" or "bf16") makes one Client::Step of all of them over that wire
// (float32 buffers narrowed / widened by the client, as RemoteAdamW's fp32
// parameters are) and prints the step's wall time in seconds.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "optstate/client.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "The daemon.");
ABSL_FLAG(std::string, sizes, "", "Comma-separated element counts, one group each.");
ABSL_FLAG(std::string, prefix, "bench/cpp/", "Group-name prefix.");

namespace {

struct Wire {
  optstate::WireType type;
  uint64_t next_step = 1;
  std::vector<std::string> names;
};

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "optstate-client-step: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<uint64_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',', absl::SkipEmpty())) {
    uint64_t n = 0;
    if (!absl::SimpleAtoi(s, &n) || n == 0) {
      std::fprintf(stderr, "optstate-client-step: bad --sizes entry '%s'\n",
                   std::string(s).c_str());
      return 2;
    }
    sizes.push_back(n);
  }
  absl::StatusOr<std::unique_ptr<optstate::Client>> client =
      optstate::Client::Connect(absl::GetFlag(FLAGS_target));
  if (!client.ok()) return Fail(client.status());
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> grads(sizes.size()), params(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    grads[i].resize(sizes[i]);
    params[i].resize(sizes[i]);
    for (float& g : grads[i]) g = normal(gen);
  }
  Wire wires[2];
  wires[0].type = optstate::WireType::kFloat32;
  wires[1].type = optstate::WireType::kBFloat16;
  for (int w = 0; w < 2; ++w) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      wires[w].names.push_back(
          absl::StrCat(absl::GetFlag(FLAGS_prefix), w == 0 ? "fp32/" : "bf16/", i));
      absl::StatusOr<optstate::GroupInfo> info =
          (*client)->RegisterGroup(wires[w].names.back(), params[i]);
      if (!info.ok()) return Fail(info.status());
      wires[w].next_step = info->min_step + 1;
    }
  }
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    Wire* wire = line == "fp32" ? &wires[0] : line == "bf16" ? &wires[1] : nullptr;
    if (wire == nullptr) {
      std::fprintf(stderr, "optstate-client-step: expected fp32 or bf16, got '%s'\n", line.c_str());
      return 2;
    }
    std::vector<optstate::GroupStep> steps;
    for (size_t i = 0; i < sizes.size(); ++i) {
      steps.push_back({wire->names[i], grads[i], absl::MakeSpan(params[i])});
    }
    optstate::StepOptions options;
    options.gradient_dtype = options.param_dtype = wire->type;
    options.lr = 1e-3;
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = (*client)->Step(steps, wire->next_step++, options);
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (!status.ok()) return Fail(status);
    std::printf("%.9f\n", elapsed.count());
    std::fflush(stdout);
  }
  return 0;
}
