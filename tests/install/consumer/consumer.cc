// Steps a group through optstated with the installed client and checks the
// parameters against AdamW computed here in double. Usage: consumer TARGET.
// Exits 0 when they match.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "optstate/client.h"

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: consumer host:port\n"), 2;
  auto client = optstate::Client::Connect(argv[1]);
  if (!client.ok()) return std::fprintf(stderr, "%s\n", client.status().ToString().c_str()), 1;
  const std::string name = "consumer." + std::to_string(std::random_device()());
  std::vector<float> params(4, 0.5f), grad = {1.0f, -2.0f, 0.25f, 4.0f};
  optstate::Hyperparameters h;  // torch's defaults.
  if (auto info = (*client)->RegisterGroup(name, params, h); !info.ok()) {
    return std::fprintf(stderr, "%s\n", info.status().ToString().c_str()), 1;
  }
  std::vector<double> p(4, 0.5), m(4, 0.0), v(4, 0.0);
  constexpr int kSteps = 3;
  for (int t = 1; t <= kSteps; ++t) {
    if (absl::Status s = (*client)->Step(name, t, grad, absl::MakeSpan(params)); !s.ok()) {
      return std::fprintf(stderr, "step %d: %s\n", t, s.ToString().c_str()), 1;
    }
    for (int i = 0; i < 4; ++i) {
      p[i] *= 1 - h.lr * h.weight_decay;
      m[i] = h.beta1 * m[i] + (1 - h.beta1) * grad[i];
      v[i] = h.beta2 * v[i] + (1 - h.beta2) * grad[i] * grad[i];
      const double m_hat = m[i] / (1 - std::pow(h.beta1, t));
      const double v_hat = v[i] / (1 - std::pow(h.beta2, t));
      p[i] -= h.lr * m_hat / (std::sqrt(v_hat) + h.eps);
    }
  }
  auto info = (*client)->DescribeGroup(name);
  (*client)->DeleteGroup(name).IgnoreError();
  if (!info.ok() || info->min_step != kSteps) {
    return std::fprintf(stderr, "DescribeGroup: %s\n", info.status().ToString().c_str()), 1;
  }
  for (int i = 0; i < 4; ++i) {
    if (std::abs(params[i] - p[i]) > 1e-6) {
      return std::fprintf(stderr, "params[%d] = %.9g, AdamW gives %.9g\n", i, params[i], p[i]), 1;
    }
  }
  std::printf("%s: %d steps through %s, params %.6f %.6f %.6f %.6f as AdamW gives\n", argv[0],
              kSteps, argv[1], params[0], params[1], params[2], params[3]);
  return 0;
}
