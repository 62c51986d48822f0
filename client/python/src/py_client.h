// The Python-facing optstate.Client: one C++ optstate::Client and the target
// it was made for (named in every error), shared by the binding files.
#ifndef OPTSTATE_PYTHON_PY_CLIENT_H_
#define OPTSTATE_PYTHON_PY_CLIENT_H_

#include <nanobind/nanobind.h>

#include <memory>
#include <string>

#include "optstate/client.h"

namespace optstate::python {

// close() drops `client`; a call in flight holds its own reference (taken
// with the GIL, before the GIL is released), so the C++ client and its
// channel go when the last call using them returns.
struct PyClient {
  std::string target;
  std::shared_ptr<Client> client;

  // The client, for one call; ValueError once closed. Needs the GIL.
  std::shared_ptr<Client> live() const {
    if (client == nullptr) {
      throw nanobind::value_error(
          ("optstate.Client('" + target + "') is closed; make a new Client").c_str());
    }
    return client;
  }
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
