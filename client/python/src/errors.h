// A failed absl::Status raised as the optstate.Error subclass of its code
// (optstate/errors.py), carrying the code, the daemon's message and the target.
#ifndef OPTSTATE_PYTHON_ERRORS_H_
#define OPTSTATE_PYTHON_ERRORS_H_

#include <string>

#include "absl/status/status.h"

namespace optstate::python {

// Sets the Python error for `status` (not OK) and throws nanobind::python_error.
// A Python exception already set (SignalArrived's KeyboardInterrupt) is
// raised instead. Call with the GIL held.
[[noreturn]] void RaiseStatus(const absl::Status& status, const std::string& target);

// ClientOptions::interrupted of the Python Client: takes the GIL and runs
// Python's signal handlers (PyErr_CheckSignals); true when one raised (Ctrl-C's
// KeyboardInterrupt), whose exception stays set for RaiseStatus. On any
// thread but the main one Python runs no handlers: false.
bool SignalArrived();

// RaiseStatus when `status` is not OK.
inline void ThrowIfError(const absl::Status& status, const std::string& target) {
  if (!status.ok()) RaiseStatus(status, target);
}

}  // namespace optstate::python

#endif  // OPTSTATE_PYTHON_ERRORS_H_
