// A GroupInfo's lease and last step as Python dicts (None when unset), for
// GroupInfo's properties and the dicts of list_groups() and describe().
#ifndef OPTSTATE_CLIENT_PYTHON_SRC_LEASE_OBJECTS_H_
#define OPTSTATE_CLIENT_PYTHON_SRC_LEASE_OBJECTS_H_

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "optstate/group_info.h"

namespace optstate::python {

// {"holder", "job", "host", "pid", "last_call_unix_micros",
// "expires_unix_micros", "expired"}, or None.
inline nanobind::object LeaseObject(const GroupInfo& g) {
  if (!g.lease.has_value()) return nanobind::none();
  const Lease& l = *g.lease;
  nanobind::dict d;
  d["holder"] = l.holder;
  d["job"] = l.job;
  d["host"] = l.host;
  d["pid"] = l.pid;
  d["last_call_unix_micros"] = l.last_call_unix_micros;
  d["expires_unix_micros"] = l.expires_unix_micros;
  d["expired"] = l.expired;
  return d;
}

// {"step", "lr", "betas", "eps", "weight_decay", "maximize"}, or None.
inline nanobind::object LastStepObject(const GroupInfo& g) {
  if (!g.last_step.has_value()) return nanobind::none();
  const LastStep& l = *g.last_step;
  nanobind::dict d;
  d["step"] = l.step;
  d["lr"] = l.lr;
  d["betas"] = nanobind::make_tuple(l.beta1, l.beta2);
  d["eps"] = l.eps;
  d["weight_decay"] = l.weight_decay;
  d["maximize"] = l.maximize;
  return d;
}

}  // namespace optstate::python

#endif  // OPTSTATE_CLIENT_PYTHON_SRC_LEASE_OBJECTS_H_
