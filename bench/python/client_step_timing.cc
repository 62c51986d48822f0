// optstate-client-step: the C++ client's side of bench/python/remote_adamw_step.py.
// Registers groups of the given sizes (with the initial values from --values,
// the same bytes RemoteAdamW registers), then for each line read from stdin
// ("fp32" or "bf16") makes one Client::Step of all of them over that wire
// with the gradients from --grads (float32 buffers narrowed / widened by the
// client, each group with its own lr, as RemoteAdamW's fp32 parameters are)
// and prints the step's wall time and this process's CPU time, in seconds.
#include <time.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
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
ABSL_FLAG(std::string, values, "",
          "File of the groups' initial values: float32, the groups one after another "
          "(zeros when unset).");
ABSL_FLAG(std::string, grads, "",
          "File of the groups' gradients, laid out as --values (zeros when unset).");
ABSL_FLAG(double, lr, 1e-3, "Each group's lr for every step (GroupStep::lr).");

namespace {

struct Wire {
  optstate::WireType type;
  uint64_t next_step = 1;
  std::vector<std::string> names;
  std::vector<std::vector<float>> params;  // Each wire's own params_out, as each model's own.
};

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "optstate-client-step: %s\n", status.ToString().c_str());
  return 1;
}

// Fills `out` (sizes given) from `path`, in order; false when it is short.
bool ReadFloats(const std::string& path, std::vector<std::vector<float>>* out) {
  if (path.empty()) return true;
  std::ifstream in(path, std::ios::binary);
  for (std::vector<float>& v : *out) {
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
    if (!in) return false;
  }
  return true;
}

double CpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
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
  std::vector<std::vector<float>> grads(sizes.size()), initial(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    grads[i].resize(sizes[i]);
    initial[i].resize(sizes[i]);
  }
  if (!ReadFloats(absl::GetFlag(FLAGS_values), &initial) ||
      !ReadFloats(absl::GetFlag(FLAGS_grads), &grads)) {
    std::fprintf(stderr, "optstate-client-step: --values or --grads is shorter than --sizes\n");
    return 2;
  }
  Wire wires[2];
  wires[0].type = optstate::WireType::kFloat32;
  wires[1].type = optstate::WireType::kBFloat16;
  for (int w = 0; w < 2; ++w) {
    wires[w].params = initial;
    for (size_t i = 0; i < sizes.size(); ++i) {
      wires[w].names.push_back(
          absl::StrCat(absl::GetFlag(FLAGS_prefix), w == 0 ? "fp32/" : "bf16/", i));
      absl::StatusOr<optstate::GroupInfo> info =
          (*client)->RegisterGroup(wires[w].names.back(), initial[i]);
      if (!info.ok()) return Fail(info.status());
      wires[w].next_step = info->min_step + 1;
    }
  }
  initial.clear();
  initial.shrink_to_fit();
  std::printf("ready\n");
  std::fflush(stdout);
  const double lr = absl::GetFlag(FLAGS_lr);
  std::string line;
  while (std::getline(std::cin, line)) {
    Wire* wire = line == "fp32" ? &wires[0] : line == "bf16" ? &wires[1] : nullptr;
    if (wire == nullptr) {
      std::fprintf(stderr, "optstate-client-step: expected fp32 or bf16, got '%s'\n", line.c_str());
      return 2;
    }
    const double cpu_start = CpuSeconds();
    const auto start = std::chrono::steady_clock::now();
    std::vector<optstate::GroupStep> steps;
    steps.reserve(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      steps.push_back({wire->names[i], grads[i], absl::MakeSpan(wire->params[i]), lr});
    }
    optstate::StepOptions options;
    options.gradient_dtype = options.param_dtype = wire->type;
    absl::Status status = (*client)->Step(steps, wire->next_step++, options);
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    const double cpu = CpuSeconds() - cpu_start;
    if (!status.ok()) return Fail(status);
    std::printf("%.9f %.9f\n", elapsed.count(), cpu);
    std::fflush(stdout);
  }
  return 0;
}
