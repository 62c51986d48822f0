// AdamW's hyperparameters in Python's terms: the keywords of register() and
// import_state() (betas a pair), and the same six read-only properties of
// GroupInfo and GroupState. The defaults are optstate::Hyperparameters'
// (optstate/group_info.h), never written here.
#ifndef OPTSTATE_PYTHON_HYPERPARAMETERS_H_
#define OPTSTATE_PYTHON_HYPERPARAMETERS_H_

#include <nanobind/nanobind.h>
#include <nanobind/stl/tuple.h>

#include <tuple>

#include "optstate/group_info.h"

namespace optstate::python {

// The keywords' defaults.
inline const Hyperparameters kDefaultHyperparameters{};

inline std::tuple<double, double> Betas(const Hyperparameters& h) { return {h.beta1, h.beta2}; }

inline Hyperparameters MakeHyperparameters(double lr, std::tuple<double, double> betas, double eps,
                                           double weight_decay, bool maximize, bool amsgrad) {
  return {lr, std::get<0>(betas), std::get<1>(betas), eps, weight_decay, maximize, amsgrad};
}

// lr, betas, eps, weight_decay, maximize and amsgrad of a class whose `hyperparameters` member holds them.
template <typename T>
void DefHyperparameterProperties(nanobind::class_<T>& cls) {
  cls.def_prop_ro("lr", [](const T& t) { return t.hyperparameters.lr; })
      .def_prop_ro("betas", [](const T& t) { return Betas(t.hyperparameters); })
      .def_prop_ro("eps", [](const T& t) { return t.hyperparameters.eps; })
      .def_prop_ro("weight_decay", [](const T& t) { return t.hyperparameters.weight_decay; })
      .def_prop_ro("maximize", [](const T& t) { return t.hyperparameters.maximize; })
      .def_prop_ro("amsgrad", [](const T& t) { return t.hyperparameters.amsgrad; });
}

}  // namespace optstate::python

#endif  // OPTSTATE_PYTHON_HYPERPARAMETERS_H_
