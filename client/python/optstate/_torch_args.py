"""torch.optim.AdamW's argument checks, for RemoteAdamW: the same checks in the same order
with the same exception types and messages as torch 2.x's Adam/AdamW constructor, and the
refusal, by name, of the options whose True means something the daemon does not do; and
the keywords RemoteAdamW passes on to optstate.Client."""
from __future__ import annotations

import torch

from ._optstate import _default_client_options

__all__ = ["check_client_options", "check_hyperparameters", "check_options", "to_scalar"]


def to_scalar(x):
    """torch's optimizer._to_scalar: a 1-element Tensor of any shape as a 0-dim one; other
    values as they are."""
    if isinstance(x, torch.Tensor) and x.dim() != 0:
        return x.squeeze()
    return x


def check_hyperparameters(lr, betas, eps, weight_decay, foreach, capturable) -> tuple:
    """Raises what torch.optim.AdamW(params, lr, betas, eps, weight_decay, foreach=...,
    capturable=...) raises for these values (ValueError, with torch's message), and
    ValueError for eps=0, which torch takes; returns
    betas as torch keeps them (each 1-element Tensor squeezed to 0 dims)."""
    if isinstance(lr, torch.Tensor):
        if foreach and not capturable:
            raise ValueError("lr as a Tensor is not supported for capturable=False and foreach=True")
        if lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if eps == 0.0:
        # torch takes it; its first step then divides 0 by 0 wherever a gradient is 0.
        raise ValueError(f"Invalid epsilon value: {eps} (optstated needs eps > 0: with eps=0 "
                         "an element whose gradients have all been 0 divides 0 by 0)")
    if len(betas) > 2:
        # torch takes a longer one here and fails at its first step ("too many values to
        # unpack"); the daemon would step with the first two and say nothing. A shorter
        # one raises torch's IndexError below, as torch's checks index it.
        raise ValueError(f"betas must be a pair (beta1, beta2), got {len(betas)} values: "
                         f"{tuple(betas)}")
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    if not ((isinstance(betas[0], float) and isinstance(betas[1], float))
            or (isinstance(betas[0], torch.Tensor) and isinstance(betas[1], torch.Tensor))):
        raise ValueError("betas must be either both floats or both Tensors")
    for i in (0, 1):
        if isinstance(betas[i], torch.Tensor):
            if not capturable and foreach:
                raise ValueError(f"betas[{i}] as a Tensor is not supported for capturable=False "
                                 "and foreach=True")
            if betas[i].numel() != 1:
                raise ValueError(f"Tensor betas[{i}] must be 1-element")
    return (to_scalar(betas[0]), to_scalar(betas[1]))


def check_options(foreach, fused, capturable, differentiable) -> None:
    """torch's own refusals of these options first (RuntimeError, its messages), then
    RuntimeError naming any that is True: the daemon runs one fused CPU step of its own
    (no foreach or fused torch kernel, no CUDA-graph capture, no autograd through the step),
    so False and None are the only values that mean what they say here."""
    if fused and differentiable:
        raise RuntimeError("`fused` does not support `differentiable`")
    if fused and foreach:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
    why = {
        "foreach": "the daemon steps every tensor itself; torch's foreach kernels never run",
        "fused": "the daemon runs its own fused step; torch's fused kernel never runs",
        "capturable": "the step is a call to the daemon, which a CUDA graph cannot capture",
        "differentiable": "the daemon's step is not part of torch's autograd graph",
    }
    for name, value in (("foreach", foreach), ("fused", fused), ("capturable", capturable),
                        ("differentiable", differentiable)):
        if value:
            raise RuntimeError(f"RemoteAdamW does not support {name}=True ({why[name]}); "
                               f"pass {name}={'None' if name in ('foreach', 'fused') else 'False'}")


def check_client_options(client_options: dict, client) -> None:
    """TypeError, as Python's for any function, for a keyword neither RemoteAdamW nor
    optstate.Client takes (a misspelt ``amsgard=True`` would otherwise train without
    amsgrad), and for Client options beside ``client=`` (that client has its own)."""
    known = _default_client_options()
    unknown = sorted(k for k in client_options if k not in known)
    if unknown:
        raise TypeError(
            f"RemoteAdamW.__init__() got an unexpected keyword argument {unknown[0]!r}: it "
            "takes torch.optim.AdamW's arguments, its own (target, client, name_prefix, "
            "resume, ...) and optstate.Client's options (" + ", ".join(sorted(known)) + ")")
    if client is not None and client_options:
        raise TypeError(
            "RemoteAdamW(client=...) takes no optstate.Client options ("
            + ", ".join(sorted(client_options)) + "): the client given has its own; pass "
            "them to optstate.Client(...) instead")
