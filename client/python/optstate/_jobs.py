"""Jobs on a daemon (docs/jobs.md): a job's name, its lease holder, the names of its
parameters across torch's wrappers, and what RemoteAdamW does with groups that already
exist when it starts (``resume=``)."""
from __future__ import annotations

import os
import socket
import time
import uuid
import warnings
import weakref
from dataclasses import dataclass
from typing import Optional

from . import errors

RESUME_MODES = ("never", "daemon", "state_dict")

# torch.compile's wrapper and DDP/FSDP's: the module they wrap is named under these.
_LEADING_WRAPPERS = ("_orig_mod.", "module.")
# Wrappers that may sit at any depth (compiled or FSDP-wrapped submodules,
# activation checkpointing).
_NESTED_WRAPPERS = ("_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def job_name(name_prefix: Optional[str]) -> str:
    """The job's name prefix: `name_prefix` when given, else the run's identity
    (torchelastic's TORCHELASTIC_RUN_ID, as torchrun sets it: "<run id>/"), said in a
    warning; ValueError when there is neither."""
    if name_prefix:
        if not isinstance(name_prefix, str):
            raise ValueError(f"name_prefix must be a str, got {type(name_prefix).__name__}")
        odd = next((c for c in name_prefix if not "!" <= c <= "~"), None)
        if odd is not None:
            raise ValueError(
                f"name_prefix {name_prefix!r} has {odd!r}: it starts every group's name on the "
                "daemon, and names there are printable ASCII without spaces (the parameters' "
                "own names are escaped; the job's name is yours to choose)")
        return name_prefix
    if name_prefix is not None and name_prefix != "":
        raise ValueError(f"name_prefix must be a str, got {type(name_prefix).__name__}")
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        prefix = f"{run_id}/"
        warnings.warn(f"RemoteAdamW: name_prefix {prefix!r} from TORCHELASTIC_RUN_ID (this run's "
                      "id); pass name_prefix= to name the job yourself", stacklevel=3)
        return prefix
    under_torchrun = run_id == "none"
    raise ValueError(
        "RemoteAdamW needs name_prefix=, the job's name on the daemon (for example "
        "'llama-7b-run3/'): every group is named name_prefix + parameter name, so two jobs "
        "(or a job and its restart) must not share one by accident. Under torchrun it is "
        "taken from the run id (TORCHELASTIC_RUN_ID) when not given"
        + ("; this torchrun has none (TORCHELASTIC_RUN_ID=none: torchrun gives a run id "
           "with --rdzv-id=ID, or --standalone): pass name_prefix=, or one of those"
           if under_torchrun else ""))


def strip_wrappers(name: str) -> str:
    """`name` without what torch.compile (``_orig_mod.``) and DDP/FSDP (``module.``) put in
    front of the wrapped module's names (any number, in any order), and without compiled,
    FSDP-wrapped or checkpoint-wrapped submodules' wrapper names inside it, so a model
    keeps its groups whether it is wrapped or not."""
    stripped = True
    while stripped:
        stripped = False
        for wrapper in _LEADING_WRAPPERS:
            if name.startswith(wrapper) and len(name) > len(wrapper):
                name = name[len(wrapper):]
                stripped = True
    for wrapper in _NESTED_WRAPPERS:
        name = name.replace("." + wrapper, ".")
    return name


def group_name_of(parameter_name: str) -> str:
    """`parameter_name` as a daemon group name, whose characters are printable ASCII
    without spaces: each UTF-8 byte of any other character (a space in a ModuleDict key,
    a non-ASCII attribute name) as %XX. Names without such characters are kept as they
    are, so jobs named before keep their groups."""
    if all("!" <= c <= "~" for c in parameter_name):
        return parameter_name
    return "".join(c if "!" <= c <= "~" else "".join(f"%{b:02X}" for b in c.encode("utf-8"))
                   for c in parameter_name)


def new_holder_id(process_group=None) -> str:
    """A lease holder id for this job: made on rank 0 and shared with every rank when
    torch.distributed is initialised (the ranks of one job share its lease)."""
    holder = uuid.uuid4().hex
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover (torch always has it)
        return holder
    if dist.is_available() and dist.is_initialized():
        box = [holder]
        dist.broadcast_object_list(box, src=dist.get_global_rank(process_group, 0)
                                   if process_group is not None else 0, group=process_group)
        holder = box[0]
    return holder


# The optimizers of this process, by their lease holder id (note_holder): a lease whose
# last call came from this process is another optimizer's of it, which may be gone
# (collected, or closed) while the process runs on.
_HOLDERS_HERE: dict[str, "weakref.WeakSet"] = {}


def note_holder(holder: str, optimizer) -> None:
    """`optimizer`, of this process, steps as lease holder `holder` (several may)."""
    if holder:
        _HOLDERS_HERE.setdefault(holder, weakref.WeakSet()).add(optimizer)


def _holder_here(lease: dict) -> bool:
    """Whether the lease is held by RemoteAdamWs of this process (its last call came
    from here, and the holder is one an optimizer here was made with)."""
    return (lease["host"] == socket.gethostname() and int(lease["pid"] or 0) == os.getpid()
            and lease["holder"] in _HOLDERS_HERE)


def _holder_gone_here(lease: dict) -> bool:
    """Whether the lease is held by RemoteAdamWs of this process that are no longer there
    to step (collected, or closed). A holder no optimizer here was made with (a plain
    Client's, or one given client=) is never known gone."""
    if not _holder_here(lease):
        return False
    return all(getattr(optimizer, "_closed", False)
               for optimizer in list(_HOLDERS_HERE[lease["holder"]]))


def _process_gone(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def describe_lease(lease: dict) -> str:
    now = time.time()
    last = lease["last_call_unix_micros"] / 1e6
    expires = lease["expires_unix_micros"] / 1e6
    when = (f"expired {now - expires:.1f} s ago" if lease["expired"]
            else f"expires in {expires - now:.1f} s")
    return (f"job '{lease['job'] or '(unnamed)'}' (holder {lease['holder']}, host "
            f"{lease['host'] or '?'}, pid {lease['pid'] or '?'}; last call {now - last:.1f} s "
            f"ago, lease {when})")


def takeover_for(leases: dict, holder: str, takeover: bool) -> str:
    """The 'optstate-lease-takeover' value that lets this job (lease holder `holder`) step
    groups other holders lease (`leases`: group name -> lease dict), or "" when none
    does; FailedPrecondition when it may not: without `takeover`, or when a lease is live
    and its holder's process is not known to be gone (only a holder on this host is
    checked). Several other holders (a trainer killed after it finished part of a torn
    step leaves the job's groups with two) are each taken over on their own terms, in one
    value."""
    others = {name: lease for name, lease in leases.items() if lease["holder"] != holder}
    if not others:
        return ""
    by_holder: dict = {}
    for name, lease in others.items():
        by_holder.setdefault(lease["holder"], (name, lease, []))[2].append(name)
    entries = []
    for name, lease, names in by_holder.values():
        entries.append(_takeover_of(name, lease, len(names), len(others), takeover))
    return " ".join(entries)


def _takeover_of(name: str, lease: dict, held: int, total: int, takeover: bool) -> str:
    """One holder's 'expired=ID' or 'dead=ID' (it leases `held` of the `total` groups
    others lease, `name` among them); FailedPrecondition when it may not be taken over."""
    here = _holder_here(lease)
    more = (f"(and {held - 1} more of this job)" if held == total
            else f"(and {held - 1} more of this job; {total - held} more are leased by "
                 "other holders)")
    if not takeover:
        if here:
            raise errors.FailedPrecondition(
                f"group '{name}' {more} is leased by "
                f"{describe_lease(lease)}: another optimizer of this process (close() keeps "
                "its lease until it expires). To go on with its groups, pass "
                f"lease_holder='{lease['holder']}' (that optimizer's lease_holder), or "
                "takeover=True once it is closed or gone; or give this optimizer its own "
                "name_prefix")
        raise errors.FailedPrecondition(
            f"group '{name}' {more} is leased by "
            f"{describe_lease(lease)}. Another job, or an earlier run of this one, is stepping "
            "it. If it is another job, give this one its own name_prefix; if it is gone, pass "
            "takeover=True (once its lease expired, or at once when its process on this host "
            "is gone)")
    if lease["expired"]:
        return f"expired={lease['holder']}"
    if _holder_gone_here(lease) or (lease["host"] == socket.gethostname()
                                    and _process_gone(int(lease["pid"]))):
        return f"dead={lease['holder']}"
    if here:
        raise errors.FailedPrecondition(
            f"takeover=True, but group '{name}' is leased by {describe_lease(lease)}, whose "
            "lease is live: an optimizer of this process that is still open. close() it "
            "first (its lease is then taken over), or pass "
            f"lease_holder='{lease['holder']}' to step as it does")
    raise errors.FailedPrecondition(
        f"takeover=True, but group '{name}' is leased by {describe_lease(lease)}, whose lease "
        "is live and whose process is not known to be gone (it runs on another host, or is "
        "still running here): stop that job, or wait for its lease to expire, then retry")


@dataclass
class Attached:
    """What registration found of one parameter's group."""

    name: str
    created: bool
    min_step: int
    max_step: int
    # Its parameter requires grad (known for this process's own parameters only).
    trainable: bool = False


def unreached_by_step_one(attached: list[Attached]) -> list[Attached]:
    """Groups a torn first step may have left behind: the job's highest step is 1, and
    these existed before (registered by the earlier run), are at step 0, and their
    parameters require grad. A step k > 1 torn leaves groups at k - 1 > 0, which
    check_resume sees by their steps; a step 1 torn leaves them at 0, where a frozen
    parameter's group stays too, so the parameter's requires_grad tells them apart (a
    trainable parameter that got no gradient in step 1 looks the same)."""
    if max((a.max_step for a in attached), default=0) != 1:
        return []
    return [a for a in attached if a.max_step == 0 and not a.created and a.trainable]


def torn_step_to_finish(attached: list[Attached], high: int) -> bool:
    """Whether the job's groups (`attached`, highest step `high`) hold a torn step
    that the first step() finishes: groups stepped but behind, or, at step 1, groups
    a torn first step never reached (unreached_by_step_one)."""
    return (any(0 < a.max_step and a.min_step < high for a in attached)
            or bool(unreached_by_step_one(attached)))


def check_resume(prefix: str, resume: str, attached: list[Attached], finish_torn_step: bool) -> None:
    """Refuses (FailedPrecondition, saying which groups are where and the ways on) what
    `resume` does not allow of the groups the job found (`attached`): under "never",
    groups at a step > 0; under "daemon", new groups (created at step 0) beside groups at
    a step > 0 (renamed parameters, a model that changed: add new parameters on purpose
    with add_param_group; or a daemon that lost its state), and groups at different
    steps (a torn step) unless `finish_torn_step`, and groups more than one step apart
    even then (no step() finishes that). Under "state_dict", load_state_dict() gives
    every group its state before any step, so new groups beside trained ones (a daemon
    of the job that lost its state, whose error sent the user here) are its to fill."""
    trained = [a for a in attached if a.max_step > 0]
    if not trained:
        return
    new = [a for a in attached if a.created]
    steps = sorted({a.max_step for a in trained} | {a.min_step for a in trained})
    example = trained[0]
    if resume == "never":
        raise errors.FailedPrecondition(
            f"job '{prefix}' already has state on the daemon: {len(trained)} groups, at step "
            f"{steps[-1] if len(steps) == 1 else steps} (e.g. '{example.name}' at step "
            f"{example.max_step}). resume='never' (the default) does not attach a fresh model "
            "to it. The ways on: resume='daemon' continues from the daemon's state (the "
            "model's parameters are overwritten with it), resume='state_dict' attaches for "
            "load_state_dict() of your checkpoint, or another name_prefix starts a new job "
            "(or delete this job's groups: optstate.Client.delete)")
    if new and resume == "daemon":
        raise errors.FailedPrecondition(
            f"job '{prefix}' has {len(trained)} groups at step {steps[-1]} but "
            f"{len(new)} of the model's parameters have none (e.g. '{new[0].name}'): renamed "
            "parameters start from step 0 here. torch.compile's '_orig_mod.' and DDP/FSDP's "
            "'module.' are stripped already; rename them back, or construct the optimizer "
            "without them and add them on purpose with add_param_group(). If instead a "
            "daemon of the job lost its state (restarted without --state_dir), resume from "
            "your own checkpoint: resume='state_dict' and load_state_dict(). With several "
            "daemons, a Rebalance to this list that did not finish leaves groups on their "
            "old daemon: run the same Client.rebalance() again, then attach")
    if resume == "daemon":
        unreached = unreached_by_step_one(attached)
        if unreached:  # Behind at step 0: a torn first step (or no gradient in it).
            trained += unreached
            steps = sorted({0} | set(steps))
    torn = [a for a in trained if a.min_step != a.max_step]
    if resume != "daemon" or not (len(steps) > 1 or torn):
        return
    low = min(a.min_step for a in trained)
    high = max(a.max_step for a in trained)
    lagging = [a.name for a in trained if a.min_step < high][:5]
    if low < high - 1:
        # One step moves each group one step on: no step() makes these meet (a daemon of
        # the job restored an older checkpoint, or a rewind reached only some of them).
        raise errors.FailedPrecondition(
            f"job '{prefix}' has groups at steps {low} to {high} (behind: "
            f"{', '.join(lagging)}), more than one step apart, which no step finishes: one of "
            "its daemons restored an older checkpoint, or a rewind reached only some of them. "
            "Attach with resume='state_dict' and load_state_dict() your checkpoint, or rewind "
            "the job to one step on every daemon (Client.rewind_job) and attach again")
    if not finish_torn_step:
        first = (" (a parameter that requires grad but got no gradient in step 1 looks the "
                 "same: the step that finishes step 1 leaves a parameter it has no gradient "
                 "for at step 0)") if low == 0 else ""
        raise errors.FailedPrecondition(
            f"job '{prefix}' stopped part-way through step {high}: its groups are at steps "
            f"{low} to {high} (behind: {', '.join(lagging)}){first}. Attach with "
            f"resume='daemon', finish_torn_step=True and give step() the gradients of step "
            f"{high} (only the groups behind are stepped, to step {high}); or resume='state_dict' "
            "and load_state_dict() your checkpoint")
