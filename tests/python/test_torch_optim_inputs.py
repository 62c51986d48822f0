"""torch's own AdamW test inputs (torch.testing._internal.common_optimizers, shipped in the
torch wheel: optim_inputs_func and optim_error_inputs_func of AdamW on the CPU) run
against RemoteAdamW: each input steps as torch.optim.AdamW(fused=True) does, bit for bit,
or is refused by the daemon naming the option it does not offer; each error input raises
what torch raises (type and message; warnings as warnings)."""
import warnings

import pytest
import torch
from torch.testing._internal.common_optimizers import optim_db

import optstate
from optstate.torch import RemoteAdamW
from reference import bits_equal

_ADAMW = next(info for info in optim_db if info.optim_cls is torch.optim.AdamW)
_INPUTS = _ADAMW.optim_inputs_func(device="cpu", dtype=torch.float32)
_ERROR_INPUTS = _ADAMW.optim_error_inputs_func(device="cpu", dtype=torch.float32)
# What the daemon does not offer yet, and says so by name (INVALID_ARGUMENT).
_REFUSED_BY_THE_DAEMON = {"amsgrad": "amsgrad=true is not supported"}


def _params(seed):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.nn.Parameter(torch.randn(16, 64, generator=gen))
    bias = torch.nn.Parameter(torch.randn(64, generator=gen))
    return [weight, bias]


def test_torchs_inputs_were_found():
    assert {i.desc for i in _INPUTS} >= {"default", "non-default lr", "nonzero weight_decay",
                                         "maximize", "amsgrad"}
    assert len(_ERROR_INPUTS) >= 10


@pytest.mark.parametrize("optim_input", _INPUTS, ids=lambda i: i.desc)
def test_each_of_torchs_inputs_steps_as_torch_fused(daemon, prefix, optim_input):
    kwargs = dict(optim_input.kwargs)
    params, ref_params = _params(1), _params(1)
    refusal = next((why for key, why in _REFUSED_BY_THE_DAEMON.items() if kwargs.get(key)), None)
    if refusal is not None:
        with pytest.raises(optstate.InvalidArgument, match=refusal):
            RemoteAdamW(params, target=daemon.target, name_prefix=prefix, **kwargs)
        return
    opt = RemoteAdamW(params, target=daemon.target, name_prefix=prefix, **kwargs)
    ref = torch.optim.AdamW(ref_params, fused=True, **kwargs)
    for step in range(1, 11):
        gen = torch.Generator().manual_seed(step)
        for group in (params, ref_params):
            gen.manual_seed(step)
            for p in group:
                p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
        ref.step()
        for p, q in zip(params, ref_params):
            assert bits_equal(p.detach(), q.detach()), (optim_input.desc, step)
    for p, q in zip(params, ref_params):
        assert bits_equal(opt.state[p]["exp_avg_sq"], ref.state[q]["exp_avg_sq"])
    opt.close()


@pytest.mark.parametrize("error_input", _ERROR_INPUTS, ids=lambda e: e.optimizer_error_input.desc)
def test_each_of_torchs_error_inputs_raises_what_torch_raises(daemon, prefix, error_input):
    optim_input = error_input.optimizer_error_input
    params = optim_input.params if optim_input.params is not None else _params(2)
    kwargs = dict(optim_input.kwargs)
    if issubclass(error_input.error_type, Warning):
        with pytest.warns(error_input.error_type, match=error_input.error_regex):
            opt = RemoteAdamW(params, target=daemon.target, name_prefix=prefix, **kwargs)
        opt.close()
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(error_input.error_type, match=error_input.error_regex):
            RemoteAdamW(params, target=daemon.target, name_prefix=prefix, **kwargs)
