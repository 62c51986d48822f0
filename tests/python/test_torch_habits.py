"""RemoteAdamW keeps torch.optim.AdamW's habits: its positional arguments, its options
(accepted when they mean nothing different, refused by name otherwise), its argument checks
(same exception types and messages as torch's own), opt.state[p], the four state-dict hooks,
pickling and deepcopy, add_param_group refusals, close() and context managers."""
import copy
import os
import pickle
import re
import time

import numpy as np
import pytest
import torch

import optstate
from optstate.torch import RemoteAdamW


def _params(n=2, size=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(size, generator=gen)) for _ in range(n)]


def _grads(params, step):
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)


def _torch_error(kwargs):
    """What torch.optim.AdamW raises for these arguments: (type, message), or None."""
    try:
        torch.optim.AdamW(_params(), **kwargs)
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e), str(e)
    return None


def test_lr_is_the_second_positional_argument_as_in_torch(daemon, prefix, monkeypatch):
    monkeypatch.setenv("OPTSTATE_TARGET", daemon.target)
    p = _params(1)
    opt = RemoteAdamW(p, 0.05, (0.8, 0.9), 1e-6, 0.2, False, name_prefix=prefix)
    ref = torch.optim.AdamW([q.detach().clone() for q in p], 0.05, (0.8, 0.9), 1e-6, 0.2, False)
    group = opt.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"], group["amsgrad"]) \
        == (0.05, (0.8, 0.9), 1e-6, 0.2, False)
    assert {k: v for k, v in group.items() if k != "params"} == \
        {k: v for k, v in ref.param_groups[0].items() if k != "params"} | {
            "decoupled_weight_decay": True}
    info = opt.client.describe(prefix + "param.0")
    assert (info.lr, info.betas, info.eps, info.weight_decay) == (0.05, (0.8, 0.9), 1e-6, 0.2)
    assert opt.client.target == daemon.target  # target came from OPTSTATE_TARGET
    opt.close()


def test_target_is_keyword_only_and_a_target_given_as_lr_is_a_clear_type_error(daemon):
    with pytest.raises(TypeError, match="lr is RemoteAdamW's second positional argument"):
        RemoteAdamW(_params(1), daemon.target)


@pytest.mark.parametrize("option", ["foreach", "fused", "capturable", "differentiable"])
def test_torch_options_are_accepted_when_false_or_none(daemon, prefix, option):
    values = [False] + ([None] if option in ("foreach", "fused") else [])
    for value in values:
        opt = RemoteAdamW(_params(1), target=daemon.target, name_prefix=f"{prefix}{value}/",
                          **{option: value})
        assert opt.param_groups[0][option] is value
        opt.close()


@pytest.mark.parametrize("option", ["foreach", "fused", "capturable", "differentiable"])
def test_torch_options_set_true_are_refused_by_name_before_anything_is_registered(
        daemon, client, prefix, option):
    with pytest.raises(RuntimeError, match=rf"RemoteAdamW does not support {option}=True"):
        RemoteAdamW(_params(1), target=daemon.target, name_prefix=prefix, **{option: True})
    assert not [g for g in client.list_groups() if g.name.startswith(prefix)]
    # Also in a param group added later, which is then not added.
    opt = RemoteAdamW(_params(1), target=daemon.target, name_prefix=prefix)
    with pytest.raises(RuntimeError, match=rf"{option}=True"):
        opt.add_param_group({"params": _params(1, seed=1), option: True})
    assert len(opt.param_groups) == 1


def test_torchs_own_refusals_of_option_combinations_come_first(daemon):
    for kwargs in ({"fused": True, "differentiable": True}, {"fused": True, "foreach": True}):
        with pytest.raises(RuntimeError) as e:
            RemoteAdamW(_params(1), target=daemon.target, **kwargs)
        # torch refuses these on CUDA only after choosing fused for the device; the messages
        # are its own (torch/optim/adam.py).
        assert str(e.value) in ("`fused` does not support `differentiable`",
                                "`fused` and `foreach` cannot be `True` together.")


@pytest.mark.parametrize("kwargs", [
    {"lr": -1.0}, {"lr": float("nan")}, {"eps": -1e-8}, {"betas": (1.0, 0.999)},
    {"betas": (0.9, -0.1)}, {"weight_decay": -1}, {"lr": torch.tensor([1e-3, 1e-3])},
    {"lr": torch.tensor(1e-3), "foreach": True}, {"betas": (0.9, torch.tensor(0.99))},
    {"betas": (torch.tensor(0.9), 0.99)},
    {"betas": (torch.tensor(0.9), torch.tensor(0.99)), "foreach": True},
    {"betas": (torch.tensor([0.9, 0.8]), torch.tensor(0.99))},
    {"betas": (torch.tensor(0.9), torch.tensor([0.99, 0.9]))},
], ids=lambda k: ",".join(f"{a}={v}" for a, v in k.items()))
def test_every_argument_check_raises_torchs_exception_and_message(daemon, kwargs):
    expected = _torch_error(kwargs)
    assert expected is not None, "torch.optim.AdamW accepts these; the case is wrong"
    with pytest.raises(expected[0]) as e:
        RemoteAdamW(_params(), target=daemon.target, **kwargs)
    assert str(e.value) == expected[1]


def test_tensor_lr_and_betas_of_one_element_are_accepted_as_torch_accepts_them(daemon, prefix):
    kwargs = {"lr": torch.tensor(0.01), "betas": (torch.tensor([[0.9]]), torch.tensor([0.99]))}
    opt = RemoteAdamW(_params(1), target=daemon.target, name_prefix=prefix, **kwargs)
    ref = torch.optim.AdamW(_params(1), **kwargs)
    assert [b.shape for b in opt.param_groups[0]["betas"]] == \
        [b.shape for b in ref.param_groups[0]["betas"]]
    info = opt.client.describe(prefix + "param.0")
    assert info.lr == float(torch.tensor(0.01).item())
    assert info.betas == (float(torch.tensor(0.9).item()), float(torch.tensor(0.99).item()))
    opt.close()


def test_opt_state_gives_step_exp_avg_and_exp_avg_sq_read_from_the_daemon(daemon, prefix):
    params = _params(2)
    opt = RemoteAdamW(params, target=daemon.target, name_prefix=prefix)
    ref_params = [p.detach().clone().requires_grad_() for p in params]
    ref = torch.optim.AdamW(ref_params)
    assert len(opt.state) == 0 and opt.state[params[0]] == {}
    for step in range(1, 4):
        _grads(params, step)
        _grads(ref_params, step)
        opt.step()
        ref.step()
    assert len(opt.state) == 2 and params[0] in opt.state and list(opt.state) == params
    for p, q in zip(params, ref_params):
        state, want = opt.state[p], ref.state[q]
        assert set(state) == set(want) == {"step", "exp_avg", "exp_avg_sq"}
        assert float(state["step"]) == float(want["step"]) == 3.0
        assert torch.equal(state["exp_avg"], want["exp_avg"])
        assert torch.equal(state["exp_avg_sq"], want["exp_avg_sq"])
    # A copy: changing it changes nothing on the daemon.
    opt.state[params[0]]["exp_avg"].zero_()
    assert torch.equal(opt.state[params[0]]["exp_avg"], ref.state[ref_params[0]]["exp_avg"])
    with pytest.raises(TypeError, match="load_state_dict"):
        opt.state[params[0]] = {}
    opt.close()


def test_the_four_state_dict_hooks_run_as_torchs(daemon, prefix):
    opt = RemoteAdamW(_params(1), target=daemon.target, name_prefix=prefix)
    _grads(opt.param_groups[0]["params"], 1)
    opt.step()
    calls = []
    opt.register_state_dict_pre_hook(lambda o: calls.append(("save pre", o is opt)))

    def save_post(o, sd):
        calls.append(("save post", o is opt))
        return dict(sd, marked=True)
    opt.register_state_dict_post_hook(save_post)

    def load_pre(o, sd):
        calls.append(("load pre", "marked" in sd))
        sd = dict(sd)
        sd["param_groups"] = [dict(g, lr=0.125) for g in sd["param_groups"]]
        return sd
    opt.register_load_state_dict_pre_hook(load_pre)
    opt.register_load_state_dict_post_hook(lambda o: calls.append(("load post", o is opt)))
    sd = opt.state_dict()
    assert sd["marked"] is True
    opt.load_state_dict(sd)
    assert calls == [("save pre", True), ("save post", True), ("load pre", True),
                     ("load post", True)]
    assert opt.param_groups[0]["lr"] == 0.125  # the pre hook's replacement was loaded
    opt.close()


def _step_hook_events(make_optimizer, subclass=False):
    """What torch's step hooks see over two steps of `make_optimizer`'s optimizer (of a
    subclass whose step calls super().step() when `subclass`): each hook's name and the
    arguments it was given, and what step() returned. The pre-hook gives the first step a
    closure, replacing its arguments as torch allows."""
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)
    events, closure_calls = [], []

    def closure():
        closure_calls.append(1)
        return torch.tensor(7.0)

    def seen(name):
        return lambda opt, args, kwargs: events.append(
            (name, len(args), sorted(kwargs), args[0] is opt))

    def own_pre(opt, args, kwargs):
        events.append(("pre", len(args), sorted(kwargs), args[0] is opt))
        if not closure_calls:
            return args, {"closure": closure}
        return None

    params = _params()
    _grads(params, 0)
    opt = make_optimizer(params)
    if subclass:
        opt.__class__ = type("Sub" + type(opt).__name__, (type(opt),),
                             {"step": lambda self, closure=None: super(type(self), self).step(
                                 closure)})
        opt._patch_step_function()
    handles = [register_optimizer_step_pre_hook(seen("global pre")),
               register_optimizer_step_post_hook(seen("global post")),
               opt.register_step_pre_hook(own_pre), opt.register_step_post_hook(seen("post"))]
    try:
        results = [opt.step(), opt.step()]
    finally:
        for handle in handles:
            handle.remove()
    return events, [None if r is None else float(r) for r in results], len(closure_calls)


@pytest.mark.parametrize("subclass", [False, True])
def test_step_hooks_run_as_torchs(daemon, prefix, subclass):
    # RemoteAdamW wraps its step as torch's Optimizer wraps every step (its own wrapper,
    # _step_hooks.py): global and own pre- and post-hooks in torch's order with torch's
    # arguments, and a pre-hook may replace the arguments. A subclass whose step calls
    # super().step() runs each hook once a step too (torch runs them twice there once its
    # own class's step was wrapped, so the reference is torch's AdamW itself).
    ours = _step_hook_events(
        lambda params: RemoteAdamW(params, target=daemon.target, name_prefix=prefix), subclass)
    torchs = _step_hook_events(lambda params: torch.optim.AdamW(params))
    assert ours == torchs
    assert ours[0][:4] == [("global pre", 1, [], True), ("pre", 1, [], True),
                           ("post", 1, ["closure"], True), ("global post", 1, ["closure"], True)]
    assert ours[1:] == ([7.0, None], 1)


def test_a_profiler_records_one_optimizer_step_range_a_step_as_torchs(daemon, prefix):
    # Torch's wrapper opens the profiler's range at every step; RemoteAdamW's only while a
    # profiler runs, which then records it as torch's does.
    def recorded(opt, params):
        _grads(params, 0)
        opt.step()  # not profiled
        _grads(params, 1)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            opt.step()
        return [e.name for e in prof.events() if e.name.startswith("Optimizer.step#")]

    params = _params()
    assert recorded(RemoteAdamW(params, target=daemon.target, name_prefix=prefix), params) == [
        "Optimizer.step#RemoteAdamW.step"]
    params = _params()
    assert recorded(torch.optim.AdamW(params), params) == ["Optimizer.step#AdamW.step"]


@pytest.mark.parametrize("enabled", [True, False])
def test_step_runs_without_grad_and_gives_the_caller_its_grad_mode_back(daemon, prefix,
                                                                       monkeypatch, enabled):
    # As torch.optim.AdamW's step: the closure with grad, the step itself without, the
    # caller's mode after, a refused step included.
    import optstate.torch as remote
    real, inside = remote._prepare_param_step, []
    monkeypatch.setattr(remote, "_prepare_param_step",
                        lambda *args: inside.append(torch.is_grad_enabled()) or real(*args))
    params = _params()
    opt = RemoteAdamW(params, target=daemon.target, name_prefix=prefix)
    in_closure = []

    def closure():
        in_closure.append(torch.is_grad_enabled())
        return torch.tensor(1.0)

    _grads(params, 0)
    with torch.set_grad_enabled(enabled):
        assert float(opt.step(closure)) == 1.0
        assert torch.is_grad_enabled() == enabled
        params[0].grad = torch.zeros(8).to_sparse()  # sparse: refused
        with pytest.raises(ValueError, match="sparse gradients are not supported"):
            opt.step()
        assert torch.is_grad_enabled() == enabled
    assert (in_closure, inside) == ([True], [False, False])
    opt.close()


def test_pickle_and_deepcopy_give_an_optimizer_that_steps_the_same_groups(daemon, prefix):
    params = _params(2)
    opt = RemoteAdamW(params, target=daemon.target, name_prefix=prefix, max_attempts=3)
    ref_params = [p.detach().clone().requires_grad_() for p in params]
    ref = torch.optim.AdamW(ref_params)
    for step in (1, 2):
        _grads(params, step)
        _grads(ref_params, step)
        opt.step()
        ref.step()
    for copied in (pickle.loads(pickle.dumps(opt)), copy.deepcopy(opt)):
        copied_params = copied.param_groups[0]["params"]
        assert all(c is not p and torch.equal(c, p) for c, p in zip(copied_params, params))
        assert float(copied.state[copied_params[0]]["step"]) == 2.0
        assert torch.equal(copied.state[copied_params[1]]["exp_avg_sq"],
                           ref.state[ref_params[1]]["exp_avg_sq"])
        copied.close()
    # The last copy steps on: step 3 of the same daemon groups, torch's numbers.
    copied = copy.deepcopy(opt)
    copied_params = copied.param_groups[0]["params"]
    _grads(copied_params, 3)
    _grads(ref_params, 3)
    copied.step()
    ref.step()
    for c, q in zip(copied_params, ref_params):
        assert torch.equal(copied.state[c]["exp_avg"], ref.state[q]["exp_avg"])
    assert opt.client.describe(prefix + "param.0").min_step == 3
    copied.close()
    opt.close()


def test_what_cannot_be_pickled_is_a_clear_type_error(daemon, client, prefix):
    opt = RemoteAdamW(_params(1), client=client, name_prefix=prefix)
    with pytest.raises(TypeError, match="client="):
        pickle.dumps(opt)
    closed = RemoteAdamW(_params(1), target=daemon.target, name_prefix=prefix + "c/")
    closed.close()
    with pytest.raises(TypeError, match="closed"):
        copy.deepcopy(closed)


def test_a_refused_add_param_group_leaves_param_groups_as_they_were(daemon, client, prefix):
    opt = RemoteAdamW(_params(1), target=daemon.target, name_prefix=prefix)
    before = [dict(g) for g in opt.param_groups]
    # The daemon refuses the second parameter's group (another job's, other hyperparameters).
    client.register(prefix + "param.2", 8, lr=0.5)
    new = _params(2, seed=3)
    with pytest.raises(optstate.AlreadyExists):
        opt.add_param_group({"params": new})
    assert opt.param_groups == before
    # The first new parameter's group, which this call created, is gone again.
    assert {g.name for g in client.list_groups() if g.name.startswith(prefix)} == \
        {prefix + "param.0", prefix + "param.2"}
    for bad in ({"params": new, "lr": -1.0}, {"params": new, "betas": (0.9, 1.5)},
                {"params": new, "eps": -1.0}):
        with pytest.raises(ValueError):
            opt.add_param_group(bad)
        assert opt.param_groups == before
    opt.close()


def test_close_and_delete_on_close_remove_the_jobs_groups(daemon, client, prefix):
    with RemoteAdamW(_params(2), target=daemon.target, name_prefix=prefix + "kept/") as opt:
        _grads(opt.param_groups[0]["params"], 1)
        opt.step()
    with pytest.raises(ValueError, match="closed"):
        opt.step()
    assert opt.client.closed
    assert len([g for g in client.list_groups() if g.name.startswith(prefix + "kept/")]) == 2
    with RemoteAdamW(_params(2), target=daemon.target, name_prefix=prefix + "gone/",
                     delete_on_close=True) as opt:
        _grads(opt.param_groups[0]["params"], 1)
        opt.step()
        assert len([g for g in client.list_groups() if g.name.startswith(prefix + "gone/")]) == 2
    assert not [g for g in client.list_groups() if g.name.startswith(prefix + "gone/")]
    # A client passed in stays open.
    opt = RemoteAdamW(_params(1), client=client, name_prefix=prefix + "own/")
    opt.close()
    assert not client.closed and client.describe(prefix + "own/param.0").min_step == 0


def test_client_close_and_context_manager(daemon, prefix):
    with optstate.Client(daemon.target) as c:
        c.register(prefix + "g", 4)
        assert not c.closed
    assert c.closed and "closed" in repr(c)
    with pytest.raises(ValueError, match=re.escape(f"optstate.Client('{daemon.target}') is closed")):
        c.describe(prefix + "g")
    c.close()  # idempotent


def test_exceptions_are_real_classes_mapped_from_grpc_codes(client, prefix):
    assert issubclass(optstate.NotFound, optstate.Error)
    assert optstate.NotFound.__module__ == "optstate.errors"
    with pytest.raises(optstate.NotFound) as e:
        client.describe(prefix + "missing")
    assert e.value.code == "NOT_FOUND" and e.value.code_value == 5
    assert e.value.target == client.target


def test_maximize_and_amsgrad_are_kept_in_the_groups_registration(daemon, client, prefix):
    opt = RemoteAdamW(_params(1), target=daemon.target, name_prefix=prefix, maximize=True)
    info = client.describe(prefix + "param.0")
    assert info.maximize is True and info.amsgrad is False
    opt.close()
    opt = RemoteAdamW(_params(1), target=daemon.target, name_prefix=prefix + "a/", amsgrad=True)
    info = client.describe(prefix + "a/param.0")
    assert info.amsgrad is True and info.maximize is False
    stats = next(g for g in client.stats()["groups"] if g["info"]["name"] == prefix + "a/param.0")
    assert stats["info"]["host_bytes"] == 8 * 16  # params, m, v and max_exp_avg_sq
    opt.close()


def test_a_listener_that_never_answers_fails_within_the_connect_timeout(prefix):
    import socket
    import time
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        target = f"127.0.0.1:{listener.getsockname()[1]}"
        client = optstate.Client(target, connect_timeout=1.0, max_attempts=2,
                                 initial_backoff=0.01)
        started = time.monotonic()
        with pytest.raises(optstate.Unavailable) as e:
            client.register(prefix + "g", np.zeros(4, np.float32))
        elapsed = time.monotonic() - started
    assert target in str(e.value)
    assert elapsed < 5.0, f"took {elapsed:.1f} s with connect_timeout=1"


def test_a_process_that_exits_with_optimizers_and_clients_alive_reports_no_leak(daemon, prefix):
    """nanobind reports instances still alive when its module goes away; a script that
    ends with an optimizer, a client, GroupInfo, GroupState and an exception in its globals
    must end quietly."""
    import subprocess
    import sys
    script = f"""
import torch, optstate
from optstate.torch import RemoteAdamW
model = torch.nn.Linear(4, 4)
opt = RemoteAdamW(model.parameters(), target={daemon.target!r}, name_prefix={prefix!r})
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)
for p in model.parameters():
    p.grad = torch.ones_like(p)
opt.step(); sched.step()
client = optstate.Client({daemon.target!r})
info, state = client.describe({prefix!r} + "param.0"), client.export_state({prefix!r} + "param.0")
try:
    client.describe("missing")
except optstate.NotFound as e:
    error = e
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "leak" not in done.stderr, done.stderr


def _torch_reference(params, **kwargs):
    ref_params = [p.detach().clone().requires_grad_() for p in params]
    return ref_params, torch.optim.AdamW(ref_params, **kwargs)


def _step_both(opt, params, ref, ref_params, step):
    """Step `step`'s gradients on RemoteAdamW and on torch's AdamW; the params equal."""
    _grads(params, step)
    _grads(ref_params, step)
    opt.step()
    ref.step()
    assert all(torch.equal(p, q) for p, q in zip(params, ref_params)), f"step {step}"


@pytest.mark.parametrize("how", ["assign", "clear", "del"])
def test_dropping_opt_state_starts_it_afresh_as_torch_does(daemon, prefix, how):
    # torch's ways to drop state: opt.state = defaultdict(dict), opt.state.clear(), del
    # opt.state[p]. The daemon's state must go too (an assignment that left it would
    # step on with the old moments and step count, silently).
    import collections
    params = _params(3)
    opt = RemoteAdamW(params, target=daemon.target, name_prefix=prefix, weight_decay=0.1)
    ref_params, ref = _torch_reference(params, weight_decay=0.1)
    for step in range(1, 4):
        _step_both(opt, params, ref, ref_params, step)
    if how == "assign":
        opt.state = collections.defaultdict(dict)
        ref.state = collections.defaultdict(dict)
    elif how == "clear":
        opt.state.clear()
        ref.state.clear()
    else:
        del opt.state[params[1]]
        del ref.state[ref_params[1]]
    assert len(opt.state) == len(ref.state)
    for step in range(4, 7):
        _step_both(opt, params, ref, ref_params, step)
    steps = [float(opt.state[p]["step"]) for p in params]
    assert steps == [float(ref.state[q]["step"]) for q in ref_params]
    assert steps == ([6.0, 3.0, 6.0] if how == "del" else [3.0, 3.0, 3.0])
    for p, q in zip(params, ref_params):
        assert torch.equal(opt.state[p]["exp_avg"], ref.state[q]["exp_avg"])
        assert torch.equal(opt.state[p]["exp_avg_sq"], ref.state[q]["exp_avg_sq"])
    # What torch would not do either, refused and nothing dropped.
    with pytest.raises(KeyError):
        del opt.state[torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(TypeError, match="only an empty mapping"):
        opt.state = {params[0]: {}}
    with pytest.raises(TypeError, match="only an empty mapping"):
        opt.state = None
    assert [float(opt.state[p]["step"]) for p in params] == steps
    opt.close()


def test_a_model_cast_before_the_first_step_steps_as_one_cast_before_the_optimizer(
        daemon, prefix):
    # torch's AdamW takes model.to(dtype) between its construction and its first step (it
    # holds no state yet). RemoteAdamW registers the groups anew from the cast values:
    # the run equals one whose model was cast before the optimizer was made, bit for bit.
    torch.manual_seed(3)
    late = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 2))
    early = copy.deepcopy(late).to(torch.bfloat16)
    opt_late = RemoteAdamW(late.parameters(), lr=0.01, target=daemon.target,
                           name_prefix=prefix + "late/")
    late.to(torch.bfloat16)
    opt_early = RemoteAdamW(early.parameters(), lr=0.01, target=daemon.target,
                            name_prefix=prefix + "early/")
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    for _ in range(3):
        for model, opt in ((late, opt_late), (early, opt_early)):
            opt.zero_grad()
            model(x).float().pow(2).sum().backward()
            opt.step()
    for a, b in zip(late.parameters(), early.parameters()):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b)
    assert float(opt_late.state[next(late.parameters())]["step"]) == 3.0
    # After steps the state is the daemon's fp32 masters: a cast then is refused, as
    # torch's own step then fails on its bfloat16 state.
    late.to(torch.float32)
    opt_late.zero_grad()
    late(x.float()).pow(2).sum().backward()
    with pytest.raises(TypeError, match="cast the model before making the optimizer"):
        opt_late.step()
    opt_late.close()
    opt_early.close()
    # With shared_buffers=True the gradient slots are of the old dtype: refused, saying
    # what to do, nothing sent (and the optimizer still steps once cast back).
    shared_model = torch.nn.Linear(6, 2)
    shared = RemoteAdamW(shared_model.parameters(), lr=0.01, target=daemon.target,
                         name_prefix=prefix + "shared/", shared_buffers=True)
    shared_model.to(torch.bfloat16)
    shared_model(x).float().pow(2).sum().backward()
    with pytest.raises(TypeError, match="cast the model before making the optimizer"):
        shared.step()
    assert all(g.max_step == 0 for g in shared.client.list_groups()
               if g.name.startswith(prefix + "shared/"))
    shared.close()


class _ImportCountingClient(optstate.Client):
    imports = 0

    def import_state(self, *args, **kwargs):
        self.imports += 1
        return super().import_state(*args, **kwargs)


def test_a_job_attaching_to_groups_never_stepped_steps_from_its_own_values(daemon, client,
                                                                           prefix):
    # A run that stopped before its first step (or a notebook cell run again with other
    # weights) left the job's groups at step 0 with its values: the next run steps from
    # its own, as torch does, not from the daemon's.
    first = RemoteAdamW(_params(2, seed=1), target=daemon.target, name_prefix=prefix)
    first.close()
    params = _params(2, seed=2)
    counting = _ImportCountingClient(daemon.target)
    opt = RemoteAdamW(params, client=counting, name_prefix=prefix, delete_on_close=True)
    assert counting.imports == 2  # each group's values made this run's, at construction
    ref_params, ref = _torch_reference(params)
    for step in (1, 2):
        _step_both(opt, params, ref, ref_params, step)
    # A rank of the same job holding the same values (attached after the first rank
    # registered) steps the same numbers, and imports nothing over them.
    same = _params(2, seed=3)
    rank0 = RemoteAdamW(same, target=daemon.target, name_prefix=prefix + "ranks/",
                        delete_on_close=True)
    rank1_params = [p.detach().clone().requires_grad_() for p in same]
    counting = _ImportCountingClient(daemon.target, lease_holder=rank0.lease_holder)
    rank1 = RemoteAdamW(rank1_params, client=counting, name_prefix=prefix + "ranks/")
    assert counting.imports == 0
    ref_params, ref = _torch_reference(same)
    for ps in (rank1_params, same, ref_params):
        _grads(ps, 1)
    rank1.step()
    rank0.step()
    ref.step()
    for a, b, q in zip(same, rank1_params, ref_params):
        assert torch.equal(a, q) and torch.equal(b, q)
    assert client.describe(prefix + "ranks/param.0").max_step == 1
    rank1.close()
    rank0.close()
    opt.close()


def test_unnamed_parameters_keep_their_groups_when_param_groups_change(daemon, client, prefix):
    # model.parameters() names groups param.<index>: a parameter keeps its group when
    # others leave param_groups or its place changes, and one added later takes a free name.
    a, b = _params(2, seed=4)
    opt = RemoteAdamW([a, b], target=daemon.target, name_prefix=prefix, delete_on_close=True)
    (ra, rb), ref = _torch_reference([a, b])
    _grads([a, b], 1)
    _grads([ra, rb], 1)
    opt.step()
    ref.step()
    opt.param_groups[0]["params"].pop(0)
    ref.param_groups[0]["params"].pop(0)
    c = torch.nn.Parameter(torch.randn(4, generator=torch.Generator().manual_seed(5)))
    rc = c.detach().clone().requires_grad_()
    opt.add_param_group({"params": [c]})
    ref.add_param_group({"params": [rc]})
    assert client.describe(prefix + "param.2").num_elements == 4  # param.1 is b's
    for step in (2, 3):
        for p, q in ((b, rb), (c, rc)):
            gen = torch.Generator().manual_seed(step * 7 + p.numel())
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        opt.step()
        ref.step()
    assert torch.equal(b, rb) and torch.equal(c, rc)
    assert float(opt.state[b]["step"]) == 3.0 and float(opt.state[c]["step"]) == 2.0
    opt.param_groups.reverse()
    ref.param_groups.reverse()
    assert torch.equal(opt.state[b]["exp_avg_sq"], ref.state[rb]["exp_avg_sq"])
    assert torch.equal(opt.state[c]["exp_avg"], ref.state[rc]["exp_avg"])
    opt.close()


def test_a_parameter_listed_twice_or_memory_shared_by_two_is_refused_by_name(daemon, client,
                                                                            prefix):
    # A tied weight listed twice: torch warns and steps it twice a step; RemoteAdamW is
    # made (with torch's warning) and refuses to step it, saying which, nothing sent.
    tied, other = torch.nn.Parameter(torch.randn(8)), torch.nn.Parameter(torch.randn(8))
    with pytest.warns(UserWarning, match="duplicate"):
        opt = RemoteAdamW([tied, other, tied], target=daemon.target, name_prefix=prefix,
                          delete_on_close=True)
    assert {g.name for g in client.list_groups() if g.name.startswith(prefix)} == \
        {prefix + "param.0", prefix + "param.1"}
    _grads([tied, other], 1)
    with pytest.raises(ValueError, match=r"'.*param\.0' is listed twice"):
        opt.step()
    assert client.describe(prefix + "param.0").max_step == 0
    opt.close()
    a = torch.nn.Parameter(torch.randn(8))
    b = torch.nn.Parameter(torch.randn(8))
    b.data = a.data
    with pytest.raises(ValueError, match=r"'.*param\.0' and '.*param\.1' share memory"):
        RemoteAdamW([a, b], target=daemon.target, name_prefix=prefix)
    buffer = torch.randn(4, 6)
    overlapping = [torch.nn.Parameter(buffer[:, :4]), torch.nn.Parameter(buffer[:, 3:])]
    with pytest.raises(ValueError, match="share memory"):
        RemoteAdamW(overlapping, target=daemon.target, name_prefix=prefix)
    assert not [g for g in client.list_groups() if g.name.startswith(prefix)]
    # Views of one buffer that share no element (interleaved columns, slices) step apart.
    views = [torch.nn.Parameter(buffer[:, 0::2]), torch.nn.Parameter(buffer[:, 1::2])]
    opt = RemoteAdamW(views, target=daemon.target, name_prefix=prefix, delete_on_close=True)
    ref_params, ref = _torch_reference(views)
    _step_both(opt, views, ref, ref_params, 1)
    opt.close()


@pytest.mark.parametrize("shared_buffers", [False, True])
def test_memory_repeated_or_shared_is_refused_also_when_given_between_steps(daemon, client,
                                                                             prefix,
                                                                             shared_buffers):
    # An expanded parameter was registered (or, into a shared buffer, made 24 elements of
    # its own) and each step updated the daemon, then failed writing the values back;
    # `b.data = a.data` between steps was stepped as two parameters, which drifted apart.
    expanded = torch.nn.Parameter(torch.randn(1, 6).expand(4, 6))
    expanded.grad = torch.randn(4, 6)
    with pytest.raises(RuntimeError):  # torch's own AdamW cannot step it either
        torch.optim.AdamW([expanded]).step()
    with pytest.raises(ValueError, match=r"'.*param\.0'.*\.expand\(\)ed"):
        RemoteAdamW([expanded], target=daemon.target, name_prefix=prefix,
                    shared_buffers=shared_buffers)
    assert not [g for g in client.list_groups() if g.name.startswith(prefix)]
    a, b = torch.nn.Parameter(torch.randn(4, 6)), torch.nn.Parameter(torch.randn(4, 6))
    opt = RemoteAdamW([a, b], target=daemon.target, name_prefix=prefix, delete_on_close=True,
                      shared_buffers=shared_buffers)
    _grads([a, b], 1)
    opt.step()
    for edit, refusal in ((lambda: setattr(b, "data", torch.randn(1, 6).expand(4, 6)),
                           r"'.*param\.1'.*\.expand\(\)ed"),
                          (lambda: setattr(b, "data", a.data), "share memory")):
        before = [p.detach().clone() for p in (a, b)]
        edit()
        _grads([a, b], 2)
        with pytest.raises(ValueError, match=refusal):
            opt.step()
        assert torch.equal(a, before[0])
        assert {client.describe(prefix + n).max_step for n in ("param.0", "param.1")} == {1}
        b.data = before[1].clone()
    # Given memory of its own again, it steps from those values, as torch's AdamW would.
    ref_params, ref = _torch_reference([a, b])
    ref.load_state_dict(opt.state_dict())
    _step_both(opt, [a, b], ref, ref_params, 2)
    opt.close()


def test_a_gradient_changed_after_opt_clip_grad_norm_refuses_the_step(daemon, prefix):
    params = _params(2)
    opt = RemoteAdamW(params, target=daemon.target, name_prefix=prefix, delete_on_close=True)
    ref_params, ref = _torch_reference(params)
    _grads(params, 1)
    _grads(ref_params, 1)
    for p in params + ref_params:
        p.grad.mul_(80.0)
    before = [p.detach().clone() for p in params]
    opt.clip_grad_norm_(1.0)
    torch.nn.utils.clip_grad_norm_(params, 1.0)  # a framework's own clip, after ours
    with pytest.raises(optstate.InvalidArgument, match="changed in place after"):
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(params, before))
    assert opt.client.describe(prefix + "param.0").max_step == 0
    # Measured again after the last change: torch's clip then step, bit for bit.
    opt.clip_grad_norm_(1.0)
    opt.step()
    torch.nn.utils.clip_grad_norm_(ref_params, 1.0)
    ref.step()
    assert all(torch.equal(p, q) for p, q in zip(params, ref_params))
    opt.close()


def test_a_compiled_function_that_steps_runs_the_step_as_it_is(daemon, prefix):
    params = _params(2)
    opt = RemoteAdamW(params, target=daemon.target, name_prefix=prefix, delete_on_close=True)
    ref_params, ref = _torch_reference(params)

    @torch.compile(backend="eager")
    def step(optimizer):
        optimizer.step()

    for n in (1, 2):
        _grads(params, n)
        _grads(ref_params, n)
        step(opt)
        ref.step()
    assert all(torch.equal(p, q) for p, q in zip(params, ref_params))
    opt.close()


def test_parameter_names_torch_takes_are_escaped_and_an_odd_prefix_is_refused(daemon, client,
                                                                             prefix):
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleDict({"block one": torch.nn.Linear(4, 4)})
    setattr(model, "γ", torch.nn.Parameter(torch.randn(4)))
    opt = RemoteAdamW(model.named_parameters(), target=daemon.target, name_prefix=prefix,
                      delete_on_close=True)
    assert {g.name[len(prefix):] for g in client.list_groups() if g.name.startswith(prefix)} \
        == {"%CE%B3", "layers.block%20one.weight", "layers.block%20one.bias"}
    params = list(model.parameters())
    ref_params, ref = _torch_reference(params)
    _step_both(opt, params, ref, ref_params, 1)
    opt.close()
    for odd in ("job é/", "job one/"):
        with pytest.raises(ValueError, match="printable ASCII without spaces"):
            RemoteAdamW(_params(1), target=daemon.target, name_prefix=odd)


def test_eps_zero_is_refused_and_a_sparse_gradient_is_torchs_runtime_error(daemon, prefix):
    with pytest.raises(ValueError, match="Invalid epsilon value: 0.0"):
        RemoteAdamW(_params(1), eps=0.0, target=daemon.target, name_prefix=prefix)
    params = _params(1)
    opt = RemoteAdamW(params, target=daemon.target, name_prefix=prefix, delete_on_close=True)
    params[0].grad = torch.zeros(8).to_sparse()
    with pytest.raises(RuntimeError, match="sparse gradients are not supported"):
        opt.step()
    opt.close()


@pytest.mark.parametrize("shared_buffers", [False, True])
def test_gradients_moved_between_parameters_step_as_torchs(daemon, prefix, shared_buffers):
    # With shared_buffers each .grad is made a view of its parameter's slot; a trainer that
    # then hands one parameter's gradient tensor to another (p1.grad = p0.grad, swapped
    # gradients) had that slot overwritten by step()'s copy of the other gradient before
    # it was read: p1 stepped with p0's new gradient.
    gen = torch.Generator().manual_seed(31)
    values = [torch.randn(300, generator=gen) for _ in range(3)]
    ours = [torch.nn.Parameter(v.clone()) for v in values]
    theirs = [torch.nn.Parameter(v.clone()) for v in values]
    opt = RemoteAdamW(ours, lr=1e-2, target=daemon.target, name_prefix=prefix,
                      shared_buffers=shared_buffers, delete_on_close=True)
    reference = torch.optim.AdamW(theirs, lr=1e-2, foreach=False)

    def check(label):
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert torch.equal(opt.state[a]["exp_avg"], reference.state[b]["exp_avg"]), \
                f"{label}: exp_avg {i}"
            assert torch.allclose(a.detach(), b.detach(), rtol=0, atol=1e-6), f"{label}: {i}"

    for params in (ours, theirs):
        for i, p in enumerate(params):
            p.grad = torch.full((300,), 0.5 * (i + 1))
    opt.step()
    reference.step()
    check("step 1")
    # p1 takes p0's gradient tensor (its slot, with shared buffers); p0 gets a new one.
    for params in (ours, theirs):
        old = params[0].grad
        old.fill_(0.25)
        params[0].grad = torch.full((300,), -3.0)
        params[1].grad = old
    opt.step()
    reference.step()
    check("step 2, a gradient handed on")
    # Every gradient moved one parameter on.
    for params in (ours, theirs):
        grads = [p.grad for p in params]
        for i, p in enumerate(params):
            p.grad = grads[i - 1]
    opt.step()
    reference.step()
    check("step 3, gradients rotated")


def test_a_forked_child_cannot_step_the_parents_optimizer(daemon, prefix):
    # The child's step() went through the parent's gRPC connection and stepped the parent's
    # groups, and the parent's next step() then waited for attempt_timeout (300 s).
    p = torch.nn.Parameter(torch.ones(16))
    opt = RemoteAdamW([p], lr=1e-2, target=daemon.target, name_prefix=prefix,
                      delete_on_close=True, attempt_timeout=30)
    p.grad = torch.ones(16)
    opt.step()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            opt.step()
            message = b"stepped"
        except RuntimeError as e:
            message = str(e).encode()
        opt.close()  # a child's close() leaves the parent's groups alone
        os.write(write, message)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode()
    assert os.waitpid(child, 0)[1] == 0
    assert "is a fork of it" in message and "Make the optimizer in the child" in message, message
    started = time.monotonic()
    opt.step()
    assert time.monotonic() - started < 10
    assert [g.max_step for g in opt.client.list_groups() if g.name.startswith(prefix)] == [2]
    opt.close()


def test_betas_of_other_than_two_values_are_refused_at_construction(daemon, prefix):
    # torch takes them and fails at its first step; the daemon stepped with the first two.
    p = torch.nn.Parameter(torch.ones(4))
    with pytest.raises(ValueError, match=r"betas must be a pair \(beta1, beta2\), got 3"):
        RemoteAdamW([p], lr=1e-2, betas=(0.9, 0.999, 0.5), target=daemon.target,
                    name_prefix=prefix)
