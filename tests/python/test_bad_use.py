"""RemoteAdamW refuses bad use with a clear exception, before anything is sent, and the
daemon's state (steps, values, hyperparameters) and the parameters stay as they were."""
import numpy as np
import pytest
import torch

import optstate
from optstate.torch import RemoteAdamW
from reference import bits_equal


def _snapshot(client, names):
    return {n: (client.describe(n).min_step, client.describe(n).max_step,
                client.export_state(n).params.copy()) for n in names}


def _assert_unchanged(client, before):
    for n, (lo, hi, values) in before.items():
        info = client.describe(n)
        assert (info.min_step, info.max_step) == (lo, hi), n
        assert np.array_equal(client.export_state(n).params.view(np.uint32), values.view(np.uint32)), n


def test_unreachable_target_raises_unavailable_naming_it():
    p = torch.nn.Parameter(torch.ones(4))
    with pytest.raises(optstate.Unavailable) as e:
        RemoteAdamW([p], target="127.0.0.1:1", name_prefix="unreachable/", max_attempts=2,
                    initial_backoff=0.01, connect_timeout=1.0)
    assert "127.0.0.1:1" in str(e.value)


def test_a_group_of_another_job_with_other_hyperparameters_is_already_exists(daemon, client,
                                                                              prefix):
    client.register(prefix + "w", np.ones(8, np.float32), lr=0.5, weight_decay=0.0)
    p = torch.nn.Parameter(torch.zeros(8))
    with pytest.raises(optstate.AlreadyExists) as e:
        RemoteAdamW([("w", p)], target=daemon.target, name_prefix=prefix)
    assert prefix + "w" in str(e.value)
    info = client.describe(prefix + "w")
    assert (info.lr, info.weight_decay, info.min_step) == (0.5, 0.0, 0)
    assert np.array_equal(client.export_state(prefix + "w").params, np.ones(8, np.float32))
    # The same name with a prefix of its own is another group.
    RemoteAdamW([("w", p)], target=daemon.target, name_prefix=prefix + "job2/")


def test_a_parameter_whose_shape_changed_is_refused_naming_it(daemon, client, prefix):
    a, b = torch.nn.Parameter(torch.ones(6, 4)), torch.nn.Parameter(torch.ones(10))
    opt = RemoteAdamW([("a", a), ("b", b)], target=daemon.target, name_prefix=prefix)
    a.grad, b.grad = torch.ones(6, 4), torch.ones(10)
    opt.step()
    before = _snapshot(client, [prefix + "a", prefix + "b"])
    b_before = b.detach().clone()
    a.data = torch.ones(4, 6)  # same size, other shape
    a.grad = torch.ones(4, 6)
    with pytest.raises(ValueError, match=f"parameter '{prefix}a' has shape \\(4, 6\\) but was "
                                         "registered with \\(6, 4\\)"):
        opt.step()
    a.data = torch.ones(30)
    a.grad = torch.ones(30)
    with pytest.raises(ValueError, match=f"'{prefix}a' has shape \\(30,\\)"):
        opt.step()
    _assert_unchanged(client, before)
    assert bits_equal(b.detach(), b_before)


@pytest.mark.parametrize("two_calls", [False, True], ids=["one call", "two calls"])
def test_a_non_finite_gradient_applies_nothing_to_any_parameter(daemon, client, prefix,
                                                                two_calls):
    """Two param groups with their own lr go in one Client.step call, which checks every
    gradient before sending; a parameter whose step count fell behind (no gradient at
    step 1) needs a call of its own, and RemoteAdamW checks all of them before the first."""
    gen = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(n, generator=gen)) for n in (100, 300_000, 50)]
    opt = RemoteAdamW([{"params": params[:2]}, {"params": params[2:], "lr": 0.1}],
                      target=daemon.target, name_prefix=prefix)
    for p in params[:2] if two_calls else params:
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step()
    names = [f"{prefix}param.{i}" for i in range(3)]
    before = _snapshot(client, names)
    assert [s[0] for s in before.values()] == ([1, 1, 0] if two_calls else [1, 1, 1])
    values = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    params[2].grad[17] = float("nan")  # the last parameter (in the last call)
    with pytest.raises(optstate.InvalidArgument, match=f"'{prefix}param.2'.*not finite"):
        opt.step()
    _assert_unchanged(client, before)
    for p, v in zip(params, values):
        assert bits_equal(p.detach(), v)
    # the optimizer's step counts are those of the daemon, as before the refused step
    assert [opt.state[p].get("step", torch.tensor(0.0)).item() for p in params] == (
        [1.0, 1.0, 0.0] if two_calls else [1.0, 1.0, 1.0])
    params[2].grad[17] = 0.0  # fixed: the step goes through
    opt.step()
    assert [client.describe(n).min_step for n in names] == ([2, 2, 1] if two_calls else [2, 2, 2])


@pytest.mark.parametrize("change, says", [
    (dict(lr=float("nan")), "lr must be finite and >= 0"),
    (dict(lr=-0.1), "lr must be finite and >= 0"),
    (dict(eps=0.0), "eps must be finite and > 0"),
    (dict(betas=(0.9, 1.0)), "beta2 must be in \\[0, 1\\)"),
    (dict(lr=1e38), "beyond float32's range"),
], ids=["nan lr", "negative lr", "zero eps", "beta2 of 1", "lr overflowing"])
def test_hyperparameters_the_daemon_refuses_apply_nothing_over_two_calls(daemon, client, prefix,
                                                                         change, says):
    """A parameter whose step count fell behind needs a call of its own. The first call was
    applied, then the daemon refused the second's hyperparameters: a half-applied step, and
    its retry replayed the first call's step with the old gradients."""
    gen = torch.Generator().manual_seed(5)
    params = [torch.nn.Parameter(torch.randn(n, generator=gen)) for n in (100, 50)]
    opt = RemoteAdamW([{"params": params[:1]}, {"params": params[1:], "lr": 0.1}],
                      target=daemon.target, name_prefix=prefix)
    params[0].grad = torch.randn(100, generator=gen)
    opt.step()  # param.1 had no gradient: it stays at step 0
    names = [f"{prefix}param.{i}" for i in range(2)]
    before = _snapshot(client, names)
    values = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    group = opt.param_groups[1]
    kept = {k: group[k] for k in change}
    group.update(change)
    with pytest.raises(optstate.InvalidArgument, match=f"'{prefix}param.1'.*{says}"):
        opt.step()
    _assert_unchanged(client, before)
    for p, v in zip(params, values):
        assert bits_equal(p.detach(), v)
    group.update(kept)
    opt.step()
    assert [client.describe(n).min_step for n in names] == [2, 1]


def test_a_parameter_whose_dtype_changed_is_refused_naming_it(daemon, client, prefix):
    p = torch.nn.Parameter(torch.ones(16))
    opt = RemoteAdamW([("w", p)], target=daemon.target, name_prefix=prefix)
    p.grad = torch.ones(16)
    opt.step()
    before = _snapshot(client, [prefix + "w"])
    p.data = p.data.bfloat16()  # as model.bfloat16() does
    p.grad = torch.ones(16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=f"parameter '{prefix}w' is torch.bfloat16 but was "
                                        "registered as torch.float32"):
        opt.step()
    _assert_unchanged(client, before)


def test_unsupported_options_and_dtypes_are_refused(daemon, prefix):
    with pytest.raises(TypeError, match="float64"):
        RemoteAdamW([torch.nn.Parameter(torch.ones(2, dtype=torch.float64))],
                    target=daemon.target, name_prefix=prefix)
    with pytest.raises(ValueError, match="wire_dtype"):
        RemoteAdamW([torch.nn.Parameter(torch.ones(2))], target=daemon.target,
                    wire_dtype=torch.int8)
    with pytest.raises(ValueError, match="target"):
        RemoteAdamW([torch.nn.Parameter(torch.ones(2))])
    with pytest.raises(ValueError, match="torch.distributed"):
        RemoteAdamW([torch.nn.Parameter(torch.ones(2))], target=daemon.target, shard=True)


def test_a_parameter_not_on_the_cpu_is_refused_naming_it_and_nothing_is_sent(daemon, client,
                                                                             prefix):
    """A parameter (and so its gradient) on another device than the CPU: refused by name at
    construction, before any parameter is registered, and at step(), before anything is
    sent. meta is the device a CPU-only torch can make (CUDA parameters are staged:
    test_staging.py)."""
    cpu, off = torch.nn.Parameter(torch.ones(8)), torch.nn.Parameter(torch.ones(8, device="meta"))
    with pytest.raises(ValueError, match=f"parameter '{prefix}off'.* on meta"):
        RemoteAdamW([("cpu", cpu), ("off", off)], target=daemon.target, name_prefix=prefix)
    assert not [g for g in client.list_groups() if g.name.startswith(prefix)]

    # After registration: a module moved with torch's swap-on-conversion keeps its
    # Parameter objects (as model.cuda() does with the default set_data path), so the
    # optimizer's parameter itself is on the other device.
    a, moved = torch.nn.Parameter(torch.ones(6)), torch.nn.Linear(2, 5, bias=False)
    opt = RemoteAdamW([("a", a), ("b", moved.weight)], target=daemon.target, name_prefix=prefix)
    b = moved.weight
    a.grad, b.grad = torch.ones(6), torch.ones(5, 2)
    opt.step()
    before = _snapshot(client, [prefix + "a", prefix + "b"])
    a_before = a.detach().clone()
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        moved.to("meta")
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    assert moved.weight is b and b.device.type == "meta"
    a.grad, b.grad = torch.ones(6), torch.ones(5, 2, device="meta")
    with pytest.raises(ValueError, match=f"parameter '{prefix}b': RemoteAdamW steps CPU or CUDA "
                                         "tensors with the gradient on the parameter's device, "
                                         "and this parameter is on device 'meta'"):
        opt.step()
    _assert_unchanged(client, before)
    assert bits_equal(a.detach(), a_before)
    assert opt.state[a]["step"].item() == 1.0


def test_a_parameter_without_elements_is_refused_by_name_before_anything_is_registered(
        daemon, client, prefix):
    # It failed with "RegisterGroup needs at least one initial value", naming nothing.
    model = torch.nn.Linear(8, 0)
    keep = torch.nn.Parameter(torch.ones(4))
    with pytest.raises(ValueError, match=f"parameter '{prefix}weight' has no elements "
                                         r"\(shape \(0, 8\)\)"):
        RemoteAdamW([("keep", keep)] + list(model.named_parameters()), target=daemon.target,
                    name_prefix=prefix)
    assert not [g for g in client.list_groups() if g.name.startswith(prefix)]


@pytest.mark.parametrize("member, error, words", [
    ({"target": "127.0.0.1:1", "weight": "2"}, TypeError, "'weight' must be a number"),
    ({"target": "127.0.0.1:1", "weight": True}, TypeError, "'weight' must be a number"),
    ({"target": 5}, TypeError, "'target' must be a str"),
    ({"target": "127.0.0.1:1", "identiy": "a"}, ValueError, "not 'identiy'"),
    ({"target": "127.0.0.1:1", "wieght": 2.0}, ValueError, "not 'wieght'"),
])
def test_a_member_dict_with_a_wrong_key_or_type_is_refused_naming_it(member, error, words):
    # A misspelled key was ignored (placement then hashed the address the docs warn
    # against, or weight 1), and a weight of "2" raised RuntimeError std::bad_cast.
    with pytest.raises(error, match=words):
        optstate.Client([member, "127.0.0.1:2"])


def test_a_checkpoint_wait_no_page_can_reach_and_a_rewind_of_no_possible_job_are_refused(
        fresh_daemons, prefix, tmp_path):
    # Step 2^64-1 is no page's (Step refuses it), so a wait for it could only end at the
    # deadline; a prefix no group name can start with names no job. Both INVALID_ARGUMENT,
    # at once, nothing written or read.
    d = fresh_daemons(f"--state_dir={tmp_path}", "--checkpoint_interval=0")
    c = optstate.Client(d.target, attempt_timeout=10.0, max_attempts=1)
    c.register(prefix + "w", np.ones(8, dtype=np.float32))
    with pytest.raises(optstate.InvalidArgument, match="at most 2\\^64-2"):
        c.checkpoint(wait_for_step=2**64 - 1)
    for bad in ("job one/", "x" * 513):
        with pytest.raises(optstate.InvalidArgument, match="prefix starts group names"):
            c.rewind_job(bad)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("ckpt-")]


def test_a_keyword_neither_remote_adamw_nor_the_client_takes_is_a_type_error(daemon, client,
                                                                               prefix):
    # Passed on to optstate.Client, a misspelt keyword gave nanobind's "incompatible
    # function arguments"; beside client= it was dropped in silence (amsgard=True trained
    # without amsgrad).
    with pytest.raises(TypeError, match="unexpected keyword argument 'amsgard'"):
        RemoteAdamW([torch.nn.Parameter(torch.ones(8))], target=daemon.target,
                    name_prefix=prefix, amsgard=True)
    with pytest.raises(TypeError, match="takes no optstate.Client options \\(max_attempts\\)"):
        RemoteAdamW([torch.nn.Parameter(torch.ones(8))], client=client, name_prefix=prefix,
                    max_attempts=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'momentum'"):
        RemoteAdamW([torch.nn.Parameter(torch.ones(8))], client=client, name_prefix=prefix,
                    momentum=0.9)
    assert [g.name for g in client.list_groups() if g.name.startswith(prefix)] == []


def test_values_torch_takes_and_the_daemon_refuses_are_value_errors(daemon, prefix):
    # optstate.InvalidArgument was no ValueError: `except ValueError` missed a refused lr.
    for lr, weight_decay in ((float("inf"), 0.01), (1e40, 0.01), (1e-3, float("inf"))):
        with pytest.raises(ValueError) as e:
            RemoteAdamW([torch.nn.Parameter(torch.ones(8))], lr=lr, weight_decay=weight_decay,
                        target=daemon.target, name_prefix=prefix)
        assert isinstance(e.value, optstate.InvalidArgument), e.value
    p = torch.nn.Parameter(torch.ones(8))
    with RemoteAdamW([p], lr=1e-3, target=daemon.target, name_prefix=prefix,
                     delete_on_close=True) as opt:
        opt.param_groups[0]["lr"] = -1e-3  # torch takes it, and steps uphill
        p.grad = torch.ones(8)
        with pytest.raises(ValueError, match="lr"):
            opt.step()


def test_names_that_repeat_across_submodules_are_refused_saying_how_to_name_them(daemon,
                                                                                prefix):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="model.named_parameters\\(\\) \\(full paths\\)"):
        RemoteAdamW([{"params": model[0].named_parameters(), "lr": 1e-4},
                     {"params": model[1].named_parameters(), "lr": 1e-3}],
                    target=daemon.target, name_prefix=prefix)
