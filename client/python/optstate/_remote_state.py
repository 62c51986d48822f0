"""RemoteAdamW.state: torch's ``optimizer.state[p]``, read from the daemon when read.

The daemon holds every parameter's step, exp_avg and exp_avg_sq; ``opt.state[p]`` exports
them (one ExportState call) and gives a dict of copies in torch.optim.AdamW's form. Writing
into that dict changes nothing on the daemon: ``load_state_dict()`` is how state goes in.
Dropping state is as in torch: ``del opt.state[p]``, ``opt.state.clear()`` (and
``opt.state = {}``, RemoteAdamW.__setattr__) make the next step start that state afresh.
"""
from __future__ import annotations

import collections.abc
import weakref
from typing import Callable, Iterator, Optional

import torch

__all__ = ["RemoteState"]


class RemoteState(collections.abc.MutableMapping):
    """A mapping from parameter to its state dict, each read from the daemon when looked up.

    `export(p)` gives p's state (a dict of fresh tensors: step, exp_avg, exp_avg_sq, ...) or
    None when p has none yet (never stepped, or not this optimizer's); `stepped()` lists the
    parameters that have state, in param-group order; `reset(ps)` drops the state of the
    parameters `ps` (None: all), so their next step starts afresh (step 0, zero moments). A
    parameter without state reads as an empty dict, as in torch's defaultdict; deleting one
    (or clear()) resets it; assigning raises TypeError (the state lives on the daemon)."""

    def __init__(self, export: Callable[[torch.Tensor], Optional[dict]],
                 stepped: Callable[[], list], reset: Callable[[Optional[list]], None]):
        # Weakly: the optimizer holds this mapping, and bound methods held here would make
        # a cycle, which only Python's cyclic collector frees, and with it the optimizer's
        # shared buffers (regions the daemon counts per client) and host slots.
        self._export = weakref.WeakMethod(export)
        self._stepped = weakref.WeakMethod(stepped)
        self._reset = weakref.WeakMethod(reset)

    def _method(self, ref: weakref.WeakMethod) -> Callable:
        method = ref()
        if method is None:
            raise ReferenceError("the optimizer of this state mapping is gone")
        return method

    def __getitem__(self, p: torch.Tensor) -> dict:
        state = self._method(self._export)(p)
        return {} if state is None else state

    def get(self, p, default=None):
        state = self._method(self._export)(p)
        return default if state is None else state

    def __contains__(self, p) -> bool:
        return any(q is p for q in self._method(self._stepped)())

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self._method(self._stepped)())

    def __len__(self) -> int:
        return len(self._method(self._stepped)())

    def __setitem__(self, p, value) -> None:
        raise TypeError("RemoteAdamW's state lives on the optstated daemon and opt.state[p] is "
                        "a copy read from it; change it with load_state_dict() (del "
                        "opt.state[p] or opt.state.clear() drops it, as in torch)")

    def __delitem__(self, p) -> None:
        if p not in self:
            raise KeyError(p)
        self._method(self._reset)([p])

    def clear(self) -> None:
        self._method(self._reset)(None)

    def __repr__(self) -> str:
        return f"RemoteState({len(self)} parameters with state on the daemon)"
