// torch.optim.AdamW's hyperparameters, the one server-side type for them: a
// group's registration holds it, the kernel's step inputs carry it.
#ifndef OPTSTATE_SERVER_KERNELS_ADAMW_HYPERPARAMETERS_H_
#define OPTSTATE_SERVER_KERNELS_ADAMW_HYPERPARAMETERS_H_

namespace optstate {

// Defaults are torch's. Doubles, as torch holds them (Python floats): torch
// derives its per-step scalars from them in double precision.
struct AdamWHyperparameters {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool maximize = false;  // Step along the gradient: torch's `grad = -grad`.
  // The denominator takes max(max_exp_avg_sq, exp_avg_sq), kept per element.
  bool amsgrad = false;

  bool operator==(const AdamWHyperparameters& o) const {
    return lr == o.lr && beta1 == o.beta1 && beta2 == o.beta2 && eps == o.eps &&
           weight_decay == o.weight_decay && maximize == o.maximize && amsgrad == o.amsgrad;
  }
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_KERNELS_ADAMW_HYPERPARAMETERS_H_
