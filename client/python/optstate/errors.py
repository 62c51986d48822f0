"""optstate's exceptions: one subclass of :class:`Error` per gRPC status code.

Every failed call raises the subclass of its code, carrying the code, the
daemon's (or the client's) message and the target it was talking to.
"""
from __future__ import annotations

# absl::StatusCode / grpc::StatusCode values.
_CODES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class Error(Exception):
    """A failed optstate call.

    Attributes:
        code: the gRPC status code's name, e.g. ``"NOT_FOUND"``.
        code_value: its number (``grpc.StatusCode`` / ``absl::StatusCode``).
        message: the daemon's message (or the client's, for refusals made before sending).
        target: the daemon's address (``"host:port"``), or ``None``.
    """

    code_value = 2
    code = "UNKNOWN"

    def __init__(self, message: str, target: str | None = None, code_value: int | None = None):
        if code_value is not None:
            self.code_value = code_value
            self.code = _CODES.get(code_value, str(code_value))
        self.message = message
        self.target = target
        where = f"optstated at {target}: " if target else ""
        super().__init__(f"{self.code}: {where}{message}")


def _subclass(name: str, value: int, doc: str) -> type:
    cls = type(name, (Error,), {"code_value": value, "code": _CODES[value], "__doc__": doc})
    cls.__module__ = __name__
    return cls


Cancelled = _subclass("Cancelled", 1, "The call was cancelled.")
Unknown = _subclass("Unknown", 2, "An error without a more specific code.")
InvalidArgument = _subclass(
    "InvalidArgument", 3,
    "The request was refused as given (a non-finite gradient, a wrong length, bad "
    "hyperparameters); nothing was applied.")
DeadlineExceeded = _subclass("DeadlineExceeded", 4, "An attempt ran past its deadline (after retries).")
NotFound = _subclass("NotFound", 5, "No group of that name.")
AlreadyExists = _subclass(
    "AlreadyExists", 6, "A group of that name exists with another size or other hyperparameters.")
PermissionDenied = _subclass("PermissionDenied", 7, "The caller may not do this.")
ResourceExhausted = _subclass(
    "ResourceExhausted", 8, "The daemon's memory budget (or a message limit) does not allow it.")
FailedPrecondition = _subclass(
    "FailedPrecondition", 9,
    "The group is not in a state that allows it (a step out of order, values still missing).")
Aborted = _subclass("Aborted", 10, "The call was aborted (after retries).")
OutOfRange = _subclass("OutOfRange", 11, "A value is out of range.")
Unimplemented = _subclass("Unimplemented", 12, "The daemon does not implement this call.")
Internal = _subclass("Internal", 13, "An internal error in the daemon.")
Unavailable = _subclass(
    "Unavailable", 14, "The daemon could not be reached (after the client's retries).")
DataLoss = _subclass(
    "DataLoss", 15, "The group's state may be damaged (a backend failed mid-update); delete it.")
Unauthenticated = _subclass("Unauthenticated", 16, "The caller is not authenticated.")

_BY_CODE = {cls.code_value: cls for cls in (
    Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
    PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
    Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)}


def from_status(code_value: int, message: str, target: str | None = None) -> Error:
    """The exception for a status code (called by the extension)."""
    cls = _BY_CODE.get(code_value, Error)
    if cls is Error:
        return Error(message, target, code_value)
    return cls(message, target)


__all__ = ["Error", "from_status"] + [cls.__name__ for cls in _BY_CODE.values()]
