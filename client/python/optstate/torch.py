"""optstate.torch.RemoteAdamW: torch.optim.AdamW with its state on an optstated daemon.

Each parameter is one daemon group (fp32 master weights, exp_avg, exp_avg_sq
and the step count live there); ``step()`` sends the gradients and writes
the updated values into the parameters in place. The update is
torch.optim.AdamW's default CPU step, op for op (docs/exactness.md).
"""
from __future__ import annotations

import bisect
import collections.abc
import hashlib
import math
import os
import time
import warnings
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from . import errors
from ._jobs import (RESUME_MODES, Attached, check_resume, group_name_of, job_name,
                    new_holder_id, note_holder, strip_wrappers, takeover_for,
                    torn_step_to_finish)
from ._optstate import Client, _prepare_param_step, _PreparedStep, _StepPlan
from ._remote_state import RemoteState
from ._staging import Staging
from ._step_hooks import eager_only, hooked_step, without_grad
from ._torch_args import check_client_options, check_hyperparameters, check_options

__all__ = ["RemoteAdamW", "MASTER_PARAM"]

_SIXTEEN_BIT = (torch.bfloat16, torch.float16)
_STAGING_MODES = ("auto", "always")
_WIRE_NAMES = {torch.float32: None, torch.bfloat16: "bfloat16", torch.float16: "float16"}
_WIRE_DTYPES = {name: dtype for dtype, name in _WIRE_NAMES.items() if name is not None}
# The state dict entry of a parameter's float32 master weights (RemoteAdamW.state_dict).
MASTER_PARAM = "master_param"


class _PlanSource(dict):
    """A dict step()'s plan was read from (prepared_step.h): every change clears the plan,
    and the next step reads it anew."""

    __slots__ = ("_plan",)

    def __init__(self, plan: _StepPlan):
        super().__init__()
        self._plan = plan

    def __setitem__(self, key, value):
        self._plan.clear()
        super().__setitem__(key, value)

    def __delitem__(self, key):
        self._plan.clear()
        super().__delitem__(key)

    def pop(self, *args):
        self._plan.clear()
        return super().pop(*args)

    def popitem(self):
        self._plan.clear()
        return super().popitem()

    def setdefault(self, *args):
        self._plan.clear()
        return super().setdefault(*args)

    def update(self, *args, **kwargs):
        self._plan.clear()
        super().update(*args, **kwargs)

    def clear(self):
        self._plan.clear()
        super().clear()


@dataclass(eq=False)
class _Registration:
    """What this optimizer registered for one parameter, and what its steps reuse. All but
    `step`, `created`, `version` and `pointer` are fixed once made (step()'s plan reads them once:
    prepared_step.h); a change is a new _Registration."""

    param: torch.Tensor
    name: str
    shape: torch.Size
    # (lr, (beta1, beta2), eps, weight_decay, maximize, amsgrad) as registered; each step
    # sends those of its param group that differ (all but amsgrad may change).
    hyperparameters: tuple
    step: int  # The step the daemon's pages have reached (as far as this rank knows).
    # How its gradient and values travel: None for float32, else "bfloat16" / "float16".
    wire: Optional[str]
    dtype: torch.dtype  # The parameter's, at registration.
    created: bool = False  # Whether this optimizer's registration created the daemon's group.
    # The parameter's version counter (Tensor._version), data_ptr() and strides when its
    # values were last the daemon's: a step that finds one moved imports its values first
    # (RemoteAdamW._adopt_values). The daemon's writes of new values bump neither.
    version: int = 0
    pointer: int = 0
    strides: tuple = ()  # p.stride() then: the same memory viewed otherwise moves values
    contiguous: bool = True  # p.is_contiguous() then (the C++ loop steps only these)

    def overrides(self, group: dict) -> Optional[dict]:
        """What this step must tell the daemon beyond lr: the hyperparameters of `group`
        (read as torch reads them, at every step) that differ from the registered ones, as
        Client.step's per-group dict; None when none differ. ValueError when amsgrad
        changed (torch would need or drop state['max_exp_avg_sq'] half-way)."""
        _, betas, eps, weight_decay, maximize, amsgrad = self.hyperparameters
        if bool(group["amsgrad"]) != amsgrad:
            raise ValueError(f"parameter '{self.name}': amsgrad of its param group changed "
                             f"since registration (daemon: {amsgrad}); it cannot change "
                             "between steps")
        beta1, beta2 = group["betas"]
        now = ((_as_float(beta1), _as_float(beta2)), _as_float(group["eps"]),
               _as_float(group["weight_decay"]), bool(group["maximize"]))
        if now == (betas, eps, weight_decay, maximize):
            return None
        out = {}
        for key, value, registered in (("betas", now[0], betas), ("eps", now[1], eps),
                                       ("weight_decay", now[2], weight_decay),
                                       ("maximize", now[3], maximize)):
            if value != registered:
                out[key] = value
        return out


def _any_float32(groups) -> bool:
    """Whether a gradient of one Client.step call's groups (tuples, or a _PreparedStep) is
    float32."""
    if isinstance(groups, _PreparedStep):
        return groups.any_float32
    return any(grad.dtype is torch.float32 for _, grad, *_ in groups)


def _scaled(groups, scale: torch.Tensor) -> list:
    """One Client.step call's groups (tuples, or a _PreparedStep) as tuples, each gradient
    multiplied by `scale` (a new tensor, by torch's multiply: what its clip does in place)."""
    on_device = {}  # scale on each gradient's device, moved once
    scaled = []
    for name, grad, *rest in groups:
        s = on_device.get(grad.device)
        if s is None:
            s = on_device[grad.device] = scale.to(grad.device)
        scaled.append((name, grad * s, *rest))
    return scaled


# Failures of a step call after its chunks began to go out (a lost connection, a
# deadline, a reset): the daemon may have applied some of them. Refusals (bad input,
# a lease, a missing group) come before anything is applied.
_PART_WAY_FAILURES = (errors.Unavailable, errors.DeadlineExceeded, errors.Cancelled,
                      errors.Unknown, errors.Internal, errors.Aborted, errors.DataLoss)


def _as_float(value) -> float:
    """A hyperparameter as a float: a number or a one-element Tensor. TypeError for a str
    (float() would parse it; torch's step refuses it, as its arithmetic does)."""
    if isinstance(value, torch.Tensor):
        return float(value.item())
    if isinstance(value, (str, bytes)):
        raise TypeError(f"a hyperparameter in param_groups must be a number or a Tensor, "
                        f"got {type(value).__name__} {value!r}; nothing was sent")
    return float(value)


def _keeping_not_stepped(refusal: errors.Error, explained: errors.Error) -> errors.Error:
    """`explained`, with `refusal`'s ``not_stepped`` (a client of several daemons: the
    groups that did not step) where it has one."""
    if hasattr(refusal, "not_stepped"):
        explained.not_stepped = refusal.not_stepped
    return explained


def _started_times(stats: dict) -> dict:
    """When each daemon behind a client started, from its stats(): member identity ->
    (started_unix_micros, has_state_dir, target); one daemon is identity ""."""
    if stats.get("members"):
        return {m["identity"]: (m["started_unix_micros"], m["has_state_dir"], m["target"])
                for m in stats["members"]}
    return {"": (stats["started_unix_micros"], stats["has_state_dir"], None)}


def _hyperparameters(group: dict) -> tuple:
    """The daemon's hyperparameters for a param group: (lr, (beta1, beta2), eps,
    weight_decay, maximize, amsgrad). lr is overridden on every step by the group's current
    lr, so the group is registered with its scheduler's initial lr (stable across
    restarts, whatever the schedule has reached); the others as the group holds them now
    (a step sends those that differ then)."""
    lr = group.get("initial_lr", group["lr"])
    beta1, beta2 = group["betas"]
    return (_as_float(lr), (_as_float(beta1), _as_float(beta2)), _as_float(group["eps"]),
            _as_float(group["weight_decay"]), bool(group["maximize"]), bool(group["amsgrad"]))


def _float32(x: float) -> float:
    """x rounded to float32 (inf beyond its range), as a C++ static_cast<float>."""
    return torch.tensor(x, dtype=torch.float64).to(torch.float32).item()


def _step_hyperparameters_refusal(h: tuple, lr: float, overrides: Optional[dict],
                                  step: int) -> Optional[str]:
    """Why the daemon refuses a step of a group registered with `h`, at `lr` with
    `overrides` (Registration.overrides), or None: its ValidateHyperparameters and the
    step's float32 constants (server/kernels/adamw_kernel.cc), in the same order."""
    _, (beta1, beta2), eps, weight_decay, _, _ = h
    if overrides:
        beta1, beta2 = overrides.get("betas", (beta1, beta2))
        eps = overrides.get("eps", eps)
        weight_decay = overrides.get("weight_decay", weight_decay)
        if not (math.isfinite(lr) and lr >= 0 and math.isfinite(_float32(lr))):
            return f"lr must be finite and >= 0 (and within float32's range), got {lr!r}"
        if not 0 <= beta1 < 1:
            return f"beta1 must be in [0, 1), got {beta1!r}"
        if not 0 <= beta2 < 1:
            return f"beta2 must be in [0, 1), got {beta2!r}"
        if not (math.isfinite(eps) and math.isfinite(_float32(eps)) and _float32(eps) > 0):
            return ("eps must be finite and > 0, and at least float32's smallest value "
                    f"1.4e-45 (the step runs in fp32), got {eps!r}")
        if not (math.isfinite(weight_decay) and weight_decay >= 0
                and math.isfinite(_float32(weight_decay))):
            return ("weight_decay must be finite and >= 0 (and within float32's range), got "
                    f"{weight_decay!r}")
    if not (math.isfinite(lr) and lr >= 0):
        return f"lr must be finite and >= 0, got {lr!r}"
    bias_correction1 = 1.0 - math.pow(beta1, float(step))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        neg_step_size = _float32(-(lr / bias_correction1)) if bias_correction1 != 0 else math.inf
        decay = _float32(1.0 - lr * weight_decay)
    if not (math.isfinite(neg_step_size) and math.isfinite(decay)):
        return (f"lr {lr!r} with weight_decay {weight_decay!r} at step {step} gives a step size "
                "or decay beyond float32's range (the step runs in fp32); use a smaller lr")
    return None


class SparseGradientError(RuntimeError, ValueError):
    """A sparse gradient, refused: a RuntimeError as torch.optim.AdamW's refusal of it, and
    a ValueError as RemoteAdamW's other refusals of an input."""


def _shared_memory_pair(entries: list) -> Optional[tuple[str, str]]:
    """The names of two of `entries` ((parameter, name, param group) each) whose elements
    share memory (``b.data = a.data``, or overlapping views of one tensor), or None.
    Views of one storage that do not overlap (slices of one buffer) share nothing."""
    spans = []
    for p, name, _ in entries:
        if p.layout != torch.strided or p.numel() == 0:
            continue  # refused by name elsewhere (_check_registrable)
        extent = 1 + sum((size - 1) * stride for size, stride in zip(p.shape, p.stride()))
        start = p.data_ptr()
        spans.append((str(p.device), start, start + extent * p.element_size(), p, name))
    spans.sort(key=lambda s: (s[0], s[1]))
    for i, (device, start, end, p, name) in enumerate(spans):
        j = i + 1
        while j < len(spans) and spans[j][0] == device and spans[j][1] < end:
            q, other = spans[j][3], spans[j][4]
            if (p.is_contiguous() and q.is_contiguous()) or not _disjoint_views(p, q):
                return name, other
            j += 1
    return None


def _shares_memory_message(pair: tuple[str, str]) -> str:
    return (f"parameters '{pair[0]}' and '{pair[1]}' share memory (one set as the other's "
            ".data, or overlapping views of one tensor): torch.optim.AdamW would step that "
            "memory once for each, and the daemon keeps each parameter's values apart, so "
            "they would drift apart. Tie them as one Parameter (module_b.weight = "
            "module_a.weight), listed once")


def _disjoint_views(p: torch.Tensor, q: torch.Tensor) -> bool:
    """Whether strided tensors p and q, whose spans of memory overlap, have no element in
    common (interleaved views of one buffer); tensors of other element sizes count as
    overlapping."""
    size = p.element_size()
    if q.element_size() != size:
        return False
    base = min(p.data_ptr(), q.data_ptr())
    offsets = []
    for t in (p, q):
        extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
        index = torch.arange(extent, dtype=torch.int64)
        offsets.append(torch.as_strided(index, t.shape, t.stride()).reshape(-1)
                       + (t.data_ptr() - base) // size)
    return not bool(torch.isin(offsets[0], offsets[1]).any())


def _register_keywords(h: tuple) -> dict:
    """A _hyperparameters tuple as Client.register's / import_state's keywords."""
    lr, betas, eps, weight_decay, maximize, amsgrad = h
    return dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, maximize=maximize,
                amsgrad=amsgrad)


def _target_of(client: Client):
    """What Client() takes to connect as `client` does: its target, or its members."""
    members = client.members
    if len(members) == 1 and members[0]["identity"] == members[0]["target"]:
        return client.target
    return members


def _held_schedulers(scheduler) -> list:
    """The schedulers a SequentialLR or ChainedScheduler steps for it."""
    from torch.optim import lr_scheduler

    if isinstance(scheduler, (lr_scheduler.SequentialLR, lr_scheduler.ChainedScheduler)):
        return list(scheduler._schedulers)
    return []


def _check_schedulers_fresh(scheduler) -> None:
    """ValueError for a ReduceLROnPlateau anywhere in `scheduler`, or a scheduler stepped
    since it was made (its own first step aside)."""
    from torch.optim import lr_scheduler

    if isinstance(scheduler, lr_scheduler.ReduceLROnPlateau):
        raise ValueError("resume_scheduler() cannot rebuild ReduceLROnPlateau: its lr "
                         "depends on the metrics it was given; save its state_dict() with "
                         "your checkpoint and load it instead")
    held = _held_schedulers(scheduler)
    if getattr(scheduler, "last_epoch", 0) > 0:
        raise ValueError(f"the scheduler ({type(scheduler).__name__}) was stepped "
                         f"{scheduler.last_epoch} times since it was made: make it anew, "
                         "as at the job's start, and call resume_scheduler() before any "
                         "step")
    for inner in held:
        _check_schedulers_fresh(inner)


def _place_scheduler(scheduler, epoch: int) -> None:
    """Puts `scheduler` where `opt.step(); sched.step()` left it after `epoch` loop steps
    (its last_epoch, the step count torch keeps; a SequentialLR's current scheduler at its
    own epoch since its milestone, each of a ChainedScheduler's; a
    CosineAnnealingWarmRestarts' position in its cycle), so that one step() goes on as the
    loop's next did."""
    from torch.optim import lr_scheduler

    if isinstance(scheduler, lr_scheduler.SequentialLR):
        index = bisect.bisect_right(scheduler._milestones, epoch)
        start = scheduler._milestones[index - 1] if index > 0 else 0
        _place_scheduler(scheduler._schedulers[index], epoch - start)
    elif isinstance(scheduler, lr_scheduler.ChainedScheduler):
        for inner in scheduler._schedulers:
            _place_scheduler(inner, epoch)
    elif isinstance(scheduler, lr_scheduler.CosineAnnealingWarmRestarts):
        # Its step(): T_cur + 1, wrapping to 0 (and T_i times T_mult) at T_i.
        t_i, t_cur = scheduler.T_0, epoch
        if scheduler.T_mult == 1:
            t_cur %= t_i
        else:
            while t_cur >= t_i:
                t_cur -= t_i
                t_i *= scheduler.T_mult
        scheduler.T_i, scheduler.T_cur = t_i, t_cur
    if hasattr(scheduler, "last_epoch"):
        scheduler.last_epoch = epoch
    if hasattr(scheduler, "_step_count"):
        scheduler._step_count = epoch + 1  # the first step() at construction counts


class RemoteAdamW(torch.optim.Optimizer):
    r"""torch.optim.AdamW whose state (fp32 master weights, exp_avg, exp_avg_sq, step) is
    held and stepped by an optstated daemon.

    The arguments before ``*`` are torch.optim.AdamW's, in its order, with its defaults and
    its checks (the same exception types and messages); the options after it that torch
    has too mean what they mean there.

    Args:
        params: parameters, ``(name, parameter)`` pairs (``model.named_parameters()``) or
            param group dicts of either, as for any torch optimizer; each group may set
            its own ``lr``, ``betas``, ``eps``, ``weight_decay`` and ``maximize``.
        lr, betas, eps, weight_decay, amsgrad, maximize: torch.optim.AdamW's
            hyperparameters and defaults. As torch, every step reads lr, betas, eps,
            weight_decay and maximize from ``param_groups`` (a scheduler may change any of
            them: OneCycleLR's momentum cycling changes betas), and sends the daemon those
            that differ from the registered ones. With ``amsgrad=True`` the daemon keeps
            ``max_exp_avg_sq`` too (its CUDA backend refuses it,
            ``optstate.InvalidArgument`` naming amsgrad); amsgrad may not change between
            steps.
        foreach, fused, capturable, differentiable: accepted as False or None (the
            daemon runs its own fused CPU step); True raises RuntimeError naming the option
            (after torch's own refusals of their combinations).
        target: the daemon's ``"host:port"``; keyword only, by default the
            ``OPTSTATE_TARGET`` environment variable (or give ``client``).
        client: an :class:`optstate.Client` to use instead of connecting to ``target``
            (:meth:`close` leaves it open).
        name_prefix: the job's name on the daemon (docs/jobs.md), prepended to every group
            name, so two jobs on one daemon stay apart; required (ValueError without it),
            except under torchrun, where it defaults to ``TORCHELASTIC_RUN_ID + "/"`` (with
            a warning saying so). A parameter is named ``name_prefix + name`` from
            ``named_parameters()`` (torch.compile's ``_orig_mod.`` and DDP/FSDP's
            ``module.`` stripped, so wrapping the model keeps its groups; a character
            other than printable ASCII written ``%XX``), else ``name_prefix + "param." +
            i`` (its index over all param groups when registered, the next free one when
            another parameter has it); a parameter keeps its name for the optimizer's
            life, wherever it moves in ``param_groups``.
        resume: what happens when the job's groups already exist at a step > 0:
            ``"never"`` (the default) refuses (``optstate.FailedPrecondition`` saying which,
            at which step, and the ways on); ``"daemon"`` continues from the daemon's live
            state: the parameters are overwritten with its values (fp32 master weights
            narrowed to the parameter's dtype), and ``param_groups``' lr, betas, eps,
            weight_decay and maximize set to those of the last step the daemon applied;
            :attr:`resumed_step` is that step (make the scheduler as at the start, then
            :meth:`resume_scheduler`); ``"state_dict"`` attaches for
            :meth:`load_state_dict`. Under ``"never"`` and ``"daemon"`` a model with
            parameters the job has no groups for, beside groups at a step > 0, is refused
            (add new parameters with :meth:`add_param_group`); ``"state_dict"`` takes it,
            as :meth:`load_state_dict` then gives every group its state
            (docs/jobs.md).
        finish_torn_step: with ``resume="daemon"``, attach to a job whose groups stopped at
            different steps (a trainer killed part-way through step k): the first
            ``step()`` steps only the groups behind, to step k, with the gradients given.
        takeover: break the lease of the job that last stepped these groups, when it has
            expired or its process (on this host) is gone; without it, groups another
            holder leases are refused at construction.
        reconnect_timeout: seconds a call waits for a daemon that went away (restarting)
            before it fails; a daemon that restarted without the job's step is reported
            with what it restored.
        connect_timeout: seconds construction waits for the daemon to answer at all
            (``optstate.Unavailable`` naming the target).
        wire_dtype: ``torch.float32`` (default) or ``torch.bfloat16`` / ``torch.float16``:
            how float32 parameters' gradients and values travel (the daemon keeps fp32
            master weights). bf16 and fp16 parameters always travel as they are.
        shard: under ``torch.distributed``, step only this rank's contiguous, balanced
            slice of the parameters (ZeRO stage 1) and broadcast the updated values from
            their owners, so N ranks send 1/N of the gradient bytes each.
        process_group: the group to shard over (default: the world).
        shared_buffers: on a daemon on this host, move the values and gradients of the
            parameters this rank steps into one buffer shared with the daemon
            (:meth:`optstate.Client.allocate_shared_buffer`), so ``step()`` copies
            nothing: the daemon reads the gradients and writes the updated values where
            they are. Each parameter's ``.data`` is replaced by a view of the buffer
            (values kept), so do it before anything else keeps a reference to the old
            storage. ``zero_grad(set_to_none=False)`` keeps the gradients in the buffer
            (backward then accumulates into it); a gradient autograd made anew (after
            ``set_to_none=True``, the default) is copied into the buffer at the next
            ``step()``, once. Float32 parameters over a 16-bit ``wire_dtype`` stay where
            they are (the client narrows them). Needs the shared-memory data plane:
            ``optstate.FailedPrecondition`` at construction otherwise (before anything is
            registered, on a rank with parameters to place).
        delete_on_close: :meth:`close` (or the end of a ``with`` block) deletes the daemon
            groups of the parameters this optimizer registered, with their state.
        staging: ``"auto"`` (default): CUDA parameters step through host staging slots of
            their own (docs/python.md, "Models on a GPU"): each gradient copied to the host
            on a side stream as soon as it is final, the new values copied back on it, the
            next use waiting by an event; ``"always"``: CPU parameters too, through the
            same slots and checks with plain copies (how that path is tested without a
            GPU). See :meth:`clip_grad_norm_`, :meth:`wait_in_forward`,
            :meth:`register_ddp_comm_hook` and :meth:`stats`.
        **client_options: passed to :class:`optstate.Client` (``max_attempts``, ...).

    ``opt.state[p]`` is torch's ``step``, ``exp_avg`` and ``exp_avg_sq`` (and
    ``max_exp_avg_sq`` with amsgrad) of p (float32,
    p's shape), read from the daemon when read: a copy, which changes nothing on the
    daemon when written (:meth:`load_state_dict` does). :meth:`state_dict` and
    :meth:`load_state_dict` run torch's state-dict hooks
    (``register_state_dict_pre_hook`` and the other three). pickle, ``copy.deepcopy``
    and ``torch.save(opt)`` give an optimizer attached to the same daemon groups
    (:meth:`__getstate__`). A refused :meth:`add_param_group` leaves ``param_groups``
    as it was.

    ``step()`` sends every gradient in one ``Client.step`` call (one stream), each with its
    param group's current ``lr``; parameters whose ``.grad`` is None are skipped. (A
    parameter whose step count fell behind, having had no gradient, or a mix of 16-bit
    dtypes and wire types, takes a call of its own: the client takes one step number and
    one wire type per call.) A
    non-finite gradient refuses the whole step (``optstate.InvalidArgument``) with
    nothing applied to any parameter. Registration happens at construction: an
    unreachable daemon raises ``optstate.Unavailable`` there, and a group of the same
    name with other hyperparameters (another job's) ``optstate.AlreadyExists``.

    Without ``shard``, data-parallel ranks may all step the same groups: the first
    request for a page applies it, the others replay it (each rank still sends its whole
    gradient and receives all params; the daemon's work per replayed page is a copy).
    """

    def __init__(self, params, lr: float | torch.Tensor = 1e-3,
                 betas: tuple = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 amsgrad: bool = False, *, maximize: bool = False,
                 foreach: Optional[bool] = None, capturable: bool = False,
                 differentiable: bool = False, fused: Optional[bool] = None,
                 target: Optional[str] = None, client: Optional[Client] = None,
                 name_prefix: Optional[str] = None, wire_dtype: torch.dtype = torch.float32,
                 shard: bool = False, process_group=None, shared_buffers: bool = False,
                 delete_on_close: bool = False, resume: str = "never",
                 finish_torn_step: bool = False, takeover: bool = False,
                 reconnect_timeout: float = 60.0, connect_timeout: float = 10.0,
                 staging: str = "auto", **client_options):
        check_client_options(client_options, client)
        if isinstance(lr, str) and ":" in lr:
            # An address where lr goes: torch would raise TypeError too, saying less. Any
            # other str raises torch's own TypeError and message, below.
            raise TypeError(f"lr must be a float or a Tensor, not the str {lr!r}: lr is "
                            "RemoteAdamW's second positional argument, as torch's, and target "
                            "is keyword-only (target='host:port')")
        # torch.optim.AdamW's checks first, in its order, with its exceptions and messages.
        betas = check_hyperparameters(lr, betas, eps, weight_decay, foreach, capturable)
        check_options(foreach, fused, capturable, differentiable)
        if target is None and client is None:
            target = os.environ.get("OPTSTATE_TARGET")
        if client is None and not target:
            raise ValueError("RemoteAdamW needs target='host:port' of an optstated daemon (or "
                             "the OPTSTATE_TARGET environment variable, or client=)")
        # Several daemons (docs/scale-out.md): a list of 'host:port' (or of member dicts).
        targets = list(target) if isinstance(target, (list, tuple)) else [target]
        if client is None and (not targets or any(
                not isinstance(t, (str, dict)) or (isinstance(t, str) and "://" in t)
                for t in targets)):
            raise ValueError(f"target must be the daemon's 'host:port' (or 'unix:/path'), or a "
                             f"list of them for several daemons, got {target!r}: gRPC targets "
                             "take no http:// or https:// scheme (for TLS pass tls=True or "
                             "tls_root_ca=)")
        if resume not in RESUME_MODES:
            raise ValueError(f"resume must be one of {', '.join(map(repr, RESUME_MODES))}, got "
                             f"{resume!r}")
        if staging not in _STAGING_MODES:
            raise ValueError(f"staging must be 'auto' (CUDA parameters are staged through host "
                             f"memory) or 'always' (CPU parameters too), got {staging!r}")
        if finish_torn_step and resume != "daemon":
            raise ValueError("finish_torn_step=True needs resume='daemon'")
        if wire_dtype not in _WIRE_NAMES:
            raise ValueError(f"wire_dtype must be torch.float32, torch.bfloat16 or torch.float16, "
                             f"not {wire_dtype}")
        if shard and not (dist.is_available() and dist.is_initialized()):
            raise ValueError("shard=True needs torch.distributed initialised (init_process_group)")
        name_prefix = job_name(name_prefix)
        self._owns_client = client is None
        self._name_prefix = name_prefix
        self._resume = resume
        self._finish_torn_step = finish_torn_step
        self._takeover = takeover
        self._finish_to: Optional[int] = None
        # resume="state_dict" found the job's groups trained: why step() waits for
        # load_state_dict() (None once loaded, or when there was nothing to load over).
        self._awaiting_load: Optional[str] = None
        self._pid = os.getpid()  # the process whose connection this is (_check_not_forked)
        self.resumed_step = 0
        self._resumed_lrs: dict[int, float] = {}  # by id(param group): its last step's lr
        # By id(param group): the hyperparameters of torn step k, where recorded (_attach).
        self._torn_hyperparameters: dict[int, dict] = {}
        if client is None:
            client_options.setdefault("connect_timeout", connect_timeout)
            client_options.setdefault("reconnect_timeout", reconnect_timeout)
            client_options.setdefault("lease_holder", new_holder_id(
                process_group if shard else None))
            client_options.setdefault("lease_job", name_prefix.replace(" ", "_")[:256])
        self._client_options = dict(client_options)
        self._client = client if client is not None else Client(target, **client_options)
        self._lease_holder = self._client_options.get("lease_holder", "")
        note_holder(self._lease_holder, self)
        self._daemon_started = None
        self._wire = _WIRE_NAMES[wire_dtype]
        self._shard = shard
        self._process_group = process_group
        self._delete_on_close = delete_on_close
        self._reconnect_timeout = reconnect_timeout
        self._init_bookkeeping(shared_buffers, staging)
        # The keys of torch.optim.AdamW's param groups, so state dicts move both ways.
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=foreach, capturable=capturable,
                        differentiable=differentiable, fused=fused, decoupled_weight_decay=True)
        try:
            if client is None:
                self._client.wait_until_reachable(connect_timeout)
            self._daemon_started = _started_times(self._client.stats())
            super().__init__(params, defaults)
            self._place_and_register(attaching=True)
            self._constructed = True
        except BaseException:
            self._closed = True  # never steps: a lease it took is known gone (_jobs.py)
            if self._owns_client:
                self._client.close()
            raise
        self.state = RemoteState(self._state_of, self._with_state, self._reset_state)

    def _init_bookkeeping(self, shared_buffers: bool, staging: str) -> None:
        """The per-parameter records, empty (construction and unpickling)."""
        # Both by id(parameter) (torch.Tensor's __hash__ is Python code); the registration
        # holds the parameter, so its id stays its own. step() reads them through its plan,
        # which every change of these three dicts clears.
        self._step_plan = _StepPlan()
        self._registered: dict[int, _Registration] = _PlanSource(self._step_plan)
        self._hyperparameter_tuples: dict[tuple, tuple] = {}  # each registered tuple, once
        self._owner: dict[int, int] = _PlanSource(self._step_plan)
        # shared_buffers: the buffers (kept alive here) and, by id(parameter), the view of
        # one where its gradient goes.
        self._shared_buffers = shared_buffers
        self._buffers: list[torch.Tensor] = []
        self._shared_grads: dict[int, torch.Tensor] = _PlanSource(self._step_plan)
        # Parameters on a GPU (and with staging="always" on the CPU) step through host
        # slots of their own (_staging.py); _grad_scale is clip_grad_norm_'s, for the next
        # step.
        self._staging_mode = staging
        self._staging = Staging(cpu_test_switch=staging == "always")
        self._grad_scale: Optional[torch.Tensor] = None
        self._grad_norm_type = 2.0  # clip_grad_norm_'s, with _grad_scale
        self._clip_stepped = False  # a step applied _grad_scale since clip_grad_norm_
        # (gradient, its _version, _own_writes of it) as clip_grad_norm_ measured them.
        self._clipped: list = []
        self._clipped_at: dict[int, int] = {}  # id(gradient) -> its index in _clipped
        # By a shared buffer's address: the copies _into_shared made into its gradient slots.
        # The slots are views of one buffer, so they share one version counter, which
        # each copy moves for all of them.
        self._shared_writes: dict[int, int] = {}
        self._shared_buffer_of: dict[int, int] = {}  # by id(parameter): its buffer's address
        self._listed_twice: Optional[str] = None  # a parameter param_groups list twice (_names)
        # By id(parameter): (it, its name) when last placed, every rank's (_names).
        self._placed_names: dict[int, tuple] = {}
        self._constructed = False
        self._closed = False
        self._deletes_left = False  # close() stopped by a failed delete (it may be called again)

    @property
    def client(self) -> Client:
        """The :class:`optstate.Client` this optimizer steps through."""
        return self._client

    @property
    def lease_holder(self) -> str:
        """This job's lease holder id (docs/jobs.md): shared by its ranks; give it as
        ``lease_holder=`` to another RemoteAdamW of the same job (after a rewind, say)."""
        return self._lease_holder

    def add_param_group(self, param_group: dict) -> None:
        """torch's add_param_group, then registration of the group's parameters on the
        daemon. Refused (torch's exception, or the daemon's) with ``param_groups`` as it
        was: a group is appended only once every check passed and its parameters are
        registered."""
        self._check_not_forked()
        before = len(self.param_groups)
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            beta1, beta2 = group["betas"]
            group["betas"] = check_hyperparameters(group["lr"], (beta1, beta2), group["eps"],
                                                   group["weight_decay"], group["foreach"],
                                                   group["capturable"])
            check_options(group["foreach"], group["fused"], group["capturable"],
                          group["differentiable"])
            if self._constructed:
                self._place_and_register()
        except BaseException:
            del self.param_groups[before:]
            self._forget_unplaced()
            raise

    def _forget_unplaced(self) -> None:
        """Drops the records of parameters no longer in any param group (after a refused
        add_param_group); the daemon groups that call created are deleted again (one that
        existed before, another run's state, is left as it was)."""
        present = {id(p) for group in self.param_groups for p in group["params"]}
        for key in [k for k in self._registered if k not in present]:
            reg = self._registered.pop(key)
            if not reg.created:
                continue
            try:
                self._client.delete(reg.name)
            except errors.Error:
                pass  # best effort: the refusal being raised says what went wrong
        for key in [k for k in self._owner if k not in present]:
            del self._owner[key]
        for key in [k for k in self._placed_names if k not in present]:
            del self._placed_names[key]
        self._staging.forget_all_but(present)

    # -- lifetime: close, context manager, pickling ----------------------------------------

    def close(self) -> None:
        """Ends this optimizer's use of the daemon (idempotent): with ``delete_on_close``,
        deletes the daemon groups of the parameters this rank registered (their state is
        gone); then closes the client if this optimizer made it (a ``client=`` passed in
        stays open). step() raises ValueError afterwards. A delete that fails (the daemon
        gone for longer than this optimizer's reconnect_timeout) raises, leaving a client it
        made open, and close() may be called again to delete what is left."""
        if self._closed and not self._deletes_left:
            return
        if os.getpid() != getattr(self, "_pid", os.getpid()):
            # A forked child's copy: the groups and the connection are the parent's.
            self._closed = True
            return
        self._closed = True
        self._step_plan.clear()  # it holds the parameters' data and slots
        self._staging.close()  # the host slots, pinned or shared, are released here
        if self._delete_on_close:
            self._deletes_left = True
            for key, reg in list(self._registered.items()):
                self._delete_riding_out_a_restart(reg.name)
                del self._registered[key]
            self._deletes_left = False
        if self._owns_client:
            self._client.close()

    def _delete_riding_out_a_restart(self, name: str) -> None:
        """Deletes group `name`. A delete is sent once (a retry could not tell "deleted
        now" from NotFound), but here NotFound is as good (deleted already: by another
        rank of this job, by hand, or by the attempt whose reply was lost), so one that
        found the daemon gone (Unavailable: restarting, or a connection that broke) is
        made again once it answers, up to reconnect_timeout."""
        deadline = time.monotonic() + self._reconnect_timeout
        while True:
            try:
                self._client.delete(name)
                return
            except errors.NotFound:
                return
            except errors.Unavailable:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                self._client.wait_until_reachable(left)

    def __enter__(self) -> "RemoteAdamW":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            self.close()
            return
        # The block's own exception goes on; a failed close must not take its place.
        try:
            self.close()
        except errors.Error as e:
            warnings.warn(f"RemoteAdamW.close() at the end of a with block that raised "
                          f"{exc_type.__name__} failed too: {e}", stacklevel=2)

    def __getstate__(self) -> dict:
        """torch's optimizer state for pickle, copy.deepcopy and torch.save: defaults and
        param_groups (with copies of the parameters, as torch's), no optimizer state (the
        daemon holds it), and how to reach the daemon's groups again. The copy unpickled
        attaches to the same daemon groups by name (each at the step the daemon holds);
        it and this optimizer then step the same groups, as data-parallel ranks do.
        A ``token=`` is not carried (the pickle would hold the secret): the copy
        authenticates with ``$OPTSTATE_TOKEN``, the Client's default.
        TypeError for what cannot be carried to another process: ``shared_buffers``
        (memory shared with this process), ``shard`` (a process group), a closed
        optimizer, or a ``client=`` passed in (its options are not known here)."""
        for refusal, why in ((self._closed, "it was closed"),
                             (self._shared_buffers, "its shared_buffers are memory of this "
                              "process"),
                             (self._shard, "shard=True needs its process group"),
                             (not self._owns_client, "it was given client=, whose options it "
                              "cannot recreate (pass target= instead)")):
            if refusal:
                raise TypeError(f"cannot pickle or copy this RemoteAdamW: {why}; save its "
                                "state_dict() instead")
        names = {id(p): name for p, name, _ in self._names()}
        return {"defaults": self.defaults, "state": {}, "param_groups": self.param_groups,
                "_optstate": {"target": _target_of(self._client),
                              # Never the token: a pickle goes to disk and to other
                              # hosts. The copy takes OPTSTATE_TOKEN, as Client does.
                              "client_options": {k: v for k, v in self._client_options.items()
                                                 if k != "token"},
                              "name_prefix": self._name_prefix, "wire": self._wire,
                              "staging": self._staging_mode,
                              # Per parameter (by position), the registration to attach to.
                              "registered": [
                                  self._registered[id(p)].hyperparameters
                                  if id(p) in self._registered else None
                                  for group in self.param_groups for p in group["params"]],
                              "names": [names[id(p)] for group in self.param_groups
                                        for p in group["params"]]}}

    def __setstate__(self, state: dict) -> None:
        config = state.pop("_optstate", None)
        super().__setstate__(state)
        if config is None:
            raise TypeError("this pickle of a RemoteAdamW has no daemon configuration; it was "
                            "not made by RemoteAdamW.__getstate__")
        self._owns_client = True
        self._client_options = dict(config["client_options"])
        self._name_prefix = config["name_prefix"]
        self._wire = config["wire"]
        self._shard = False
        self._process_group = None
        self._delete_on_close = False  # the original may still step these groups
        self._reconnect_timeout = float(self._client_options.get("reconnect_timeout", 60.0))
        self._resume, self._finish_torn_step, self._takeover = "state_dict", False, False
        self._finish_to = None
        self._awaiting_load = None
        self._pid = os.getpid()
        self.resumed_step = 0
        self._resumed_lrs = {}
        self._torn_hyperparameters = {}
        self._init_bookkeeping(shared_buffers=False, staging=config.get("staging", "auto"))
        # The copy holds the original's lease (lease_holder is among the options): both
        # step the same groups, as the ranks of one job do.
        self._client = Client(config["target"], **self._client_options)
        self._lease_holder = self._client_options.get("lease_holder", "")
        note_holder(self._lease_holder, self)
        self._daemon_started = _started_times(self._client.stats())
        params = [(p, group) for group in self.param_groups for p in group["params"]]
        for (p, group), name, h in zip(params, config["names"], config["registered"]):
            self._owner[id(p)] = 0
            if h is not None:
                self._register(p, name, group, tuple(h[:1]) + (tuple(h[1]),) + tuple(h[2:]))
        self._staging.add([(p, name) for (p, _), name, h in zip(params, config["names"],
                                                                   config["registered"])
                           if h is not None and self._staging.wants(p)], self._client)
        self._constructed = True
        self.state = RemoteState(self._state_of, self._with_state, self._reset_state)

    # -- naming, placement, registration -------------------------------------------------

    def _names(self) -> list[tuple[torch.Tensor, str, dict]]:
        """(parameter, daemon group name, param group) over all param groups, in order.

        A registered parameter keeps the name it was registered under, wherever it moves
        in param_groups (torch's state_dict indices follow positions; the daemon's groups
        must not). A parameter not registered yet is named from ``param_names``, or
        ``param.<its position>`` (the next free index where that name is another
        parameter's). A parameter listed twice (a tied weight listed once per module,
        which torch warns of and steps twice a step) is given once, at its first place,
        and noted in _listed_twice: step() refuses it. Parameters another rank registers
        (shard=True) keep the names every rank gave them when they were placed."""
        taken = {reg.name for reg in self._registered.values()}
        taken.update(name for _, name in self._placed_names.values())
        out, seen, seen_params = [], set(), set()
        self._listed_twice = None
        index = 0
        for group in self.param_groups:
            names = group.get("param_names")
            for j, p in enumerate(group["params"]):
                if id(p) in seen_params:
                    if self._listed_twice is None:
                        self._listed_twice = next(n for q, n, _ in out if q is p)
                    index += 1
                    continue
                reg = self._registered.get(id(p))
                placed = self._placed_names.get(id(p))
                if reg is not None:
                    name = reg.name
                elif placed is not None:
                    name = placed[1]
                elif names:
                    name = self._name_prefix + group_name_of(strip_wrappers(names[j]))
                else:
                    k = index
                    name = self._name_prefix + f"param.{k}"
                    while name in taken or name in seen:
                        k += 1
                        name = self._name_prefix + f"param.{k}"
                if name in seen:
                    raise ValueError(
                        f"two parameters are both named '{name}' on the daemon (a group's "
                        "name is name_prefix + the parameter's name): names from "
                        "submodule.named_parameters() repeat across submodules. Give "
                        "model.named_parameters() (full paths) split into param groups, "
                        "or plain parameters")
                seen.add(name)
                seen_params.add(id(p))
                out.append((p, name, group))
                index += 1
        return out

    def _rank_and_world(self) -> tuple[int, int]:
        if not self._shard:
            return 0, 1
        return dist.get_rank(self._process_group), dist.get_world_size(self._process_group)

    def _place_and_register(self, attaching: bool = False) -> None:
        """Assigns parameters to ranks (contiguous slices balanced by element count: a
        parameter goes to the rank whose share holds its middle element) and registers
        the ones this rank steps. `attaching` (construction): then holds what it found to
        ``resume`` and the leases (_attach)."""
        entries = self._names()
        for p, name, _ in entries:  # p held: its id stays its own
            self._placed_names[id(p)] = (p, name)
        rank, world = self._rank_and_world()
        if world > 1:
            self._check_ranks_list_the_same_parameters(entries)
        total = sum(p.numel() for p, _, _ in entries) or 1
        before = 0
        self._owner.clear()
        for p, _, _ in entries:
            middle = before + p.numel() / 2
            self._owner[id(p)] = min(world - 1, int(middle * world // total))
            before += p.numel()
        new = [(p, name, group) for p, name, group in entries
               if self._owner[id(p)] == rank and id(p) not in self._registered]
        for p, name, _ in new:  # all checked before the first is registered
            self._check_registrable(p, name)
        shared_memory = _shared_memory_pair(entries) if new else None
        if shared_memory is not None:
            raise ValueError(_shares_memory_message(shared_memory))
        # The shared buffer first: a client that cannot have one registers nothing.
        shared = self._allocate_shared([p for p, _, _ in new]) if self._shared_buffers else None
        found, refused = [], []
        try:
            for p, name, group in new:
                try:
                    found.append((p, group, self._register(p, name, group)))
                except errors.AlreadyExists as error:
                    if not attaching:
                        raise
                    refused.append((p, name, group, error))
            if refused:
                self._register_with_the_daemons(refused, found)
            # Attaching to a job trained before keeps the daemon's values (resume=).
            trained = self._attach(found) > 0 if attaching else False
            self._staging.add([(p, name) for p, name, _ in new if self._staging.wants(p)],
                              self._client)
        except BaseException:
            # Leave the daemon as it was: the groups this call created go again.
            for p, _, info in found:
                self._registered.pop(id(p), None)
                self._staging.forget(p)
                if info.created:
                    try:
                        self._client.delete(info.name)
                    except errors.Error:
                        pass
            raise
        if shared is not None:
            self._move_into_shared(*shared)
        for p, _, _ in new:  # attaching or moving them into shared memory wrote them
            self._note_values(p)
        self._take_values_of_an_untrained_job([p for p, _, info in found
                                               if not trained and not info.created
                                               and info.max_step == 0], attaching)

    def _check_ranks_list_the_same_parameters(self, entries: list) -> None:
        """shard=True: each rank places the parameters by their order in param_groups, and
        the broadcast after each step pairs them by position, so every rank must list the
        same parameters (names, shapes, dtypes), in the same order. Ranks that did not (a
        set() of parameters, whose order follows id(); a frozen parameter left out on one
        rank) stepped some parameters twice and others never, and broadcast one's values
        into another, silently, or hung at the broadcast. The ranks compare a digest of
        their lists in one all_reduce; ValueError on every rank when they differ."""
        listed = "\n".join(f"{name} {tuple(p.shape)} {p.dtype}" for p, name, _ in entries)
        digest = int.from_bytes(hashlib.sha256(listed.encode()).digest()[:7], "little")
        extremes = torch.tensor([digest, -digest], dtype=torch.int64)
        dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=self._process_group)
        if extremes[0].item() != -extremes[1].item():
            raise ValueError(
                f"shard=True: the ranks list different parameters, or the same in another "
                f"order ({len(entries)} here; names, shapes and dtypes compared): each rank "
                "steps its share by position and the values are broadcast by position. Give "
                "every rank the same params in the same order (model.named_parameters(), "
                "not a set)")

    def _take_values_of_an_untrained_job(self, existing: list, attaching: bool) -> None:
        """`existing`: parameters whose groups existed, never stepped, in a job not trained
        yet. They hold the values of whoever registered them first: another rank of this
        job, or a run that stopped before its first step, with other weights. torch steps
        from p's, so p's values are imported where they differ (_adopt_values), now: by
        every rank for its own groups with shard=True or in one process. Ranks without
        shard=True may share groups (data-parallel replicas, whose model is rank 0's, as
        DDP broadcasts it) or not (model-parallel stages, each its own): at construction
        they tell each other the names they registered, and a group is imported by the
        lowest rank that holds it; then they meet in a barrier, so that no rank steps the
        groups before their values are in. Later (add_param_group) rank 0 alone does it."""
        shared_by_ranks = (not self._shard and dist.is_available() and dist.is_initialized()
                           and dist.get_world_size() > 1)
        if not shared_by_ranks:
            for p in existing:
                self._adopt_values(p, self._registered[id(p)])
            return
        if not attaching:
            if dist.get_rank() == 0:
                for p in existing:
                    self._adopt_values(p, self._registered[id(p)])
            return
        names = sorted(reg.name for reg in self._registered.values())
        held = [None] * dist.get_world_size()
        dist.all_gather_object(held, names)
        earlier = set().union(*map(set, held[:dist.get_rank()]))
        for p in existing:
            if self._registered[id(p)].name not in earlier:
                self._adopt_values(p, self._registered[id(p)])
        dist.barrier()

    def _check_placement(self, created: list) -> None:
        """FailedPrecondition when groups registration just created (`created`, GroupInfo
        each) exist on another daemon of the member list than the one it places them on:
        the list changed (a daemon added or removed) without a Rebalance moving them."""
        if not created or len(self._client.members) < 2:
            return
        names = {info.name for info in created}
        elsewhere = [g for g in self._client.list_groups()
                     if g.name in names and g.member != self._client.member_of(g.name)]
        if not elsewhere:
            return
        g = elsewhere[0]
        raise errors.FailedPrecondition(
            f"job '{self._name_prefix}': {len(elsewhere)} of its groups are on other daemons "
            f"than this member list places them on (e.g. '{g.name}' is on daemon "
            f"'{g.member}', placed on '{self._client.member_of(g.name)}'): the list changed "
            "without a Rebalance. Move them first: optstate.Client(<the new list>, "
            "lease_holder=...).rebalance(<the new list>) from one process of the job, then "
            "attach again")

    def _job_step(self) -> int:
        """The highest step of the job's groups on the daemon(s), all ranks' (a rank
        registers only its share of them)."""
        return max((g.max_step for g in self._client.list_groups()
                    if g.name.startswith(self._name_prefix)), default=0)

    def _attach(self, found: list) -> int:
        """Construction's look at the groups registration found ((parameter, param group,
        GroupInfo) each): refuses what ``resume`` does not allow (check_resume) and groups
        another job leases (unless ``takeover``), then, with ``resume="daemon"``, takes the
        daemon's state: parameter values, step counts and the last step's hyperparameters.
        Returns the job's highest step on the daemon (0: none of its groups was stepped)."""
        attached = [Attached(info.name, info.created, info.min_step, info.max_step,
                             p.requires_grad)
                    for p, _, info in found]
        sharded = self._rank_and_world()[1] > 1
        # What check_resume judges: the whole job's groups. Each rank of a sharded job
        # registers its own share, and a torn step may have reached all of one rank's
        # share and none of another's: judged by share, one rank stepped on from step k
        # while another finished it, and the job was split for good.
        job = attached
        if sharded:
            mine = {a.name for a in attached}
            job = attached + [Attached(g.name, False, g.min_step, g.max_step)
                              for g in self._client.list_groups()
                              if g.name.startswith(self._name_prefix) and g.name not in mine]
        refused: Optional[errors.Error] = None
        try:
            # resume="never" refuses trained groups whoever leases them (the naive
            # restart hears of its ways on); the modes that attach hear of a live lease
            # first: a job another trainer is stepping is that trainer's, and its steps
            # part-way done are no torn step of this one's to finish.
            if self._resume == "never":
                check_resume(self._name_prefix, self._resume, job, self._finish_torn_step)
            leases = {info.name: info.lease for _, _, info in found
                      if info.lease is not None and not info.created}
            breaking = takeover_for(leases, self._lease_holder, self._takeover)
            self._check_placement([info for _, _, info in found if info.created])
            check_resume(self._name_prefix, self._resume, job, self._finish_torn_step)
            if self._resume == "daemon" and attached and all(a.created for a in attached):
                # Every parameter new: renamed ones, if the job's groups are there.
                # (resume="state_dict" checks at load_state_dict(), when the groups
                # added with add_param_group() since are known too.)
                self._refuse_renamed_parameters(attached)
            self._new_beside_trained = (self._resume == "state_dict"
                                        and any(a.created for a in attached))
        except errors.Error as e:
            refused = e
        if sharded:
            # Each rank judged its own share: all refuse when one does (the ranks meet in
            # the broadcast below, which a rank gone would leave waiting).
            verdict = torch.tensor([0 if refused is None else 1])
            dist.all_reduce(verdict, op=dist.ReduceOp.MAX, group=self._process_group)
            if refused is None and verdict.item():
                refused = errors.FailedPrecondition(
                    f"job '{self._name_prefix}': another rank refused to attach (its error "
                    "says why)")
        if refused is not None:
            raise refused
        if breaking and self._owns_client:
            self._client_options["lease_takeover"] = breaking
            replaced = self._client
            self._client = Client(_target_of(replaced), **self._client_options)
            replaced.close()
        high = max((info.max_step for _, _, info in found), default=0)
        if sharded and self._resume != "never":
            high = max(high, self._job_step())  # this rank's share may be frozen groups alone
        if self._resume == "state_dict" and high > 0:
            self._awaiting_load = (f"job '{self._name_prefix}' has state on the daemon (at "
                                   f"step {high})")
        if self._resume != "daemon" or high == 0:
            return high
        # Each param group's hyperparameters: its parameters' newest record (in a torn
        # step, the record of step `high` where any of its parameters reached it).
        newest: dict[int, tuple] = {}
        with torch.no_grad():
            for p, group, info in found:
                if info.max_step == 0:
                    continue  # never stepped (frozen): p keeps the values it was given
                reg = self._registered[id(p)]
                state = self._client.export_state(info.name)
                p.copy_(torch.from_numpy(state.params).reshape(p.shape).to(p.dtype))
                reg.step = info.min_step
                last = info.last_step
                seen = newest.get(id(group))
                if seen is None or (last is not None
                                    and (seen[1] is None or last["step"] > seen[1]["step"])):
                    newest[id(group)] = (group, last, info.name, reg.hyperparameters[0])
        if sharded:
            # This rank holds its share of the job: the records of the others' groups
            # decide too (each rank then takes the same hyperparameters).
            listed = {g.name: g for g in self._client.list_groups()
                      if g.name.startswith(self._name_prefix)}
            for _, name, group in self._names():
                info = listed.get(name)
                last = info.last_step if info is not None else None
                seen = newest.get(id(group))
                if last is None:
                    continue
                if seen is None:
                    newest[id(group)] = (group, last, name, info.lr)
                elif seen[1] is None or last["step"] > seen[1]["step"]:
                    newest[id(group)] = (group, last, name, seen[3])
        self._torn_hyperparameters = {}
        for group, last, name, registered_lr in newest.values():
            if last is None:
                warnings.warn(
                    f"RemoteAdamW(resume='daemon'): the daemon holds no record of the "
                    f"hyperparameters of group '{name}''s last step (it restarted "
                    "since, restoring from a checkpoint); param_groups keep the values "
                    "given here: restore lr from your own checkpoint", stacklevel=4)
                continue
            # The daemon's registered lr: the job's base lr, whatever this constructor got.
            group.setdefault("initial_lr", registered_lr)
            group["lr"] = last["lr"]
            self._resumed_lrs[id(group)] = last["lr"]
            group["betas"] = tuple(last["betas"])
            group["eps"] = last["eps"]
            group["weight_decay"] = last["weight_decay"]
            group["maximize"] = last["maximize"]
            if last["step"] == high:
                # The step that finishes a torn step `high` applies these to the rest.
                self._torn_hyperparameters[id(group)] = dict(
                    lr=last["lr"], betas=tuple(last["betas"]), eps=last["eps"],
                    weight_decay=last["weight_decay"], maximize=last["maximize"])
            elif any(0 < info.max_step and info.min_step < high for _, _, info in found):
                warnings.warn(
                    f"RemoteAdamW(resume='daemon', finish_torn_step=True): none of the "
                    f"parameters of the param group of '{name}' got step {high} before the "
                    f"job stopped, so no record holds its lr of step {high}: its "
                    f"param_groups entry holds step {last['step']}'s. Set it to step "
                    f"{high}'s before the step() that finishes step {high}", stacklevel=4)
        self.resumed_step = high
        # A torn step (check_resume let it through: finish_torn_step): the first step()
        # steps the groups behind only. Groups never stepped (frozen) are not behind,
        # but for those of parameters that require grad when the job is at step 1 (a
        # torn first step: unreached_by_step_one). The job's: every rank of a sharded job finishes it, those whose share is at step k
        # sending nothing in that step().
        finish = torn_step_to_finish(job, high)
        if sharded:
            # Each rank knows requires_grad of its own share only: a first step torn in
            # one rank's share is finished on every rank.
            flag = torch.tensor([1 if finish else 0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._process_group)
            finish = bool(flag.item())
        if finish:
            self._finish_to = high
        if sharded:
            # Each rank took the daemon's values of its own share only: the rest from
            # their owners, or the first forward pass runs on the fresh initial values.
            self._broadcast()
        return high

    def _refuse_renamed_parameters(self, attached: list) -> None:
        """Parameters that had no group (`attached`: what registration found): renamed
        parameters leave the job's trained groups of the old names there, named by no
        parameter of this optimizer (their state would stay on the daemon, the new names
        starting from step 0, or from load_state_dict() with the old groups still counted
        in the job's steps and rewinds). Refuses (FailedPrecondition) when such groups
        exist. resume="state_dict" otherwise takes new groups beside trained ones (a
        daemon of the job that lost its state)."""
        known = {name for _, name, _ in self._names()}
        listed = [g for g in self._client.list_groups() if g.name.startswith(self._name_prefix)]
        orphans = sorted(g.name for g in listed if g.name not in known and g.max_step > 0)
        if orphans:
            trained = {g.name for g in listed if g.max_step > 0}
            new = [a.name for a in attached if a.created and a.name not in trained]
            raise errors.FailedPrecondition(
                f"job '{self._name_prefix}' has trained groups no parameter of this model "
                f"names (e.g. '{orphans[0]}', {len(orphans)} in all) and {len(new)} of the "
                f"model's parameters have none trained (e.g. '{new[0] if new else '-'}'): "
                "renamed parameters. "
                "torch.compile's '_orig_mod.' and DDP/FSDP's 'module.' are stripped already; "
                "rename them back, or delete the old groups (optstate.Client.delete) to "
                "load_state_dict() into the new names")

    def _allocate_shared(self, params: list[torch.Tensor]) -> Optional[tuple]:
        """A new shared buffer with a 64-byte aligned slice for the values and one for the
        gradient of each of `params` whose values travel as they are, and where those lie:
        (buffer, [(parameter, values offset, gradient offset, bytes)]); None when no
        parameter is to be placed."""
        placed, total = [], 0
        for p in params:
            if p.dtype is torch.float32 and self._wire is not None:
                continue  # narrowed by the client: it cannot be stepped in place
            if self._staging.wants(p):
                continue  # staged: its host slots are in a buffer of the staging's own
            nbytes = p.numel() * p.element_size()
            placed.append((p, total, total + (nbytes + 63) // 64 * 64, nbytes))
            total += 2 * ((nbytes + 63) // 64 * 64)
        if not placed:
            return None
        return torch.from_numpy(self._client.allocate_shared_buffer(total)), placed

    def _move_into_shared(self, buffer: torch.Tensor, placed: list) -> None:
        """Makes each placed parameter's values (and gradient, if any) its slices of
        `buffer`, values kept."""
        self._buffers.append(buffer)
        with torch.no_grad():
            for p, values_at, grad_at, nbytes in placed:
                values = buffer[values_at:values_at + nbytes].view(p.dtype).view(p.shape)
                values.copy_(p.detach())
                p.data = values
                grad = buffer[grad_at:grad_at + nbytes].view(p.dtype).view(p.shape)
                if p.grad is not None:
                    grad.copy_(p.grad)
                    p.grad = grad
                self._shared_grads[id(p)] = grad
                self._shared_buffer_of[id(p)] = grad.untyped_storage().data_ptr()

    @staticmethod
    def _check_registrable(p: torch.Tensor, name: str) -> None:
        if p.is_sparse or not (p.is_cpu or p.is_cuda):
            raise ValueError(f"parameter '{name}': RemoteAdamW steps dense CPU or CUDA tensors "
                             f"(this one is {p.layout} on {p.device})")
        if p.dtype not in _WIRE_NAMES:
            raise TypeError(f"parameter '{name}': dtype {p.dtype} is not supported "
                            "(float32, bfloat16 or float16)")
        if any(stride == 0 and size > 1 for size, stride in zip(p.shape, p.stride())):
            # torch's in-place update refuses it too (more than one element would be
            # written through one memory location).
            raise ValueError(f"parameter '{name}' (shape {tuple(p.shape)}, strides "
                             f"{tuple(p.stride())}) repeats one memory location along a "
                             "dimension (an .expand()ed tensor): torch.optim.AdamW cannot "
                             "step it in place either. Give it memory of its own "
                             "(.clone() or .contiguous())")
        if p.numel() == 0:
            # torch's AdamW steps it as a no-op; a daemon group holds at least one element.
            raise ValueError(f"parameter '{name}' has no elements (shape {tuple(p.shape)}), "
                             "which a daemon group cannot hold: leave it out of the "
                             "optimizer's params (it has nothing to train)")

    def _check_edited(self, edited: list) -> None:
        """Refuses (ValueError, before anything is sent) values given to parameters since
        their last step ((parameter, registration) each) that construction would have
        refused: memory repeated along a dimension, or, where a parameter's .data moved
        (`b.data = a.data`), memory shared with another parameter of this optimizer."""
        for p, reg in edited:
            self._check_registrable(p, reg.name)
        if all(p.data_ptr() == reg.pointer for p, reg in edited):
            return  # edited in place: no memory changed hands
        entries = []
        for group in self.param_groups:
            for q in group["params"]:
                reg = self._registered.get(id(q))
                if reg is not None:
                    entries.append((q, reg.name, group))
        pair = _shared_memory_pair(entries)
        if pair is not None:
            raise ValueError(_shares_memory_message(pair) + "; nothing was stepped")

    def _travels_narrowed(self, p: torch.Tensor) -> bool:
        """Whether p's values travel in 16 bits (so the daemon's fp32 master weights are
        more than p holds)."""
        return p.dtype in _SIXTEEN_BIT or self._wire is not None

    def _register(self, p: torch.Tensor, name: str, group: dict,
                  hyperparameters: Optional[tuple] = None):
        """Registers p as daemon group `name` with its param group's hyperparameters (or
        `hyperparameters`, those of an earlier registration to attach to again); returns
        the daemon's GroupInfo."""
        self._check_registrable(p, name)
        h = hyperparameters if hyperparameters is not None else _hyperparameters(group)
        values = p.detach().reshape(-1).to("cpu", torch.float32).contiguous()
        info = self._client.register(name, values, **_register_keywords(h))
        self._remember(p, name, h, info.min_step, created=info.created)
        return info

    def _register_with_the_daemons(self, refused: list, found: list) -> None:
        """Construction's registrations refused ALREADY_EXISTS ((parameter, name, param
        group, the error) each): the job's groups, registered with other hyperparameters
        than this optimizer was given (a restarted job given other values), when any of
        the job's groups is trained; registered again with the daemon's, into `found`
        (each step sends the param group's own values where they differ, and
        check_resume judges them as any). Else, or for another number of elements, the
        first refusal is raised again: untrained groups alone are another job's. Another
        amsgrad is AlreadyExists saying so: amsgrad keeps one moment more."""
        described = [(p, name, group, error, self._client.describe(name))
                     for p, name, group, error in refused]
        if not any(info.max_step > 0 for _, _, info in found) and \
                not any(info.max_step > 0 for *_, info in described) and \
                (self._rank_and_world()[1] == 1 or self._job_step() == 0):
            raise refused[0][3]
        for p, name, group, error, info in described:
            if info.num_elements != p.numel():
                raise error
            amsgrad = bool(group["amsgrad"])
            if info.amsgrad != amsgrad:
                raise errors.AlreadyExists(
                    f"group '{name}' was registered with amsgrad={info.amsgrad}, and this "
                    f"optimizer's param group has amsgrad={amsgrad}: amsgrad keeps one moment "
                    "more (max_exp_avg_sq), so a job cannot change it on the daemon. "
                    f"Construct the optimizer with amsgrad={info.amsgrad}, or start a new job "
                    "(another name_prefix)")
            registered = (info.lr, tuple(info.betas), info.eps, info.weight_decay,
                          info.maximize, info.amsgrad)
            found.append((p, group, self._register(p, name, group, registered)))

    def _remember(self, p: torch.Tensor, name: str, hyperparameters: tuple, step: int,
                  created: bool = False) -> None:
        wire = _WIRE_NAMES[p.dtype] if p.dtype in _SIXTEEN_BIT else self._wire
        # Equal tuples shared, so step() knows them by id (overrides_by_registration).
        hyperparameters = self._hyperparameter_tuples.setdefault(hyperparameters,
                                                                 hyperparameters)
        self._registered[id(p)] = _Registration(p, name, p.shape, hyperparameters, step, wire,
                                                p.dtype, created, p._version, p.data_ptr(),
                                                p.stride(), p.is_contiguous())

    def _note_values(self, p: torch.Tensor) -> None:
        """p's values are the daemon's now (written or read back by this optimizer)."""
        reg = self._registered.get(id(p))
        if reg is not None:
            reg.version, reg.pointer, reg.strides = p._version, p.data_ptr(), p.stride()
            reg.contiguous = p.is_contiguous()

    def _adopt_values(self, p: torch.Tensor, reg: _Registration) -> None:
        """torch.optim.AdamW steps a parameter from the values it holds; the daemon steps its
        own copy of them (the master weights). So values p was given since the daemon last
        wrote it (pretrained weights loaded after the optimizer was made, clipping, pruning,
        an EMA copied in: what bumps its version counter, or other memory set as p.data) are
        imported into the daemon before p steps, with the group's moments and page steps as
        they are. Values equal to the daemon's as they travel import nothing (the master
        weights of a 16-bit parameter keep their precision). Edits made through ``p.data``
        in place bump no version counter, for torch's autograd either: make them under
        ``torch.no_grad()`` on p itself.

        Only while the daemon's pages are at the step this optimizer last knew them at: a
        data-parallel rank (or a copy of this optimizer) that stepped the group since has
        stepped from its own copy of these values, and this step is then a replay that
        brings its results back. Elements whose values did not change keep the daemon's
        (a 16-bit parameter keeps its float32 master weights where it was not edited)."""
        self._staging.wait_for_values()
        state = self._client.export_state(reg.name)
        if any(int(s) != reg.step for s in state.page_steps):
            reg.version, reg.pointer, reg.strides = p._version, p.data_ptr(), p.stride()
            reg.contiguous = p.is_contiguous()
            return
        current = p.detach().reshape(-1).to("cpu").contiguous()
        held = torch.from_numpy(state.params)
        narrow = (p.dtype if p.dtype in _SIXTEEN_BIT
                  else _WIRE_DTYPES[self._wire] if self._wire is not None else None)
        as_held = held.to(narrow).to(p.dtype) if narrow is not None else held
        bits = torch.int16 if p.element_size() == 2 else torch.int32
        same = as_held.view(bits) == current.view(bits)
        if not bool(same.all()):
            params = torch.where(same, held, current.to(torch.float32)).contiguous()
            # The edited elements only: the daemon's own values may hold a diverged run's
            # nan or inf, which it took and steps on.
            if not bool(torch.isfinite(current.to(torch.float32)[~same]).all()):
                raise errors.InvalidArgument(
                    f"parameter '{reg.name}' was given values that are not finite (nan or "
                    "inf) since its last step; nothing was sent")
            max_exp_avg_sq = (torch.from_numpy(state.max_exp_avg_sq)
                              if state.max_exp_avg_sq is not None else None)
            self._client.import_state(reg.name, params, torch.from_numpy(state.exp_avg),
                                      torch.from_numpy(state.exp_avg_sq),
                                      [int(s) for s in state.page_steps],
                                      max_exp_avg_sq=max_exp_avg_sq, accept_non_finite=True,
                                      **_register_keywords(reg.hyperparameters))
        reg.version, reg.pointer, reg.strides = p._version, p.data_ptr(), p.stride()
        reg.contiguous = p.is_contiguous()

    def _casts_regroup(self) -> bool:
        """Whether a parameter cast before the first step may have its group registered
        anew: by its only stepper (one process, or shard=True's owner), and not with
        shared_buffers=True (whose gradient slots were made in the old dtype).
        Data-parallel ranks without shard share each group, and one rank's new
        registration could delete a group another rank has stepped meanwhile."""
        if self._shared_buffers:
            return False
        return self._shard or not (dist.is_available() and dist.is_initialized()
                                   and dist.get_world_size() > 1)

    @staticmethod
    def _check_step(p: torch.Tensor, grad: torch.Tensor, reg: _Registration,
                    staged_on: Optional[torch.device] = None) -> None:
        """Refuses (before anything is sent) a parameter or gradient this step cannot take."""
        if p.shape != reg.shape:
            raise ValueError(
                f"parameter '{reg.name}' has shape {tuple(p.shape)} but was registered with "
                f"{tuple(reg.shape)}; a resized parameter needs a new optimizer (or name)")
        if p.dtype != reg.dtype:
            raise TypeError(f"parameter '{reg.name}' is {p.dtype} but was registered as "
                            f"{reg.dtype}; a parameter of another dtype needs a new optimizer "
                            "(cast the model before making the optimizer, or before its "
                            "first step)")
        if staged_on is not None and p.device != staged_on:
            raise ValueError(
                f"parameter '{reg.name}' was registered on device '{staged_on}' and is now on "
                f"'{p.device}'; move the model before making the optimizer (or make a new "
                "one); nothing was sent")
        if not (p.is_cpu and grad.is_cpu) and not (staged_on is not None
                                                   and grad.device == staged_on):
            raise ValueError(
                f"parameter '{reg.name}': RemoteAdamW steps CPU or CUDA tensors with the "
                f"gradient on the parameter's device, and this parameter is on device "
                f"'{p.device}' with its gradient on '{grad.device}'; nothing was sent")
        if grad.layout != torch.strided:
            raise SparseGradientError(f"parameter '{reg.name}': sparse gradients are not "
                                      f"supported (this one is {grad.layout}), as by "
                                      "torch.optim.AdamW; nothing was sent")
        if grad.dtype != p.dtype or grad.shape != p.shape:
            raise TypeError(f"parameter '{reg.name}': gradient {grad.dtype} "
                            f"{tuple(grad.shape)} does not match the parameter's "
                            f"{p.dtype} {tuple(p.shape)}")

    # -- stepping -------------------------------------------------------------------------

    # Never traced by torch.compile (torch's "compile the optimizer step" recipe): the step
    # is calls to the daemon; a compiled caller runs it as it is, at a graph break (inside
    # hooked_step, whose wrapper must stay the class's step).
    @hooked_step
    @eager_only
    @without_grad
    def step(self, closure: Optional[Callable[[], Any]] = None):
        """Performs one optimization step (see the class docstring). Returns the closure's
        loss when given one."""
        self._check_not_forked()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._finish_to is None:
            self._step_parameters()
        else:
            self._finish_torn_step_now()
        return loss

    def _check_not_forked(self) -> None:
        """RuntimeError in a process forked from the one that made this optimizer (step,
        state_dict, load_state_dict, add_param_group, resume_scheduler): the
        connection it inherited is its parent's (gRPC's does not survive a fork; the parent's
        next call then waited for attempt_timeout), and so are the groups."""
        made_in = getattr(self, "_pid", None)  # None while torch's __init__ adds groups
        if made_in is not None and os.getpid() != made_in:
            raise RuntimeError(
                f"this RemoteAdamW was made in process {self._pid}; process {os.getpid()} is a "
                "fork of it, and a fork cannot use the parent's connection to the daemon, nor "
                "step the parent's groups. Make the optimizer in the child (its own "
                "name_prefix), or fork before making it")

    def _finish_torn_step_now(self) -> None:
        """The step() that finishes a torn step k: the parameters behind are stepped to k
        with the hyperparameters the others got step k with (the daemon's record), where a
        param group has such a record, whatever its entry holds now (resume_scheduler() may
        have moved lr on to step k + 1's already)."""
        held = {}
        for group in self.param_groups:
            record = self._torn_hyperparameters.get(id(group))
            if record is not None:
                held[id(group)] = {key: group[key] for key in record}
                group.update(record)
        try:
            self._step_parameters()
        finally:
            for group in self.param_groups:
                if id(group) in held:
                    group.update(held[id(group)])
        for group in self.param_groups:
            if id(group) not in self._torn_hyperparameters and id(group) in self._resumed_lrs:
                self._resumed_lrs[id(group)] = _as_float(group["lr"])  # step k's, as set

    def _step_parameters(self) -> None:
        """step() after its closure: the calls planned and checked, then made. With
        shard=True every rank plans its own share, and any rank's refusal while planning
        (a gradient that is not finite, hyperparameters the daemon would refuse, amsgrad
        changed, a wrong type) refuses the step on every rank before any sends: refused
        alone, it left the other ranks' shares applied (a torn step) and them waiting at
        the broadcast that follows (a hang)."""
        sharded = self._rank_and_world()[1] > 1
        try:
            plan = self._plan_step_calls(sharded)
        except Exception as refusal:
            if sharded:
                self._agree_across_ranks(refusal)
            raise
        if sharded:
            self._agree_across_ranks(None)
        self._make_step_calls(plan)

    def _agree_across_ranks(self, refusal: Optional[BaseException]) -> None:
        """shard=True: every rank says, in one all_reduce, whether it refused its share of
        the step (`refusal`, or None); raises on every rank when one did (this rank's own
        refusal, noted, or InvalidArgument saying another rank refused)."""
        refused = torch.tensor([0 if refusal is None else 1])
        dist.all_reduce(refused, op=dist.ReduceOp.MAX, group=self._process_group)
        if isinstance(refusal, errors.Error):
            raise _keeping_not_stepped(refusal, type(refusal)(
                f"{refusal.message} by any rank (shard=True: every rank refuses this step)",
                refusal.target, refusal.code_value)) from refusal
        if refusal is not None:
            return  # The caller raises it as it is (a ValueError, a TypeError).
        if refused.item():
            raise errors.InvalidArgument(
                "another rank's share of the parameters refused this step (a gradient that "
                "is not finite, or hyperparameters the daemon would refuse: that rank's "
                "error names its group); the whole step was refused on every rank and "
                "nothing was sent")

    def _agree_on_calls(self, failure: Optional[BaseException]) -> None:
        """shard=True, after this rank's calls: every rank says, in one all_reduce, whether
        a call of its share failed (`failure`, or None), before any rank broadcasts. A
        rank whose own calls all succeeded raises the failed rank's error class, saying
        so; a rank that failed returns and raises its own. Without it, the ranks that
        succeeded waited in the broadcast for the one that failed, whose step() again (as
        its error says) waited in the next step's agreement: both hung."""
        code = 0 if failure is None else (
            failure.code_value if isinstance(failure, errors.Error) else 2)  # 2: UNKNOWN
        codes = torch.tensor([code])
        dist.all_reduce(codes, op=dist.ReduceOp.MAX, group=self._process_group)
        if failure is not None or codes.item() == 0:
            return
        raise errors.from_status(
            int(codes.item()),
            "another rank's share of this step failed at the daemon (that rank's error says "
            "why); this rank's share was applied. Call step() again on every rank with the "
            "same gradients once the daemon is back: what was applied is replayed, not "
            "applied twice, and the rest is applied")

    def _plan_step_calls(self, sharded: bool) -> SimpleNamespace:
        """Step 1 of _step_parameters: the calls and all they need, every check made."""
        # 1. Every parameter with a gradient checked before anything is sent; the calls
        #    grouped by what one Client.step call shares: the step number and the wire
        #    type (each group carries its own lr, and the other hyperparameters its param
        #    group holds now where they differ from the registered ones, as torch reads
        #    them all at every step). The work per parameter is kept to attribute reads:
        #    what registration fixed is in its _Registration.
        calls: dict[tuple, list] = {}
        stepped: dict[tuple, list] = {}
        edited: list = []  # (parameter, registration) given values since its last step
        unstrided: dict[tuple, list] = {}  # by call: (parameter, its values in order)
        staged: dict[tuple, list] = {}  # by call: its parameters stepped through host slots
        staging = self._staging
        staging_engaged = staging.engaged  # False: no parameter of this step is staged
        registered = self._registered
        strided = torch.strided
        shared_grads = self._shared_grads
        rank, _ = self._rank_and_world()
        if self._closed:
            raise ValueError("this RemoteAdamW was closed; make a new one to step")
        if self._listed_twice is not None:
            raise ValueError(
                f"parameter '{self._listed_twice}' is listed twice in the optimizer's params "
                "(a weight tied between two modules, listed once for each?), which torch "
                "warned of: torch.optim.AdamW steps it twice a step, and RemoteAdamW does "
                "not. List it once (model.parameters() lists a tied weight once); nothing "
                "was sent")
        if self._awaiting_load is not None:
            raise errors.FailedPrecondition(
                f"RemoteAdamW(resume='state_dict'): {self._awaiting_load}, and "
                "load_state_dict() has not been called: a step now would continue the "
                "daemon's state with this model's gradients and overwrite the model with the "
                "daemon's values. Call load_state_dict() with your checkpoint's optimizer "
                "state first, or attach with resume='daemon' to continue from the daemon's")
        # Whether the gradients are those clip_grad_norm_ measured, unchanged since.
        clip_unchanged = (self._grad_scale is not None
                          and self._keep_clip_for_the_gradients_it_measured())
        finish_to = self._finish_to  # a torn step being finished: only the groups behind
        # The common case (CPU parameters, none staged or torn, all at one step and wire
        # type, gradients in their shared slots if any) in C++, which leaves the rest to
        # the loop below: a model's hundreds of tensors then cost about half as much a step
        # (prepared_step.h).
        prepared = None
        if not staging_engaged and finish_to is None:
            prepared = _prepare_param_step(
                [(group["params"], _as_float(group["lr"]), group) for group in self.param_groups],
                registered, self._owner, rank, shared_grads, self._step_plan)
        if prepared is not None:
            if len(prepared):
                key = (prepared.step, prepared.wire)
                calls[key], stepped[key] = prepared, prepared.registrations
        # Gradients in another parameter's slot, read before any slot is written.
        elsewhere = (self._gradients_in_other_slots()
                     if prepared is None and shared_grads else None)
        for index, group in enumerate(self.param_groups if prepared is None else ()):
            lr = _as_float(group["lr"])
            # By the id of a registration's hyperparameters tuple (_remember shares equal
            # ones): hashing the tuple itself cost more than the lookup.
            overrides_by_registration: dict[int, Optional[dict]] = {}
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                reg = registered.get(id(p))
                if reg is None:
                    if self._owner.get(id(p), rank) != rank:
                        continue  # another rank steps it
                    raise ValueError(f"a parameter of param group {index} was never "
                                     "registered; add parameters with add_param_group()")
                if finish_to is not None and reg.step >= finish_to:
                    continue
                if (p._version != reg.version or p.data_ptr() != reg.pointer
                        or p.stride() != reg.strides):
                    edited.append((p, reg))
                # Staged: its host slots were made for the device it is on (a parameter
                # frozen at registration gets them at its first gradient). A CPU parameter
                # while staging is not engaged is neither staged nor wanted (wants(p)).
                on_cpu = p.is_cpu
                if staging_engaged or not on_cpu:
                    staged_on = staging.device_of(p)
                    if staged_on is None and staging.wants(p):
                        staging.add([(p, reg.name)], self._client)
                        staged_on = staging.device_of(p)
                else:
                    staged_on = None
                # All _check_step checks in one expression; it names what is wrong.
                if not ((p.device == staged_on and grad.device == staged_on
                         if staged_on is not None else (on_cpu and grad.is_cpu))
                        and grad.layout is strided
                        and p.dtype is reg.dtype and grad.dtype is reg.dtype
                        and p.shape == reg.shape and grad.shape == reg.shape):
                    if (p.dtype is not reg.dtype and reg.step == 0 and staged_on is None
                            and on_cpu and self._casts_regroup()):
                        # A model cast (model.to(torch.bfloat16)) after the optimizer was
                        # made and before its first step: torch's AdamW holds no state yet
                        # and takes it; the group, never stepped, is registered anew from
                        # the cast values.
                        self._check_registrable(p, reg.name)
                        self._import(p, reg.name, group,
                                     self._check_entry(p, reg.name, group, None), None)
                        reg = registered[id(p)]
                        if edited and edited[-1][0] is p:
                            edited.pop()  # the new registration holds the cast values
                    self._check_step(p, grad, reg, staged_on)
                h = id(reg.hyperparameters)
                if h in overrides_by_registration:
                    overrides = overrides_by_registration[h]
                else:
                    overrides = overrides_by_registration[h] = reg.overrides(group)
                key = (reg.step + 1, reg.wire)
                if grad.requires_grad:  # backward(create_graph=True)
                    grad = grad.detach()
                if staged_on is not None:
                    # Its host slots: the gradient copied there (unless a copy of this very
                    # gradient is there already), the values written there by the daemon.
                    entry = (reg.name, staging.gradient(p, grad), staging.values(p), lr,
                             overrides)
                    staged.setdefault(key, []).append(p)
                else:
                    if shared_grads:
                        grad = self._into_shared(p, grad, elsewhere)
                    elif not grad.is_contiguous():
                        grad = grad.contiguous()  # the daemon reads elements in order
                    # p.data: the parameter's memory without autograd (cheaper than detach()).
                    values = p.data
                    if not values.is_contiguous():
                        # A channels_last or strided parameter: the daemon writes its values
                        # in order here, and they are copied into p after the call.
                        values = torch.empty(p.shape, dtype=p.dtype)
                        unstrided.setdefault(key, []).append((p, values))
                    entry = (reg.name, grad, values, lr, overrides)
                if key in calls:
                    calls[key].append(entry)
                    stepped[key].append(reg)
                else:
                    calls[key], stepped[key] = [entry], [reg]
        if edited:
            self._check_edited(edited)
        for p, reg in edited:
            self._adopt_values(p, reg)
        for params in staged.values():
            staging.wait_for_gradients(params)
            staging.recopy_changed(params)
        # clip_grad_norm_'s scale, applied by the daemon to every gradient of this step.
        grad_scale = None
        if self._grad_scale is not None and calls:
            grad_scale = staging.scalar_to_host(self._grad_scale)
        if grad_scale is not None and not math.isfinite(grad_scale):
            raise errors.InvalidArgument(
                f"the step's grad_scale (clip_grad_norm_'s clipping coefficient) is "
                f"{grad_scale}: the gradients' norm is not finite; the whole step was refused "
                "and nothing was sent (make the gradients finite, then call clip_grad_norm_ "
                "again or set new .grad tensors)")
        # torch's clip scales float32 gradients before anything narrows them. So a call
        # that narrows only float32 gradients to a 16-bit wire has them scaled here, by
        # torch's multiply, and goes without grad_scale: the wire carries clipped values (a
        # float16 one could not hold some unclipped ones). A call that also carries 16-bit
        # gradients (of 16-bit parameters) keeps grad_scale for all of them: the daemon
        # scales those after widening, in float32, which a multiply here would round.
        scaled_here = set()
        if grad_scale is not None:
            for key, groups in calls.items():
                if key[1] is not None and all(g.dtype is torch.float32 for _, g, *_ in groups):
                    calls[key] = _scaled(groups, self._grad_scale)
                    scaled_here.add(key)
        norm_finite = (grad_scale is not None and self._grad_norm_type > 0
                       and 0.0 < grad_scale <= 1.0 and clip_unchanged)
        # One call checks its own gradients and hyperparameters before it applies
        # anything; with several, a later call's refusal would come after earlier ones
        # were applied, and with shard=True another rank's share (the caller agrees).
        checked_by_ranks = sharded and not norm_finite and bool(calls)
        if len(calls) > 1 or checked_by_ranks:
            self._check_finite(calls)
        if len(calls) > 1 or sharded:
            self._check_step_hyperparameters(calls, stepped)
        # Whether every gradient is known finite as sent, so the daemon may check each as
        # it applies it (one read of it, not two; Client.step's gradients_checked): checked
        # just above, for several calls or the ranks' agreement (and a grad_scale of at most 1 in magnitude cannot make it overflow),
        # or clip_grad_norm_'s norm of these very gradients was finite (its coefficient
        # > 0: an infinite norm gives 0, NaN gives NaN), which every gradient then is,
        # unless a float32 one is narrowed to a 16-bit wire type on the way.
        checked_here = ((len(calls) > 1 or checked_by_ranks)
                        and (grad_scale is None or abs(grad_scale) <= 1.0))
        return SimpleNamespace(calls=calls, stepped=stepped, staged=staged,
                               unstrided=unstrided, grad_scale=grad_scale,
                               scaled_here=scaled_here, norm_finite=norm_finite,
                               checked_here=checked_here)

    def _make_step_calls(self, plan: SimpleNamespace) -> None:
        """Step 2 of _step_parameters: the calls planned (_plan_step_calls)."""
        calls, stepped, staged, unstrided = plan.calls, plan.stepped, plan.staged, plan.unstrided
        grad_scale, scaled_here = plan.grad_scale, plan.scaled_here
        norm_finite, checked_here = plan.norm_finite, plan.checked_here
        staging = self._staging
        # 2. The calls; each writes the updated values into the parameters in place. The
        #    bookkeeping of a call is done before it, while this code's data is still in
        #    the caches (the call moves every byte of the model through them), and undone
        #    when a call fails, for that call and every call before it that the daemon
        #    answered: the next step() repeats step k for all of them (the daemon replays
        #    what it applied), instead of stepping those answered to k + 1 with this
        #    step's gradients.
        made = []  # the keys of the calls made so far
        sharded = self._rank_and_world()[1] > 1

        def undo_made() -> None:
            for undone in made:  # key == (reg.step + 1, ...): each was at step k - 1
                for reg in stepped[undone]:
                    reg.step = undone[0] - 1

        for key, groups in calls.items():
            k, wire = key
            regs = stepped[key]
            for reg in regs:
                reg.step = k
            made.append(key)
            checked = checked_here or (norm_finite and (wire is None or not _any_float32(groups)))
            try:
                self._client.step(groups, k, wire_dtype=wire,
                                  grad_scale=None if key in scaled_here else grad_scale,
                                  gradients_checked=checked)
                # Inside: a failure to take the values back is this rank's failure too,
                # agreed with the others (the next step() replays the call).
                if key in staged:
                    staging.copy_values_back(staged[key])
                for p, values in unstrided.get(key, ()):
                    p.data.copy_(values)  # p.data: no version counter moves (_adopt_values)
            except BaseException as e:
                undo_made()
                if sharded and not isinstance(e, (KeyboardInterrupt, SystemExit)):
                    # The other ranks learn of it before their broadcast (_agree_on_calls).
                    self._agree_on_calls(e)
                if isinstance(e, (errors.FailedPrecondition, errors.NotFound)):
                    self._explain_restart(e, k - 1)
                if isinstance(e, errors.FailedPrecondition) and "; a replay must name" in e.message:
                    why = ("another trainer steps this job, or a copy of this optimizer does"
                           if self._shard else
                           "without shard=True every data-parallel rank steps every "
                           "parameter, so each must have a gradient for the same parameters "
                           "at every step (a gradient that is None on some ranks only, or a "
                           "rank that skipped a step(), puts them apart; all-reduce the "
                           "gradients on every rank, as DDP does, or use shard=True); or "
                           "another trainer steps this job")
                    raise _keeping_not_stepped(e, errors.FailedPrecondition(
                        f"{e.message}. This optimizer stepped that group's parameter to step "
                        f"{k - 1} only, and another process stepped it further: {why}. "
                        "Attach again with resume='daemon' to go on from the daemon's state",
                        e.target, e.code_value)) from e
                if isinstance(e, _PART_WAY_FAILURES):
                    raise _keeping_not_stepped(e, type(e)(
                        f"{e.message}. step() failed during step {k}: the parameters of "
                        "any groups the daemon applied before the failure hold step "
                        f"{k}'s values already, the others are unchanged. Call step() "
                        "again with the same gradients once the daemon is back (what it "
                        "applied is replayed, not applied twice), or resume as "
                        "docs/jobs.md says (finish_torn_step=True)", e.target,
                        e.code_value)) from e
                raise
        if sharded:
            try:
                self._agree_on_calls(None)
            except BaseException:
                undo_made()  # this rank's share is replayed by the step() that repeats it
                raise
        self._finish_to = None
        if calls and self._grad_scale is not None:
            # torch's clip scaled .grad for good: a gradient it measured that is stepped
            # again unchanged is still the clipped one (_keep_clip_...).
            self._clip_stepped = True
        if self._shard:
            self._broadcast()

    # -- parameters on a GPU: clipping, overlap, DDP, memory -------------------------------

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False,
                        foreach: Optional[bool] = None) -> torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ over this optimizer's gradients, applied by the
        daemon: the total norm is computed where the gradients are (torch's
        ``get_total_norm``, so the same value), and torch's clipping coefficient
        ``min(max_norm / (norm + 1e-6), 1)`` goes to the next ``step()`` as its
        ``grad_scale``, one scalar, instead of rescaling every gradient in place (the
        gradients' host copies, made while backward ran, stay valid). The daemon multiplies
        each float32 gradient by it as torch's in-place multiply does, so the step is the
        same bit for bit. ``.grad`` is left unscaled. The coefficient is for the gradients
        it measured: a ``.grad`` that is a new tensor by ``step()`` steps unscaled, as after
        torch's clip (see _keep_clip_for_the_gradients_it_measured); a refused or failed
        step keeps it for its retry. Called again, it measures the gradients as torch's
        second clip would, clipped (_scale_as_an_earlier_clip_would_have). Call it after
        the last backward of the step; returns the total norm, as torch's. ``torch.nn.utils.clip_grad_norm_`` works
        too: it changes the gradients in place, and ``step()`` then copies them again."""
        self._scale_as_an_earlier_clip_would_have()
        grads = [p.grad for group in self.param_groups for p in group["params"]
                 if p.grad is not None]
        if not grads:
            self._grad_scale = None
            self._clipped, self._clipped_at = [], {}
            return torch.tensor(0.0)
        total_norm = torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite,
                                                   foreach)
        self._grad_scale = torch.clamp(float(max_norm) / (total_norm + 1e-6), max=1.0)
        self._grad_norm_type = float(norm_type)
        self._clip_stepped = False
        self._clipped = [(g, g._version, self._own_writes(g)) for g in grads]
        self._clipped_at = {id(g): i for i, g in enumerate(grads)}
        return total_norm

    def _scale_as_an_earlier_clip_would_have(self) -> None:
        """Before clip_grad_norm_ measures again: torch's clip scaled the gradients it
        measured in place, so a second clip (or one after a step that left the gradients
        as they were) measures the clipped ones and scales them again. Where every
        gradient an earlier call measured is unchanged (new tensors in .grad since are
        not its), those are scaled now by its coefficient, with torch's own multiply (so
        the new measurement and the step see torch's values, rounding included). Where
        one was changed in place since, before any step, the new measurement stands
        alone, unscaled: that is the documented way on after a refused step ("changed in
        place after opt.clip_grad_norm_() measured it"), and torch's order (clip, then
        the change) cannot be redone anyway. After a step, a changed gradient is a new
        one (zero_grad() and a backward) and is left as it is. The coefficient goes."""
        scale = self._grad_scale
        if scale is None:
            return
        at, clipped, after_step = self._clipped_at, self._clipped, self._clip_stepped
        measured, changed = [], False
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                i = at.get(id(g)) if g is not None else None
                if i is None or clipped[i][0] is not g:
                    continue
                if self._unchanged(clipped[i]):
                    measured.append(g)
                elif not after_step:
                    changed = True
        self._grad_scale = None
        self._clipped, self._clipped_at = [], {}
        self._clip_stepped = False
        if not changed:
            for g in measured:
                g.mul_(scale.to(g.device))

    def _own_writes(self, t: torch.Tensor) -> int:
        """The copies this optimizer made into the shared buffer `t` is a view of (0 for a
        tensor of its own): they moved t's version counter too."""
        if not self._shared_writes or t._base is None:
            return 0
        return self._shared_writes.get(t.untyped_storage().data_ptr(), 0)

    def _unchanged(self, entry: tuple) -> bool:
        """Whether a gradient _clipped holds was written to by no one but this optimizer's
        copies into the other slots of its shared buffer since it was measured."""
        t, version, writes = entry
        return t._version == version + self._own_writes(t) - writes

    def _registered_name(self, p: torch.Tensor) -> str:
        """p's daemon group name (or its name to be, for a parameter not registered)."""
        reg = self._registered.get(id(p))
        if reg is not None:
            return reg.name
        return next((name for q, name, _ in self._names() if q is p), "?")

    def _keep_clip_for_the_gradients_it_measured(self) -> bool:
        """clip_grad_norm_'s coefficient stands for torch's in-place scaling of the
        gradients it measured, so it is not applied to a .grad that is a new tensor since
        (a new backward with set_to_none, a gradient set by hand after a refused step):
        torch's clip never scaled that one. When no gradient is one it measured, the
        coefficient is dropped; when only some are, those are scaled now, in place, by
        torch's own multiply (as its clip would have), and the step goes without it. A
        gradient it measured that was changed in place since (torch's own clip after it,
        which measured the gradients unscaled; another backward adding into it) refuses the
        step, nothing sent: torch would have changed the clipped gradient, and no scale
        applied now gives that. After a step applied the coefficient, the gradients are
        torch's clipped ones for good: one stepped again unchanged is scaled again, and
        one changed in place since the step (zero_grad() and a new backward) is no longer
        the clipped one and steps unscaled. Returns whether the gradients are all those it
        measured (the same tensors in .grad, unchanged)."""
        at, clipped = self._clipped_at, self._clipped
        measured, count, after_step = [], 0, self._clip_stepped
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                count += 1
                i = at.get(id(g))
                if i is None or clipped[i][0] is not g:
                    continue
                if after_step and not self._unchanged(clipped[i]):
                    continue
                if not self._unchanged(clipped[i]):
                    raise errors.InvalidArgument(
                        f"the gradient of parameter '{self._registered_name(p)}' was changed "
                        "in place after opt.clip_grad_norm_() measured it (by "
                        "torch.nn.utils.clip_grad_norm_, another backward, or an in-place "
                        "op): torch's clip would have scaled it before that change, which "
                        "the clipping coefficient sent with the step cannot redo. Nothing "
                        "was sent. Call opt.clip_grad_norm_() once, after the last change "
                        "of the gradients, and use it or torch's clip, not both")
                measured.append(g)
        if len(measured) == count:
            return count == len(clipped)
        scale = self._grad_scale
        self._grad_scale = None
        self._clipped, self._clipped_at = [], {}
        self._clip_stepped = False
        for g in measured:
            g.mul_(scale.to(g.device))
        return False

    def wait_in_forward(self, model: torch.nn.Module) -> None:
        """Lets the next forward start before every parameter's new values are back on the
        GPU: each module of `model` waits (a stream wait, in a forward pre-hook) for the
        copies of its own staged parameters only. Without it, ``step()`` makes the current
        stream wait for all of them before it returns (still no host synchronize). Use it
        when every staged parameter is read inside the forward of a module that holds it."""
        self._staging.wait_in_forward(model)

    def register_ddp_comm_hook(self, ddp_model) -> None:
        """Registers on `ddp_model` (a DistributedDataParallel) a comm hook that all-reduces
        each bucket (the mean, as DDP's default) and then copies the bucket's gradients to
        their host slots at once: the moment they are final, overlapped with the rest of
        backward. Under ``no_sync()`` (gradient accumulation) DDP runs no comm hook, so only
        the last micro-batch's gradients are copied. Give the DDP model
        ``gradient_as_bucket_view=True``: otherwise DDP copies the bucket into ``.grad``
        afterwards and ``step()`` copies the gradients again."""
        ddp_model.register_comm_hook(None, self._staging.ddp_comm_hook(ddp_model.process_group))

    def stats(self) -> dict:
        """What this optimizer holds on this host: ``{"staging": {...}}`` with the host
        staging memory of its GPU parameters (``bytes`` in all; ``parameters``: per group
        name, bytes of its gradient and values slots, two times the parameter's bytes;
        ``kinds``: "shared_buffer" (shared with a daemon on this host), "pinned" or
        "host"), and how many gradients were copied early (in backward or DDP's comm hook)
        and at ``step()``, and how many values were copied back."""
        return {"staging": self._staging.stats()}

    def resume_scheduler(self, scheduler) -> None:
        """Puts a torch LR scheduler made for this optimizer where the resumed job's was:
        after ``resumed_step`` optimizer steps and as many scheduler steps (the trainer's
        loop is ``opt.step(); sched.step()``). Make it as at the job's start, then call
        this; it sets each param group's lr back to its last step's, puts the scheduler
        (and those a SequentialLR or ChainedScheduler holds, and a
        CosineAnnealingWarmRestarts' cycle) where the loop left them after
        ``resumed_step - 1`` steps and steps it once, as the loop did, so chainable
        schedules (ExponentialLR, ...) and closed-form ones (LambdaLR, ...) both go on
        with the lr of step ``resumed_step + 1``. ValueError unless this optimizer resumed
        (``resume="daemon"`` with the daemon's record of the last step), for a scheduler
        already stepped since it was made, and for ReduceLROnPlateau, whose lr depends on
        the metrics it was given (restore it from its state_dict())."""
        self._check_not_forked()
        if self.resumed_step == 0 or not self._resumed_lrs:
            raise ValueError("resume_scheduler() needs an optimizer made with resume='daemon' "
                             "that found the job at a step > 0, with the daemon's record of "
                             "the last step's lr")
        if getattr(scheduler, "optimizer", None) is not self:
            raise ValueError("the scheduler was made for another optimizer")
        _check_schedulers_fresh(scheduler)
        for group in self.param_groups:
            if id(group) in self._resumed_lrs:
                group["lr"] = self._resumed_lrs[id(group)]
        _place_scheduler(scheduler, self.resumed_step - 1)
        with warnings.catch_warnings():
            # torch warns when a scheduler steps before the optimizer: here the optimizer
            # stepped, on the daemon, before this process existed.
            warnings.simplefilter("ignore", UserWarning)
            scheduler.step()

    def _explain_restart(self, refusal: errors.Error, at: int) -> None:
        """Raises what happened when `refusal` (of a step from step `at`) came from a
        daemon that restarted since this optimizer attached (with several daemons: the
        first of them that did): when, whether it restored state and which step, and the
        ways on. Returns (the refusal stands) otherwise."""
        try:
            stats = self._client.stats()
        except errors.Error:
            return
        now = _started_times(stats)
        before = self._daemon_started or {}
        restarted = [m for m in now if m in before and now[m][0] != before[m][0]]
        if not restarted:
            return
        # The one whose refusal this is, when its name is in it ("daemon 'ID' (...)").
        member = next((m for m in restarted if f"daemon '{m}'" in refusal.message), restarted[0])
        started, has_state_dir, target = now[member]
        target = target or self._client.target
        import datetime
        when = datetime.datetime.fromtimestamp(started / 1e6,
                                               datetime.timezone.utc).isoformat(timespec="seconds")
        # (The error names the target first: "optstated at X: it restarted ...".)
        daemon = ("it" if not member or (member == target and len(now) == 1)
                  else f"optstated '{member}'" if member == target
                  else f"optstated '{member}' at {target}")
        groups = [g for g in self._client.list_groups()
                  if g.name.startswith(self._name_prefix) and (not member or g.member == member)]
        if isinstance(refusal, errors.FailedPrecondition) and any(
                g.lease is not None and not g.lease["expired"]
                and g.lease["holder"] != self._lease_holder for g in groups):
            # A restarted daemon holds no leases: another trainer attached since and steps
            # the job, and the refusal (which names it) is the news, not the restart.
            return
        if isinstance(refusal, errors.NotFound) or not has_state_dir:
            raise _keeping_not_stepped(refusal, type(refusal)(
                f"{daemon} restarted at {when} "
                f"{'without --state_dir' if not has_state_dir else 'without this group'}"
                f": this job's state (at step {at}) is gone there. Resume from your own "
                "checkpoint: a new RemoteAdamW(resume='state_dict') and load_state_dict()",
                target, refusal.code_value)) from refusal
        # The trained groups' steps: a frozen parameter's group stays at step 0 (as does
        # one whose first step broke part-way), which is no step the job restored (it
        # named step 0 here, sending the user to rewind to it).
        restored = [g.min_step for g in groups if g.min_step > 0]
        step = min(restored) if restored else 0 if groups else "?"
        raise _keeping_not_stepped(refusal, type(refusal)(
            f"{daemon} restarted at {when} and restored step {step} from its "
            f"checkpoint; this job is at step {at}. Rewind the trainer to step {step} (its model, "
            "data loader and scheduler from your checkpoint of that step) and attach with "
            "resume='daemon'"
            + (" (with several daemons, first rewind the job on all of them to that step: "
               "Client.rewind_job)" if member else "")
            + ", or load_state_dict() your own checkpoint "
            f"(daemon's refusal: {refusal.message})", target, refusal.code_value)) from refusal

    def _gradients_in_other_slots(self) -> dict:
        """id(p) -> a copy of p.grad, for each parameter whose .grad lies in one of this
        optimizer's shared buffers but not in its own slot (another parameter's slot, as
        after `p1.grad = p0.grad; p0.grad = new`): the copies into slots that step() makes
        one parameter at a time would overwrite it before it is read."""
        buffers = set(self._shared_buffer_of.values())
        copies = {}
        for group in self.param_groups:
            for p in group["params"]:
                grad, slot = p.grad, self._shared_grads.get(id(p))
                if (grad is None or slot is None or grad.data_ptr() == slot.data_ptr()
                        or grad.untyped_storage().data_ptr() not in buffers):
                    continue
                copies[id(p)] = grad.clone()
        return copies

    def _into_shared(self, p: torch.Tensor, grad: torch.Tensor,
                     elsewhere: Optional[dict] = None) -> torch.Tensor:
        """p's gradient where the daemon reads it in place: its slice of a shared buffer,
        the gradient copied there first (and made p's .grad) when autograd put it
        elsewhere (from `elsewhere`'s copy of it when it lies in another slot:
        _gradients_in_other_slots); `grad` itself for a parameter without a slice."""
        slot = self._shared_grads.get(id(p))
        if slot is None or grad is slot or grad.data_ptr() == slot.data_ptr():
            return grad
        slot.copy_(elsewhere.get(id(p), grad) if elsewhere else grad)
        buffer = self._shared_buffer_of[id(p)]
        self._shared_writes[buffer] = self._shared_writes.get(buffer, 0) + 1
        p.grad = slot
        # A gradient clip_grad_norm_ measured, moved here unchanged: the slot holds what it
        # measured (so a step refused after this keeps the coefficient for these values).
        i = self._clipped_at.pop(id(grad), None)
        if i is not None and self._clipped[i][0] is grad:
            if self._unchanged(self._clipped[i]):
                self._clipped[i] = (slot, slot._version, self._own_writes(slot))
            else:
                self._clipped[i] = (slot, -1, 0)  # written to since the clip: not unchanged
            self._clipped_at[id(slot)] = i
        return slot

    @staticmethod
    def _check_finite(calls: dict) -> None:
        """Every gradient of `calls` finite as sent (before any grad_scale); else
        InvalidArgument naming its group."""
        for (_, wire), groups in calls.items():
            narrow = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(wire)
            for name, grad, *_ in groups:
                sent = grad.to(narrow) if narrow is not None and grad.dtype != narrow else grad
                if not bool(torch.isfinite(sent).all()):
                    raise errors.InvalidArgument(
                        f"gradient of group '{name}' is not finite (as sent, {sent.dtype}); the "
                        "whole step was refused and nothing was sent")

    @staticmethod
    def _check_step_hyperparameters(calls: dict, stepped: dict) -> None:
        """Every group of `calls` with hyperparameters the daemon takes at its step; else
        InvalidArgument naming the group. The daemon's own checks (ValidateHyperparameters
        in server/state/group_config.cc and the step's fp32 constants in
        server/engine/step_engine.cc), made here when a step takes several calls: a later
        call's refusal would come after earlier ones were applied."""
        seen = {}
        for (k, wire), groups in calls.items():
            for (name, _, _, lr, overrides), reg in zip(groups, stepped[(k, wire)]):
                key = (id(reg.hyperparameters), lr, None if overrides is None
                       else tuple(sorted(overrides.items())), k)
                if key not in seen:
                    seen[key] = _step_hyperparameters_refusal(reg.hyperparameters, lr,
                                                              overrides, k)
                if seen[key] is not None:
                    raise errors.InvalidArgument(
                        f"group '{name}' at step {k}: {seen[key]}; the whole step was refused "
                        "and nothing was sent")

    def _broadcast(self) -> None:
        """Every parameter from the rank that stepped it."""
        self._staging.wait_for_values()
        for p, _, _ in self._names():
            src = self._owner[id(p)]
            if self._process_group is not None:
                src = dist.get_global_rank(self._process_group, src)
            dist.broadcast(p.data, src=src, group=self._process_group)

    # -- state dict ------------------------------------------------------------------------

    def _export(self, p: torch.Tensor, name: str) -> Optional[dict]:
        """A group's state in torch.optim.AdamW's form (plus ``master_param`` for a parameter
        whose values travel in 16 bits), or None before its first step."""
        state = self._client.export_state(name)
        steps = set(int(s) for s in state.page_steps)
        if len(steps) != 1:
            raise errors.FailedPrecondition(
                f"group '{name}' is part-way through a step (its pages are at steps "
                f"{sorted(steps)}); finish the step (repeat it) before state_dict()")
        step = steps.pop()
        if step == 0:
            return None
        out = {"step": torch.tensor(float(step)),
               "exp_avg": torch.from_numpy(state.exp_avg).reshape(p.shape),
               "exp_avg_sq": torch.from_numpy(state.exp_avg_sq).reshape(p.shape)}
        if state.max_exp_avg_sq is not None:  # amsgrad
            out["max_exp_avg_sq"] = torch.from_numpy(state.max_exp_avg_sq).reshape(p.shape)
        if self._travels_narrowed(p):
            out[MASTER_PARAM] = torch.from_numpy(state.params).reshape(p.shape)
        return out

    def state_dict(self) -> dict:
        """The state in torch.optim.AdamW's layout: ``{"state": {i: {"step", "exp_avg",
        "exp_avg_sq"}}, "param_groups": [...]}`` (and ``"max_exp_avg_sq"`` with amsgrad),
        read from the daemon (every rank gets all
        of it, sharded or not). exp_avg and exp_avg_sq are float32 (the daemon's), also for
        16-bit parameters. A parameter whose values travel in 16 bits (a bfloat16 or
        float16 parameter, or any with ``wire_dtype`` 16-bit) has one entry more,
        ``"master_param"``: the daemon's float32 master weights, shaped like the parameter,
        which :meth:`load_state_dict` imports (torch.optim.AdamW keeps the entry, cast to
        the parameter's dtype, and never reads it)."""
        self._check_not_forked()
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        state, groups = {}, []
        index = 0
        names = {id(p): name for p, name, _ in self._names()}
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = list(range(index, index + len(group["params"])))
            for p in group["params"]:
                exported = self._export(p, names[id(p)])
                if exported is not None:
                    state[index] = exported
                index += 1
            groups.append(packed)
        state_dict = {"state": state, "param_groups": groups}
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            result = post_hook(self, state_dict)
            if result is not None:
                state_dict = result
        return state_dict

    def __setattr__(self, name: str, value) -> None:
        # opt.state = defaultdict(dict), torch's way to drop every parameter's state: the
        # daemon's state is dropped too (an assignment alone would leave it stepping on).
        if (name == "state" and isinstance(self.__dict__.get("state"), RemoteState)
                and not isinstance(value, RemoteState)):
            if not isinstance(value, collections.abc.Mapping) or len(value) != 0:
                raise TypeError(
                    "opt.state = ... takes only an empty mapping (torch's "
                    "defaultdict(dict)), which drops every parameter's state: RemoteAdamW's "
                    "state lives on the optstated daemon; put state in with load_state_dict()")
            self._reset_state(None)
            return
        super().__setattr__(name, value)

    def _reset_state(self, only: Optional[list]) -> None:
        """Drops the state of the parameters `only` (None: every one), as torch's
        ``del opt.state[p]``, ``opt.state.clear()`` and ``opt.state = defaultdict(dict)`` do:
        their next step starts afresh (step 0, zero moments) from their values, as after
        load_state_dict() of a state dict without their entries. Each rank drops the
        groups it owns (shard=True: its share); call it on every rank."""
        self._check_not_forked()
        rank, _ = self._rank_and_world()
        for p, name, group in self._names():
            if only is not None and not any(p is q for q in only):
                continue
            reg = self._registered.get(id(p))
            if self._owner.get(id(p), rank) != rank or reg is None or reg.step == 0:
                continue  # another rank's, or no state to drop
            self._import(p, name, group, self._check_entry(p, name, group, None), None)

    def _state_of(self, p: torch.Tensor) -> Optional[dict]:
        """opt.state[p]: p's state read from the daemon now (copies), or None when p has
        none (not stepped yet, or not a parameter of this optimizer)."""
        name = next((n for q, n, _ in self._names() if q is p), None)
        if name is None or self._closed:
            return None
        return self._export(p, name)

    def _with_state(self) -> list:
        """The parameters that have state on the daemon, in param-group order: those this
        rank stepped or attached at a step > 0 (another rank's, sharded: read from the
        daemon)."""
        out = []
        for p, name, _ in self._names():
            reg = self._registered.get(id(p))
            if reg is not None:
                if reg.step > 0:
                    out.append(p)
            elif self._owner.get(id(p)) is not None and not self._closed:
                if self._client.describe(name).max_step > 0:
                    out.append(p)
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Loads a state dict of torch.optim.AdamW's layout (from torch.optim.AdamW or from
        RemoteAdamW): the param groups' hyperparameters, and per parameter its step,
        exp_avg and exp_avg_sq, imported into the daemon together with master weights
        (load the model's state first): the entry's ``"master_param"`` where it is the
        master of the parameter's current values (float32, and narrowed as the parameter's
        values travel it equals them bit for bit: RemoteAdamW's own state dict of this
        model), else the parameter's current values (a state dict of torch.optim.AdamW,
        or one whose parameters have moved on since). A parameter without state starts
        afresh (step 0, zero moments). torch's load-state-dict pre hooks run first (one may
        return a replacement dict), its post hooks last."""
        self._check_not_forked()
        state_dict = state_dict.copy()  # shallow, as torch's
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for group, saved in zip(self.param_groups, saved_groups):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't "
                                 "match the size of optimizer's group")
        saved_state = state_dict["state"]
        if getattr(self, "_new_beside_trained", False):
            # Attached with new groups beside trained ones: a daemon that lost its state,
            # unless the trained groups of the old names are still there (renamed).
            self._refuse_renamed_parameters(
                [Attached(name, True, 0, 0) for _, name, _ in self._names()])
            self._new_beside_trained = False
        rank, _ = self._rank_and_world()
        names = {id(p): name for p, name, _ in self._names()}
        # Every entry is checked before anything changes, on every rank (each then
        # imports its own): a refused state dict leaves the param groups and the
        # daemon's state as they were. The arrays are made one parameter at a time.
        loaded_groups, work = [], []
        for group, saved in zip(self.param_groups, saved_groups):
            loaded = dict(group)
            loaded.update((k, v) for k, v in saved.items() if k not in ("params", "param_names"))
            loaded_groups.append(loaded)
            for index, p in zip(saved["params"], group["params"]):
                entry = saved_state.get(index, saved_state.get(str(index)))
                h = self._check_entry(p, names[id(p)], loaded, entry)
                if self._owner.get(id(p), rank) == rank:
                    work.append((p, names[id(p)], loaded, h, entry))
        for p, name, loaded, h, entry in work:
            self._import(p, name, loaded, h, entry)
        # Last: the daemon's groups keep the hyperparameters they were registered with,
        # and each step sends these where they differ.
        for group, loaded in zip(self.param_groups, loaded_groups):
            group.update((k, v) for k, v in loaded.items() if k != "params")
        self._awaiting_load = None
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def _master_weights(self, p: torch.Tensor, entry: dict) -> torch.Tensor:
        """The float32 master weights to import for p: the entry's master_param when it is
        the master of p's current values, else p's values widened."""
        widened = p.detach().reshape(-1).to("cpu", torch.float32).contiguous()
        master = entry.get(MASTER_PARAM)
        if (not isinstance(master, torch.Tensor) or master.dtype != torch.float32
                or master.numel() != p.numel() or not self._travels_narrowed(p)):
            return widened
        master = master.detach().reshape(-1).contiguous()
        narrowed = master.to(p.dtype if p.dtype in _SIXTEEN_BIT else _WIRE_DTYPES[self._wire])
        current = p.detach().reshape(-1).cpu().contiguous()
        if not torch.equal(narrowed.to(current.dtype).view(torch.uint8), current.view(torch.uint8)):
            return widened  # stale: the parameter moved on (e.g. steps of another optimizer)
        return master

    def _check_entry(self, p: torch.Tensor, name: str, group: dict,
                     entry: Optional[dict]) -> tuple:
        """Checks p's entry of a state dict being loaded (ValueError saying what is wrong;
        nothing is copied) and returns the hyperparameters p's group is (or will be)
        registered with."""
        reg = self._registered.get(id(p))
        # The daemon's group keeps the hyperparameters it was registered with (each step
        # sends those of the loaded param group that differ); a new one takes the group's.
        h = reg.hyperparameters if reg is not None else _hyperparameters(group)
        # amsgrad cannot change between steps, so a loaded group that changes it (as
        # torch's load_state_dict adopts it) makes the daemon's group anew (_import).
        h = h[:5] + (bool(group.get("amsgrad", False)),)
        if entry is None:
            self._check_registrable(p, name)
            return h
        if not isinstance(entry, dict):
            raise ValueError(f"parameter '{name}': its state is a {type(entry).__name__}, not "
                             "a dict of step, exp_avg and exp_avg_sq")
        for key in ("step", "exp_avg", "exp_avg_sq"):
            if key not in entry:
                raise ValueError(f"parameter '{name}': its state has no '{key}'")
        step = _as_float(entry["step"])
        if not (step >= 0 and step == int(step) and step < 2 ** 63):
            raise ValueError(f"parameter '{name}': the loaded step is {step}; a step is a "
                             "whole number, 0 or more")
        moments = ["exp_avg", "exp_avg_sq"]
        if h[5]:  # amsgrad: torch's state has max_exp_avg_sq too
            if not isinstance(entry.get("max_exp_avg_sq"), torch.Tensor):
                raise ValueError(f"parameter '{name}': its param group has amsgrad=True but the "
                                 "loaded state has no max_exp_avg_sq (a state dict of an "
                                 "optimizer without amsgrad)")
            moments.append("max_exp_avg_sq")
        for key in moments:
            if not isinstance(entry[key], torch.Tensor):
                raise ValueError(f"parameter '{name}': the loaded {key} is a "
                                 f"{type(entry[key]).__name__}, not a tensor")
        if entry["exp_avg"].numel() != p.numel() or entry["exp_avg_sq"].numel() != p.numel():
            raise ValueError(f"parameter '{name}': the loaded exp_avg/exp_avg_sq have "
                             f"{entry['exp_avg'].numel()}/{entry['exp_avg_sq'].numel()} "
                             f"elements, the parameter {p.numel()}")
        if h[5] and entry["max_exp_avg_sq"].numel() != p.numel():
            raise ValueError(f"parameter '{name}': the loaded max_exp_avg_sq has "
                             f"{entry['max_exp_avg_sq'].numel()} elements, the parameter "
                             f"{p.numel()}")
        # What the daemon refuses to import, found before anything is imported (a refusal
        # at this parameter's turn left the ones before it loaded): a square below 0. It
        # takes what a step can leave, as torch's load_state_dict does: a diverged run's
        # nan or inf in the values and exp_avg, +inf or nan in the squares.
        for key in moments:
            values = entry[key].detach().float()  # as imported
            if key != "exp_avg" and bool((values < 0).any()):
                raise ValueError(f"parameter '{name}': the loaded {key} holds a negative "
                                 "value (a mean of squares is 0 or more)")
        return h

    def _import(self, p: torch.Tensor, name: str, group: dict, h: tuple,
                entry: Optional[dict]) -> None:
        """Imports p's checked entry (_check_entry) into the daemon, or, without one,
        registers p anew."""
        reg = self._registered.get(id(p))
        if entry is None:
            # No state: the parameter starts afresh. The daemon has no step 0 to import,
            # so this job's group is registered anew from the parameter's values.
            if reg is not None:
                self._client.delete(name)
                del self._registered[id(p)]
            self._register(p, name, group, h)
            return
        params = self._master_weights(p, entry)
        exp_avg = entry["exp_avg"].detach().reshape(-1).float().contiguous()
        exp_avg_sq = entry["exp_avg_sq"].detach().reshape(-1).float().contiguous()
        max_exp_avg_sq = (entry["max_exp_avg_sq"].detach().reshape(-1).float().contiguous()
                          if h[5] else None)
        step = int(_as_float(entry["step"]))
        old = None
        if reg is not None and reg.hyperparameters[5] != h[5]:
            # amsgrad changed: the import makes the group anew (an import replaces only a
            # group of equal hyperparameters). Its state is kept here until the new one is
            # in, and put back if that fails.
            old = self._client.export_state(name)
            self._client.delete(name)
        try:
            # A diverged run's nan and inf load as torch's load_state_dict loads them.
            self._client.import_state(name, params, exp_avg, exp_avg_sq, [step],
                                      max_exp_avg_sq=max_exp_avg_sq, accept_non_finite=True,
                                      **_register_keywords(h))
        except BaseException:
            if old is not None:
                self._client.import_state(
                    name, torch.from_numpy(old.params), torch.from_numpy(old.exp_avg),
                    torch.from_numpy(old.exp_avg_sq), [int(s) for s in old.page_steps],
                    max_exp_avg_sq=(torch.from_numpy(old.max_exp_avg_sq)
                                    if old.max_exp_avg_sq is not None else None),
                    accept_non_finite=True, **_register_keywords(reg.hyperparameters))
            raise
        self._remember(p, name, h, step, created=reg.created if reg is not None else True)
