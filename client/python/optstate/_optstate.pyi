"""
Bindings of the optstate C++ client; use the optstate package, not this module.
"""

# Type hints of the extension (written from `python -m nanobind.stubgen -m
# optstate._optstate`, buffer types made precise; tests/python/test_stub.py
# checks that it names exactly what the extension defines).
from collections.abc import Sequence
from typing import Any, Union

import numpy
from numpy.typing import NDArray

# A numpy array or a torch CPU tensor: C-contiguous float32, bfloat16 or float16.
Buffer = Union[NDArray[Any], "torch.Tensor"]  # noqa: F821
# A gradient and optionally where its params go and the group's own lr, for one
# group of a step.
GroupBuffers = Union[tuple[str, Buffer], tuple[str, Buffer, Buffer | None],
                     tuple[str, Buffer, Buffer | None, float | None]]


class GroupInfo:
    """
    A group as the daemon describes it: size, hyperparameters, page size and the steps its pages have reached.
    """

    @property
    def name(self) -> str: ...

    @property
    def num_elements(self) -> int: ...

    @property
    def lr(self) -> float: ...

    @property
    def betas(self) -> tuple[float, float]: ...

    @property
    def eps(self) -> float: ...

    @property
    def weight_decay(self) -> float: ...

    @property
    def page_elements(self) -> int:
        """Chunks start on multiples of this."""

    @property
    def min_step(self) -> int:
        """Every page has reached at least this step."""

    @property
    def max_step(self) -> int:
        """The highest step any page has reached."""

    @property
    def created(self) -> bool:
        """From register(): False when an equal group already existed."""

    def __repr__(self) -> str: ...

class Client:
    """
    A connection to one optstated daemon. Thread-safe; every call releases the GIL while it
    waits for the network. Errors raise optstate.Error subclasses (optstate.NotFound, ...)
    carrying the gRPC code, the daemon's message and the target.
    """

    def __init__(self, target: str, *, max_attempts: int = 5, initial_backoff: float = 0.05, max_backoff: float = 2.0, attempt_timeout: float = 300.0, max_message_bytes: int = 67108864, chunk_bytes: int = 1048576, max_chunks_in_flight: int = 8, data_plane: str = 'auto') -> None:
        """
        Creates a channel to `target` ("host:port"); does not wait for the daemon.

        Transient failures (UNAVAILABLE, broken streams, deadlines) are retried up to
        `max_attempts` times with backoff doubling from `initial_backoff` to `max_backoff`
        seconds; `attempt_timeout` (seconds, float('inf') for none) bounds one attempt.
        `chunk_bytes` is the gradient bytes per Step message, `max_chunks_in_flight` the
        messages sent ahead of their replies. `data_plane`: 'auto' (the default: shared memory
        with a daemon on this host that offers it, else the wire), 'wire', or
        'shared_memory' (FailedPrecondition when it cannot be had). InvalidArgument for
        bad options.
        """

    @property
    def target(self) -> str:
        """The daemon's address."""

    def register(self, name: str, initial_values: Buffer | int, *, lr: float = 0.001, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-08, weight_decay: float = 0.01) -> GroupInfo:
        """
        Registers group `name` with torch.optim.AdamW's hyperparameters.

        `initial_values` is a float32 array (any shape; its elements in order) or an
        element count (params start at zero). Idempotent: an equal existing group is
        returned with created=False and its trained pages are never rewound.
        AlreadyExists when a group of that name differs in size or hyperparameters.
        """

    def describe(self, name: str) -> GroupInfo:
        """The group's GroupInfo; NotFound when there is none."""

    def list_groups(self) -> list[GroupInfo]:
        """Every group of this tenant, as GroupInfo."""

    def delete(self, name: str) -> None:
        """
        Deletes the group and frees its memory. Made once, never retried (after a lost
        reply a retry could not tell 'deleted now' from NotFound); NotFound when absent.
        """

    def __repr__(self) -> str: ...

    def step(self, groups: str | Sequence[GroupBuffers], step: int, gradient: Buffer | None = None, params_out: Buffer | None = None, *, lr: float | None = None, grad_scale: float | None = None, wire_dtype: str | Any | None = None) -> None:
        """
        Applies step `step` (1, 2, ...) to one group or to many in one stream.

        `groups` is a group name (then give `gradient` and optionally `params_out`) or a list
        of tuples (name, gradient[, params_out]). Buffers are numpy arrays or torch CPU
        tensors, C-contiguous float32, bfloat16 or float16, read and written in place (a
        tensor that requires grad: pass .detach()). float32 buffers travel as `wire_dtype`
        (float32 unless set to 'bfloat16' or 'float16'); 16-bit buffers travel as they are.
        `lr` overrides the groups' lr for this step, `grad_scale` multiplies every gradient.

        Nothing is sent when a buffer is of the wrong kind or on another device than the CPU
        (TypeError/ValueError naming its group and buffer)
        or a gradient is not finite or has the wrong length (InvalidArgument). Transient
        failures resend what got no reply; the daemon applies every page exactly once, so
        repeating a step replays it (nothing applied twice, current params returned).
        """

    def stats(self) -> dict[str, Any]:
        """
        The daemon's counters as a dict (optstate::Stats' fields): backend, num_groups,
        total_elements, host_bytes, max_host_bytes, chunks_applied, chunks_replayed,
        bytes_received, bytes_sent, paging, device, threads, cpu_kernel (the CPU kernel's
        path: avx512, avx2 or scalar), groups: one dict per group
        (info, steps_completed, chunks_applied, chunks_replayed, latencies, ...); durability:
        last_checkpoint (a dict of id, step, bytes, duration_seconds, finished_unix_micros, or
        None), checkpoints_written, checkpoint_failures, last_checkpoint_error,
        restored_checkpoint_id, restore_refusals; regions (the daemon's shared-memory
        regions: sessions, regions, registered_bytes, mapped_bytes, registrations); and heap
        (the daemon's malloc heap: in_use_bytes, free_bytes, resident_bytes, trims).
        """

    def allocate_shared_buffer(self, nbytes: int) -> NDArray[numpy.uint8]:
        """
        Memory shared with the daemon (the same-host data plane), as a writable numpy
        uint8 array of `nbytes` rounded up to 4096, zeroed and 4096-byte aligned.

        A step whose gradients and params lie in such buffers, in the wire dtype (float32
        views for float32, bfloat16 views with wire_dtype='bfloat16'), copies nothing: the
        daemon reads the gradients and writes the params where they are, and a step wholly
        in buffers goes as one message the daemon checks before applying any of it. Views
        (numpy's .view(np.float32)[a:b], torch.from_numpy(array).view(torch.float32)) work
        the same; anything else steps as before, copied through the client's own region.
        Do not change a gradient or read its params while a step using them runs. The
        buffer is unmapped when the array and every view of it are gone; the daemon forgets
        it at this client's next step. FailedPrecondition on a data_plane='wire' client or
        without a usable region socket; ResourceExhausted past the daemon's region limits.
        """

    def export_state(self, name: str) -> GroupState:
        """
        Reads group `name`'s whole state (GroupState). Each page is read under its lock with
        its step; pages stepped meanwhile may be at different steps. NotFound when absent.
        """

    def import_state(self, name: str, params: Buffer, exp_avg: Buffer, exp_avg_sq: Buffer, page_steps: Sequence[int], *, lr: float = 0.001, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-08, weight_decay: float = 0.01) -> None:
        """
        Creates group `name` with this state, or replaces the whole state of an existing
        group of the same size and hyperparameters (AlreadyExists when it differs).
        `params`, `exp_avg`, `exp_avg_sq` are float32 arrays of one length; `page_steps`
        one step per daemon page, or exactly one for every page (torch's 'step'); steps are
        >= 1. Nothing is visible to Step until all of it arrived and passed the daemon's
        checks (InvalidArgument for non-finite values or a negative exp_avg_sq).
        """

    def checkpoint(self, groups: Sequence[str] | None = None, *, wait_for_step: int | None = None) -> dict[str, Any]:
        """
        Asks the daemon (started with --state_dir) for a durable checkpoint of every group
        and returns {'id', 'step', 'bytes'} once it is on disk (docs/durability.md). With
        `wait_for_step` s it first waits until every page of `groups` (names; None: all) is
        at s: FailedPrecondition, naming the step held, when a page is past s (nothing
        written); DeadlineExceeded when s is not reached within the client's
        attempt_timeout; NotFound for an unknown group; FailedPrecondition without
        --state_dir. Made once, never retried.
        """

class GroupState:
    """
    A group's whole optimizer state as the daemon holds it (float32
    numpy arrays, flat; page_steps one per page of page_elements).
    """

    @property
    def name(self) -> str: ...

    @property
    def lr(self) -> float: ...

    @property
    def betas(self) -> tuple[float, float]: ...

    @property
    def eps(self) -> float: ...

    @property
    def weight_decay(self) -> float: ...

    @property
    def page_elements(self) -> int: ...

    @property
    def params(self) -> NDArray[numpy.float32]:
        """The fp32 master weights."""

    @property
    def exp_avg(self) -> NDArray[numpy.float32]: ...

    @property
    def exp_avg_sq(self) -> NDArray[numpy.float32]: ...

    @property
    def page_steps(self) -> NDArray[numpy.uint64]:
        """The step each page has reached (all equal unless a step is under way)."""
