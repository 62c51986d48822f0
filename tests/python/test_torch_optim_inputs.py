"""torch's own AdamW test inputs (torch.testing._internal.common_optimizers, shipped in the
torch wheel: optim_inputs_func and optim_error_inputs_func of AdamW on the CPU) run
against RemoteAdamW: each input (amsgrad and maximize included) steps as
torch.optim.AdamW(fused=True) does, bit for bit, p and every state tensor; each error
input raises what torch raises (type and message; warnings as warnings)."""
import warnings

import pytest
import torch
from torch.testing._internal.common_optimizers import optim_db

from optstate.torch import RemoteAdamW
from reference import bits_equal

_ADAMW = next(info for info in optim_db if info.optim_cls is torch.optim.AdamW)
_INPUTS = _ADAMW.optim_inputs_func(device="cpu", dtype=torch.float32)
_ERROR_INPUTS = _ADAMW.optim_error_inputs_func(device="cpu", dtype=torch.float32)


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
        state, want = opt.state[p], ref.state[q]
        assert set(state) == set(want), (set(state), set(want))
        for key in set(want) - {"step"}:
            assert bits_equal(state[key], want[key]), (optim_input.desc, key)
        assert float(state["step"]) == float(want["step"])
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


@pytest.mark.parametrize("key,value", [("lr", "0.1"), ("weight_decay", "0.5"),
                                       ("eps", b"1e-8"), ("betas", ("0.9", 0.999))])
def test_a_str_hyperparameter_set_between_steps_raises_type_error_as_torchs(daemon, prefix,
                                                                           key, value):
    # float() parses "0.1", so a str lr set in param_groups stepped with lr 0.1; torch's
    # arithmetic raises TypeError on it.
    params = _params(3)
    opt = RemoteAdamW(params, target=daemon.target, name_prefix=prefix, delete_on_close=True)
    reference = torch.optim.AdamW([torch.nn.Parameter(p.detach().clone()) for p in params])
    for p, q in zip(params, reference.param_groups[0]["params"]):
        p.grad = torch.ones_like(p)
        q.grad = torch.ones_like(q)
    reference.param_groups[0][key] = value
    with pytest.raises(TypeError):
        reference.step()
    before = [p.detach().clone() for p in params]
    opt.param_groups[0][key] = value
    with pytest.raises(TypeError):
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(params, before))
    assert all(opt.client.describe(prefix + f"param.{i}").max_step == 0
               for i in range(len(params)))
    opt.close()


@pytest.mark.parametrize("kwargs", [{"betas": (0.9,)}, {"betas": ()}, {"lr": "0.1"},
                                    {"eps": "1e-8"}, {"weight_decay": "0.01"},
                                    {"betas": ("0.9", 0.999)}],
                         ids=["one_beta", "no_betas", "str_lr", "str_eps", "str_weight_decay",
                              "str_beta"])
def test_malformed_constructor_arguments_raise_what_torch_raises(daemon, prefix, kwargs):
    # Beyond torch's own error inputs: what its constructor raises for these, type and
    # message (a beta missing is torch's IndexError, a str its comparison's TypeError).
    with pytest.raises(Exception) as torchs:
        torch.optim.AdamW(_params(4), **kwargs)
    with pytest.raises(type(torchs.value)) as ours:
        RemoteAdamW(_params(4), target=daemon.target, name_prefix=prefix, **kwargs)
    assert type(ours.value) is type(torchs.value)
    assert str(ours.value) == str(torchs.value)
