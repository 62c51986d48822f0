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


class Cancelled(Error):
    """The call was cancelled."""

    code_value = 1
    code = "CANCELLED"


class Unknown(Error):
    """An error without a more specific code."""

    code_value = 2
    code = "UNKNOWN"


class InvalidArgument(Error, ValueError):
    """The request was refused as given (a non-finite gradient, a wrong length, bad
    hyperparameters); nothing was applied. Also a ``ValueError``: what Python code
    catches for a value refused."""

    code_value = 3
    code = "INVALID_ARGUMENT"


class DeadlineExceeded(Error):
    """An attempt ran past its deadline (after retries)."""

    code_value = 4
    code = "DEADLINE_EXCEEDED"


class NotFound(Error):
    """No group of that name."""

    code_value = 5
    code = "NOT_FOUND"


class AlreadyExists(Error):
    """A group of that name exists with another size or other hyperparameters."""

    code_value = 6
    code = "ALREADY_EXISTS"


class PermissionDenied(Error):
    """The caller may not do this."""

    code_value = 7
    code = "PERMISSION_DENIED"


class ResourceExhausted(Error):
    """The daemon's memory budget (or a message limit) does not allow it."""

    code_value = 8
    code = "RESOURCE_EXHAUSTED"


class FailedPrecondition(Error):
    """The group is not in a state that allows it (a step out of order, values still
    missing)."""

    code_value = 9
    code = "FAILED_PRECONDITION"


class Aborted(Error):
    """The call was aborted (after retries)."""

    code_value = 10
    code = "ABORTED"


class OutOfRange(Error):
    """A value is out of range."""

    code_value = 11
    code = "OUT_OF_RANGE"


class Unimplemented(Error):
    """The daemon does not implement this call."""

    code_value = 12
    code = "UNIMPLEMENTED"


class Internal(Error):
    """An internal error in the daemon."""

    code_value = 13
    code = "INTERNAL"


class Unavailable(Error):
    """The daemon could not be reached (after the client's retries)."""

    code_value = 14
    code = "UNAVAILABLE"


class DataLoss(Error):
    """The group's state may be damaged (a backend failed mid-update); delete it."""

    code_value = 15
    code = "DATA_LOSS"


class Unauthenticated(Error):
    """The caller is not authenticated."""

    code_value = 16
    code = "UNAUTHENTICATED"


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


# Spelled out, not computed, so type checkers see what `from .errors import *` brings.
__all__ = [
    "Error", "from_status", "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded",
    "NotFound", "AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
    "Aborted", "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss",
    "Unauthenticated",
]
