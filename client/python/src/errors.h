// A failed absl::Status raised as the optstate.Error subclass of its code
// (optstate/errors.py), carrying the code, the daemon's message and the target.
#ifndef OPTSTATE_PYTHON_ERRORS_H_
#define OPTSTATE_PYTHON_ERRORS_H_

#include <nanobind/nanobind.h>

#include <string>

#include "absl/status/status.h"

namespace optstate::python {

// Sets the Python error for `status` (not OK) and throws nanobind::python_error;
// its `target` is None when `target` is empty (refused before any daemon was
// named).
// A Python exception already set (SignalArrived's KeyboardInterrupt) is
// raised instead. Call with the GIL held.
[[noreturn]] void RaiseStatus(const absl::Status& status, const std::string& target);

// ClientOptions::interrupted of the Python Client: on Python's main thread,
// takes the GIL and runs Python's signal handlers (PyErr_CheckSignals); true
// when one raised (Ctrl-C's KeyboardInterrupt), whose exception stays set for
// RaiseStatus. On any other thread (Python runs no handlers there) false at
// once, without the GIL: a thread that takes the GIL while the interpreter
// finalizes is ended by CPython, an unwinding through C++ that aborts.
bool SignalArrived();

// Notes which thread is Python's main one (threading.main_thread()), for
// SignalArrived. Call once, with the GIL, at the module's import.
void RememberMainThread();

// RaiseStatus when `status` is not OK, or when a Python exception is pending
// though it is (a Ctrl-C seen while a call of several daemons waited, after
// which every member's call still ended OK: returning with it set would be
// Python's SystemError). Call with the GIL held.
inline void ThrowIfError(const absl::Status& status, const std::string& target) {
  if (!status.ok() || PyErr_Occurred() != nullptr) RaiseStatus(status, target);
}

}  // namespace optstate::python

#endif  // OPTSTATE_PYTHON_ERRORS_H_
