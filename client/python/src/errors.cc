// Status -> optstate.errors.from_status(code, message, target), raised.
#include "errors.h"

#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

namespace nb = nanobind;

namespace optstate::python {

void RaiseStatus(const absl::Status& status, const std::string& target) {
  nb::object error = nb::module_::import_("optstate.errors")
                         .attr("from_status")(static_cast<int>(status.code()),
                                              std::string(status.message()), target);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw nb::python_error();
}

}  // namespace optstate::python
