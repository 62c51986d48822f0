"""RemoteAdamW.step wrapped as torch.optim.Optimizer wraps every optimizer's step: the
step pre- and post-hooks (global ones and the optimizer's own, in torch's order, a pre-hook
may replace the arguments), the profiler's ``Optimizer.step#<class>.step`` range and its
``_optimizer_step_code`` entry point. One difference: the range is opened only while a
profiler runs. torch's wrapper opens it at every step, two dispatched operator calls that
cost 0.2-0.3 ms of a step that finds the caches cold, as a step after a backward does
(BENCHMARKS.md), where nothing records it.

``without_grad`` is torch.no_grad's effect on a step without its context manager's objects
(40 us less of a cold step).

A step marked ``hooked`` is one torch's Optimizer leaves as it is; torch wraps the ``step``
of a subclass that defines its own, and the hooks then run in that wrapper only.
"""
from __future__ import annotations

import functools
from itertools import chain
from typing import Callable

import torch

try:
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks
except ImportError:  # A torch that keeps them elsewhere: its own wrapper is used.
    _global_optimizer_pre_hooks = _global_optimizer_post_hooks = None


def hooked_step(step: Callable) -> Callable:
    """`step` wrapped as torch's Optimizer wraps it (see the module docstring); `step`
    unchanged where this torch keeps its hooks where this module cannot find them."""
    if _global_optimizer_pre_hooks is None or not hasattr(torch.autograd, "_profiler_enabled"):
        return step

    @functools.wraps(step)
    def wrapper(*args, **kwargs):
        self = args[0]
        if type(self).step is not wrapper:
            # A subclass's own step, wrapped by torch, called this through super(): its
            # wrapper ran the hooks already.
            return step(*args, **kwargs)
        if torch.autograd._profiler_enabled():
            with torch.autograd.profiler.record_function(
                    f"Optimizer.step#{type(self).__name__}.step"):
                return _with_hooks(step, self, args, kwargs)
        return _with_hooks(step, self, args, kwargs)

    wrapper.hooked = True
    return wrapper


def _with_hooks(step: Callable, self, args: tuple, kwargs: dict):
    """torch's profile_hook_step without its profiler range: the pre-hooks, the step, the
    profiler's entry point, the post-hooks."""
    for pre_hook in chain(_global_optimizer_pre_hooks.values(),
                          self._optimizer_step_pre_hooks.values()):
        result = pre_hook(self, args, kwargs)
        if result is not None:
            if isinstance(result, tuple) and len(result) == 2:
                args, kwargs = result
            else:
                raise RuntimeError(f"{step} must return None or a tuple of (new_args, "
                                   f"new_kwargs), but got {result}.")
    out = step(*args, **kwargs)
    self._optimizer_step_code()
    for post_hook in chain(self._optimizer_step_post_hooks.values(),
                           _global_optimizer_post_hooks.values()):
        post_hook(self, args, kwargs)
    return out


def eager_only(step: Callable) -> Callable:
    """`step` run as it is under torch.compile (a graph break), as torch.compiler.disable
    runs it; torch's own lazy form where this torch has it (torch._disable_dynamo, which
    torch's optimizers use), so that importing this module does not import torch._dynamo
    (over a second): torch.optim.Optimizer's constructor imports it anyway."""
    lazy = getattr(torch, "_disable_dynamo", None)
    return lazy(step) if lazy is not None else torch.compiler.disable(step)


def without_grad(step: Callable) -> Callable:
    """`step` run with autograd off and the caller's grad mode restored after, as under
    ``@torch.no_grad()``."""

    @functools.wraps(step)
    def wrapper(*args, **kwargs):
        enabled = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            return step(*args, **kwargs)
        finally:
            torch._C._set_grad_enabled(enabled)

    return wrapper
