// A small model trained through the remote optimizer: linear regression
// y = X w + b on synthetic data, with w and b held and stepped by optstated.
// Exits non-zero unless the loss falls at least 100-fold.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "optstate/client.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "optstated address");
ABSL_FLAG(int, steps, 300, "optimizer steps");
ABSL_FLAG(int, features, 64, "input features");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int d = absl::GetFlag(FLAGS_features);
  const int n = 512;
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> true_w(d), x(static_cast<size_t>(n) * d), y(n);
  for (float& w : true_w) w = normal(rng);
  for (int i = 0; i < n; ++i) {
    float sum = 0.5f;  // True bias.
    for (int j = 0; j < d; ++j) sum += (x[i * d + j] = normal(rng)) * true_w[j];
    y[i] = sum + 0.01f * normal(rng);
  }

  auto client = optstate::Client::Connect(absl::GetFlag(FLAGS_target));
  if (!client.ok()) return std::fprintf(stderr, "%s\n", client.status().ToString().c_str()), 1;
  optstate::Hyperparameters h;
  h.lr = 0.05;
  h.weight_decay = 0.0;
  std::vector<float> w(d, 0.0f), b(1, 0.0f);
  // Unique names per run so a rerun against the same daemon starts fresh.
  const std::string tag = std::to_string(std::random_device()());
  const std::string w_name = "linreg." + tag + ".weight", b_name = "linreg." + tag + ".bias";
  for (auto [name, values] : {std::pair{w_name, &w}, std::pair{b_name, &b}}) {
    auto info = (*client)->RegisterGroup(name, *values, h);
    if (!info.ok()) return std::fprintf(stderr, "%s\n", info.status().ToString().c_str()), 1;
  }

  double first_loss = 0, loss = 0;
  std::vector<float> grad_w(d), grad_b(1);
  for (int step = 1; step <= absl::GetFlag(FLAGS_steps); ++step) {
    std::fill(grad_w.begin(), grad_w.end(), 0.0f);
    grad_b[0] = 0;
    loss = 0;
    for (int i = 0; i < n; ++i) {
      float pred = b[0];
      for (int j = 0; j < d; ++j) pred += x[i * d + j] * w[j];
      const float err = pred - y[i];
      loss += 0.5 * err * err / n;
      for (int j = 0; j < d; ++j) grad_w[j] += err * x[i * d + j] / n;
      grad_b[0] += err / n;
    }
    if (step == 1) first_loss = loss;
    if (step == 1 || step % 50 == 0) std::printf("step %4d  loss %.6f\n", step, loss);
    std::vector<optstate::GroupStep> groups = {{w_name, grad_w, absl::MakeSpan(w)},
                                               {b_name, grad_b, absl::MakeSpan(b)}};
    absl::Status s = (*client)->Step(groups, step);
    if (!s.ok()) return std::fprintf(stderr, "step %d: %s\n", step, s.ToString().c_str()), 1;
  }
  (*client)->DeleteGroup(w_name).IgnoreError();
  (*client)->DeleteGroup(b_name).IgnoreError();
  std::printf("loss %.6f -> %.6f (%.0fx lower)\n", first_loss, loss, first_loss / loss);
  return loss * 100 < first_loss ? 0 : 1;
}
