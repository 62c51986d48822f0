"""optstate: AdamW optimizer state held by an optstated daemon.

``optstate.Client`` wraps the C++ client (chunking, retries, exactly-once
steps); ``optstate.torch.RemoteAdamW`` is a ``torch.optim.Optimizer`` on top
of it. Errors are :class:`optstate.Error` subclasses, one per gRPC code.
"""
from . import errors
from ._optstate import Client, GroupInfo, GroupState, WireType
from .errors import *  # noqa: F401,F403  (the exception classes)
from .errors import Error

# Spelled out, not computed, so type checkers see the re-exports.
__all__ = [
    "Client", "GroupInfo", "GroupState", "WireType", "Error", "errors", "Cancelled", "Unknown",
    "InvalidArgument", "DeadlineExceeded", "NotFound", "AlreadyExists", "PermissionDenied",
    "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange", "Unimplemented",
    "Internal", "Unavailable", "DataLoss", "Unauthenticated",
]
__version__ = "0.1.0"
