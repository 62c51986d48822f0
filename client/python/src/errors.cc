// Status -> optstate.errors.from_status(code, message, target), raised.
#include "errors.h"

#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <atomic>
#include <optional>

#include "absl/strings/cord.h"
#include "absl/strings/str_split.h"
#include "optstate/client.h"

namespace nb = nanobind;

namespace optstate::python {

namespace {
std::atomic<unsigned long> main_thread{0};  // PyThread_get_thread_ident() of Python's main one.
}  // namespace

void RememberMainThread() {
  main_thread.store(nb::cast<unsigned long>(
      nb::module_::import_("threading").attr("main_thread")().attr("ident")));
}

bool SignalArrived() {
  if (PyThread_get_thread_ident() != main_thread.load()) return false;
  nb::gil_scoped_acquire acquire;
  return PyErr_CheckSignals() != 0;
}

void RaiseStatus(const absl::Status& status, const std::string& target) {
  if (PyErr_Occurred() != nullptr) throw nb::python_error();
  nb::object error =
      nb::module_::import_("optstate.errors")
          .attr("from_status")(static_cast<int>(status.code()), std::string(status.message()),
                               target.empty() ? nb::none() : nb::object(nb::str(target.c_str())));
  // A step of several daemons that failed for some: the groups that did not step.
  if (absl::optional<absl::Cord> payload = status.GetPayload(Client::kNotSteppedPayload)) {
    nb::list names;
    for (absl::string_view name : absl::StrSplit(std::string(*payload), '\n')) {
      names.append(nb::str(name.data(), name.size()));
    }
    nb::setattr(error, "not_stepped", names);
  }
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw nb::python_error();
}

}  // namespace optstate::python
