// The Python-facing optstate.Client: one C++ optstate::Client and the target
// it was made for (named in every error), shared by the binding files.
#ifndef OPTSTATE_PYTHON_PY_CLIENT_H_
#define OPTSTATE_PYTHON_PY_CLIENT_H_

#include <nanobind/nanobind.h>

#include <memory>
#include <string>

#include "optstate/client.h"

namespace optstate::python {

struct PyClient {
  std::string target;
  std::unique_ptr<Client> client;
};

// Client.step and Client.stats (api_binding.cc): the calls whose C++
// signatures change with the client's buffer and stats types.
void BindStepAndStats(nanobind::class_<PyClient>& cls);
// Client.allocate_shared_buffer (shared_buffer_binding.cc).
void BindSharedBuffer(nanobind::class_<PyClient>& cls);
// Client.export_state / import_state and the GroupState class (state_binding.cc).
void BindState(nanobind::module_& m, nanobind::class_<PyClient>& cls);

}  // namespace optstate::python

#endif  // OPTSTATE_PYTHON_PY_CLIENT_H_
