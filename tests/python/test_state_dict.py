"""RemoteAdamW's state_dict in torch.optim.AdamW's layout, moving both ways: the state
(m, v, step) crosses bit for bit, and training continues as if it had not switched.

Gradients are a fixed random sequence (independent of the params), so m and v of every
run must equal torch-alone's bit for bit. The params of a run that switched are held bit
for bit against the same switch made by the references: `ieee_adamw_` (the daemon's
arithmetic) for the daemon's steps and torch.optim.AdamW for torch's."""
import copy
import re

import pytest
import torch

from optstate.torch import MASTER_PARAM, RemoteAdamW
from reference import bits_equal, ieee_adamw_, ulp_distance

SHAPES = {"w1": (40, 30), "b1": (40,), "w2": (7, 40), "frozen": (5,)}


def _model(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.nn.Parameter(torch.randn(s, generator=gen)) for n, s in SHAPES.items()}


def _groups(model, named):
    def pick(*names):
        return [(n, model[n]) if named else model[n] for n in names]
    return [{"params": pick("w1", "b1", "frozen"), "lr": 2e-2, "weight_decay": 0.05,
             "betas": (0.8, 0.99)},
            {"params": pick("w2"), "lr": 5e-3, "weight_decay": 0.0, "eps": 1e-6}]


def _grads(step):
    gen = torch.Generator().manual_seed(500 + step)
    return {n: torch.randn(s, generator=gen) for n, s in SHAPES.items() if n != "frozen"}


def _set_grads(model, step):
    for n, g in _grads(step).items():
        model[n].grad = g.clone()


def _torch_run(model, steps, start=1, opt=None):
    opt = opt or torch.optim.AdamW(_groups(model, named=False))
    for step in range(start, start + steps):
        _set_grads(model, step)
        opt.step()
    return opt


def _ieee_run(model, state, steps, start=1):
    """ieee_adamw_ over the same groups; `state` maps name -> [m, v]."""
    for step in range(start, start + steps):
        for group in _groups(model, named=True):
            lr, wd = group["lr"], group["weight_decay"]
            betas, eps = group.get("betas", (0.9, 0.999)), group.get("eps", 1e-8)
            for n, p in group["params"]:
                if n == "frozen":
                    continue
                m, v = state.setdefault(n, [torch.zeros(p.shape), torch.zeros(p.shape)])
                ieee_adamw_(p.data, _grads(step)[n], m, v, step, lr, betas, eps, wd)


def _by_name(opt_state_dict, model):
    names = [n for g in _groups(model, named=True) for n, _ in g["params"]]
    return {names[i]: s for i, s in opt_state_dict["state"].items()}


def test_remote_to_torch_continues_as_torch_alone(daemon, prefix):
    alone = _model()
    alone_opt = _torch_run(alone, 20)
    alone_20 = copy.deepcopy(_by_name(alone_opt.state_dict(), alone))
    _torch_run(alone, 20, start=21, opt=alone_opt)

    remote = _model()
    opt = RemoteAdamW(_groups(remote, named=True), target=daemon.target, name_prefix=prefix)
    for step in range(1, 21):
        _set_grads(remote, step)
        opt.step()
    ieee = _model()
    ieee_state = {}
    _ieee_run(ieee, ieee_state, 20)
    for n in SHAPES:
        assert bits_equal(remote[n].detach(), ieee[n].detach()), n
    saved = opt.state_dict()
    assert sorted(_by_name(saved, remote)) == ["b1", "w1", "w2"]  # frozen: never stepped
    for n, s in _by_name(saved, remote).items():
        assert s["step"].item() == 20.0
        assert bits_equal(s["exp_avg"], alone_20[n]["exp_avg"]), n
        assert bits_equal(s["exp_avg_sq"], alone_20[n]["exp_avg_sq"]), n

    # torch.optim.AdamW takes the state dict and continues.
    switched = {n: torch.nn.Parameter(p.detach().clone()) for n, p in remote.items()}
    torch_opt = torch.optim.AdamW(_groups(switched, named=False))
    torch_opt.load_state_dict(copy.deepcopy(saved))  # torch shares the step tensors it loads
    _torch_run(switched, 20, start=21, opt=torch_opt)
    # The same switch made by the references: ieee's 20 steps, then torch's own 20.
    ref_opt = torch.optim.AdamW(_groups(ieee, named=False))
    ref_opt.load_state_dict(copy.deepcopy(saved))
    _torch_run(ieee, 20, start=21, opt=ref_opt)
    final = _by_name(torch_opt.state_dict(), switched)
    expected = _by_name(alone_opt.state_dict(), alone)
    for n in ("w1", "b1", "w2"):
        assert final[n]["step"].item() == 40.0
        assert bits_equal(final[n]["exp_avg"], expected[n]["exp_avg"]), n
        assert bits_equal(final[n]["exp_avg_sq"], expected[n]["exp_avg_sq"]), n
        assert bits_equal(switched[n].detach(), ieee[n].detach()), n
        d = ulp_distance(switched[n], alone[n])
        print(f"{n}: {float((d == 0).double().mean()):.4%} bit-equal to torch alone "
              f"(max {int(d.max())} ulp, from torch's sqrt in the first 20 steps)")
    assert bits_equal(switched["frozen"].detach(), alone["frozen"].detach())


def test_torch_to_remote_continues_as_torch_alone(daemon, client, prefix):
    alone = _model()
    alone_opt = _torch_run(alone, 40)

    start = _model()
    start_opt = _torch_run(start, 20)
    saved = start_opt.state_dict()
    remote = {n: torch.nn.Parameter(p.detach().clone()) for n, p in start.items()}
    opt = RemoteAdamW(_groups(remote, named=True), target=daemon.target, name_prefix=prefix,
                      lr=0.123)  # the state dict's param groups replace these hyperparameters
    opt.load_state_dict(copy.deepcopy(saved))
    assert [g["lr"] for g in opt.param_groups] == [2e-2, 5e-3]
    assert client.describe(prefix + "w1").min_step == 20
    for step in range(21, 41):
        _set_grads(remote, step)
        opt.step()
    # The reference switch: torch's 20 steps (start), then ieee's 20.
    ieee_state = {n: [s["exp_avg"].clone(), s["exp_avg_sq"].clone()]
                  for n, s in _by_name(saved, start).items()}
    _ieee_run(start, ieee_state, 20, start=21)
    final = _by_name(opt.state_dict(), remote)
    expected = _by_name(alone_opt.state_dict(), alone)
    assert sorted(final) == ["b1", "w1", "w2"]
    for n in ("w1", "b1", "w2"):
        assert final[n]["step"].item() == 40.0
        assert bits_equal(final[n]["exp_avg"], expected[n]["exp_avg"]), n
        assert bits_equal(final[n]["exp_avg_sq"], expected[n]["exp_avg_sq"]), n
        assert bits_equal(remote[n].detach(), start[n].detach()), n
    assert bits_equal(remote["frozen"].detach(), alone["frozen"].detach())


def test_loading_an_earlier_state_rewinds_the_daemon_group(daemon, prefix):
    model = _model()
    opt = RemoteAdamW(_groups(model, named=True), target=daemon.target, name_prefix=prefix)
    for step in range(1, 6):
        _set_grads(model, step)
        opt.step()
    saved = opt.state_dict()
    params_5 = {n: p.detach().clone() for n, p in model.items()}
    for step in range(6, 11):
        _set_grads(model, step)
        opt.step()
    after_10 = {n: p.detach().clone() for n, p in model.items()}
    state_10 = _by_name(opt.state_dict(), model)
    with torch.no_grad():
        for n, p in model.items():
            p.copy_(params_5[n])
    opt.load_state_dict(saved)  # same size and hyperparameters: replaced in place
    assert opt.client.describe(prefix + "w1").min_step == 5
    for step in range(6, 11):
        _set_grads(model, step)
        opt.step()
    again = _by_name(opt.state_dict(), model)
    for n in SHAPES:
        assert bits_equal(model[n].detach(), after_10[n]), n
    for n in ("w1", "b1", "w2"):
        assert again[n]["step"].item() == 10.0
        assert bits_equal(again[n]["exp_avg"], state_10[n]["exp_avg"])
        assert bits_equal(again[n]["exp_avg_sq"], state_10[n]["exp_avg_sq"])


def test_a_refused_state_dict_changes_nothing(daemon, client, prefix):
    # Each of these state dicts is refused. Before, the entries ahead of the bad one were
    # already imported (or, without state, registered afresh) and the param groups'
    # hyperparameters already set, so the next step trained on a half-loaded job.
    model, reference, moments = _model(), _model(), {}
    opt = RemoteAdamW(_groups(model, named=True), target=daemon.target, name_prefix=prefix)
    for step in range(1, 6):
        _set_grads(model, step)
        opt.step()
    saved = opt.state_dict()
    for step in range(6, 8):
        _set_grads(model, step)
        opt.step()
    _ieee_run(reference, moments, 7)
    before = _daemon_state(client, prefix, {n: model[n] for n in ("w1", "b1", "w2")})
    lrs = [g["lr"] for g in opt.param_groups]

    def spoiled(change):
        bad = copy.deepcopy(saved)
        for g in bad["param_groups"]:
            g["lr"] = 0.5
        change(bad["state"])
        return bad

    last = max(saved["state"])  # w2's index
    wrong_size = spoiled(lambda st: st[last].update(exp_avg=torch.zeros(3)))
    fresh_and_wrong = spoiled(lambda st: (st.pop(0), st[last].update(exp_avg=torch.zeros(3))))
    bad_step = spoiled(lambda st: st[last].update(step=torch.tensor(-1.0)))
    half_step = spoiled(lambda st: st[last].update(step=torch.tensor(2.5)))
    no_moment = spoiled(lambda st: st[last].pop("exp_avg_sq"))

    def poisoned(key, value):
        def change(st):
            st[last][key] = st[last][key].clone()
            st[last][key].view(-1)[0] = value
        return change

    # Refused by the daemon at w2's turn, after w1 and b1 had been imported.
    # (A NaN in exp_avg is no refusal: a diverged run leaves one, and torch loads it.)
    negative_square = spoiled(poisoned("exp_avg_sq", -1.0))
    for bad, says in ((negative_square, "the loaded exp_avg_sq holds a negative value"),
                      (wrong_size, "exp_avg/exp_avg_sq have 3/"),
                      (fresh_and_wrong, "exp_avg/exp_avg_sq have 3/"),
                      (bad_step, "the loaded step is -1.0"),
                      (half_step, "the loaded step is 2.5"),
                      (no_moment, "its state has no 'exp_avg_sq'")):
        with pytest.raises(ValueError, match=re.escape(says)):
            opt.load_state_dict(bad)
        assert [g["lr"] for g in opt.param_groups] == lrs
        now = _daemon_state(client, prefix, {n: model[n] for n in ("w1", "b1", "w2")})
        for n, (params, m, v, steps) in before.items():
            assert steps == now[n][3] == [7], (says, n)
            for a, b in zip((params, m, v), now[n][:3]):
                assert bits_equal(a, b), (says, n)
    _set_grads(model, 8)
    opt.step()
    _ieee_run(reference, moments, 1, start=8)
    for n in SHAPES:
        assert bits_equal(model[n].detach(), reference[n].detach()), n


def _sixteen_bit_model(dtype, seed=3):
    gen = torch.Generator().manual_seed(seed)
    return {"w": torch.nn.Parameter(torch.randn(300, 40, generator=gen).to(dtype)),
            "b": torch.nn.Parameter(torch.randn(300, generator=gen).to(dtype))}


def _sixteen_bit_grads(model, step):
    gen = torch.Generator().manual_seed(900 + step)
    for p in model.values():
        p.grad = (torch.randn(p.shape, generator=gen) * 0.1).to(p.dtype)


def _daemon_state(client, prefix, model):
    """name -> (master params, exp_avg, exp_avg_sq, page steps) as the daemon holds them."""
    out = {}
    for n, p in model.items():
        s = client.export_state(prefix + n)
        out[n] = (torch.from_numpy(s.params.copy()), torch.from_numpy(s.exp_avg.copy()),
                  torch.from_numpy(s.exp_avg_sq.copy()), sorted(set(s.page_steps)))
    return out


@pytest.mark.parametrize("dtype, wire", [(torch.bfloat16, torch.float32),
                                         (torch.float16, torch.float32),
                                         (torch.float32, torch.bfloat16)],
                         ids=["bfloat16 params", "float16 params", "float32 params, bf16 wire"])
def test_16_bit_values_resume_on_a_fresh_daemon_bit_for_bit(fresh_daemons, prefix, dtype, wire):
    """10 steps, state_dict(), a new daemon and a new RemoteAdamW, load_state_dict(), 10 more
    steps: the params and the daemon's fp32 master weights, m and v equal 20 steps without
    the interruption, bit for bit. The master weights travel in the state dict's
    master_param entry; without it (as from torch.optim.AdamW) the resumed master starts
    from the 16-bit values and the runs part."""
    kwargs = dict(name_prefix=prefix, lr=1e-2, wire_dtype=wire)
    alone = _sixteen_bit_model(dtype)
    daemon = fresh_daemons()
    alone_opt = RemoteAdamW(list(alone.items()), target=daemon.target, **kwargs)
    for step in range(1, 21):
        _sixteen_bit_grads(alone, step)
        alone_opt.step()
    expected = _daemon_state(alone_opt.client, prefix, alone)

    first = fresh_daemons()
    model = _sixteen_bit_model(dtype)
    opt = RemoteAdamW(list(model.items()), target=first.target, **kwargs)
    for step in range(1, 11):
        _sixteen_bit_grads(model, step)
        opt.step()
    saved = copy.deepcopy(opt.state_dict())
    at_10 = _daemon_state(opt.client, prefix, model)
    for i, n in enumerate(model):
        entry = saved["state"][i]
        assert sorted(entry) == ["exp_avg", "exp_avg_sq", MASTER_PARAM, "step"]
        assert entry[MASTER_PARAM].dtype == torch.float32
        assert entry[MASTER_PARAM].shape == model[n].shape
        assert bits_equal(entry[MASTER_PARAM].reshape(-1), at_10[n][0]), n
        # the master holds more than the values the model got
        assert not bits_equal(entry[MASTER_PARAM], model[n].detach().float()), n
    del opt
    assert first.stop() == 0

    def resume(state_dict):
        second = fresh_daemons()
        resumed = {n: torch.nn.Parameter(p.detach().clone()) for n, p in model.items()}
        ropt = RemoteAdamW(list(resumed.items()), target=second.target, **kwargs)
        ropt.load_state_dict(copy.deepcopy(state_dict))
        assert [ropt.state[p]["step"].item() for p in resumed.values()] == [10.0, 10.0]
        for step in range(11, 21):
            _sixteen_bit_grads(resumed, step)
            ropt.step()
        return resumed, _daemon_state(ropt.client, prefix, resumed)

    resumed, state = resume(saved)
    for n in model:
        assert resumed[n].dtype == dtype and bits_equal(resumed[n].detach(), alone[n].detach()), n
        for what, got, want in zip(("master", "exp_avg", "exp_avg_sq", "steps"), state[n],
                                   expected[n]):
            if what == "steps":
                assert got == want == [20], n
            else:
                assert bits_equal(got, want), f"{n} {what}"

    # The same state dict without master_param: the daemon's master restarts from the
    # 16-bit values, and 10 steps later differs from the uninterrupted one.
    stripped = copy.deepcopy(saved)
    for entry in stripped["state"].values():
        del entry[MASTER_PARAM]
    _, state = resume(stripped)
    assert not bits_equal(state["w"][0], expected["w"][0])
    assert bits_equal(state["w"][1], expected["w"][1])  # m depends on the gradients only


def test_a_stale_master_param_is_not_imported(daemon, client, prefix):
    """RemoteAdamW (bf16) -> torch.optim.AdamW, which keeps master_param cast to bf16 and
    steps the bf16 values -> RemoteAdamW again: the old master no longer belongs to the
    values, so the daemon's master becomes the values widened. The same for a float32
    master_param whose 16-bit rounding is not the parameter's values."""
    model = _sixteen_bit_model(torch.bfloat16)
    opt = RemoteAdamW(list(model.items()), target=daemon.target, name_prefix=prefix, lr=1e-2)
    for step in range(1, 4):
        _sixteen_bit_grads(model, step)
        opt.step()
    saved = copy.deepcopy(opt.state_dict())
    torch_opt = torch.optim.AdamW(list(model.values()), lr=1e-2)
    torch_opt.load_state_dict(copy.deepcopy(saved))
    _sixteen_bit_grads(model, 4)
    torch_opt.step()
    from_torch = torch_opt.state_dict()
    assert from_torch["state"][0][MASTER_PARAM].dtype == torch.bfloat16  # torch cast it
    opt.load_state_dict(from_torch)
    for n, p in model.items():
        master = torch.from_numpy(client.export_state(prefix + n).params)
        assert bits_equal(master, p.detach().reshape(-1).float()), n
    # a float32 master that is not the values' master (the values moved on)
    stale = copy.deepcopy(saved)
    opt.load_state_dict(stale)
    for n, p in model.items():
        master = torch.from_numpy(client.export_state(prefix + n).params)
        assert bits_equal(master, p.detach().reshape(-1).float()), n
    # and the valid one is imported as it is
    with torch.no_grad():
        for i, p in enumerate(model.values()):
            p.copy_(saved["state"][i][MASTER_PARAM].to(torch.bfloat16))
    opt.load_state_dict(copy.deepcopy(saved))
    for i, n in enumerate(model):
        master = torch.from_numpy(client.export_state(prefix + n).params)
        assert bits_equal(master, saved["state"][i][MASTER_PARAM].reshape(-1)), n


def test_state_tensors_own_their_memory_and_one_held_at_exit_is_no_leak(daemon, prefix):
    # opt.state[p]'s tensors (and export_state's arrays) own their memory: they outlive the
    # optimizer and the exported state, and one still held when the interpreter exits is
    # freed with it, not reported by nanobind as a leaked GroupState.
    import subprocess
    import sys
    script = f"""
import gc, torch
from optstate.torch import RemoteAdamW
w = torch.nn.Parameter(torch.ones(8))
opt = RemoteAdamW([w], target={daemon.target!r}, name_prefix={prefix!r})
w.grad = torch.full((8,), 0.5)
opt.step()
m = opt.state[w]["exp_avg"]
opt.close()
del opt
gc.collect()
assert torch.equal(m, torch.full((8,), 0.05)), m
print("done")
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "done", run.stderr
    assert "leaked" not in run.stderr, run.stderr


def test_an_amsgrad_state_dict_is_adopted_as_torch_adopts_it(daemon, prefix):
    # Loaded into an optimizer made without amsgrad, it was accepted and set amsgrad=True
    # in param_groups, and every step after was refused ("amsgrad cannot change").
    def amsgrad_groups(model, named):
        groups = _groups(model, named)
        for g in groups:
            g["amsgrad"] = True
        return groups

    alone = _model()
    alone_opt = torch.optim.AdamW(amsgrad_groups(alone, named=False))
    _torch_run(alone, 3, opt=alone_opt)
    saved = copy.deepcopy(alone_opt.state_dict())
    _torch_run(alone, 3, start=4, opt=alone_opt)

    remote = _model()
    _torch_run(remote, 3, opt=torch.optim.AdamW(amsgrad_groups(remote, named=False)))
    opt = RemoteAdamW(_groups(remote, named=True), target=daemon.target, name_prefix=prefix)
    opt.load_state_dict(saved)
    assert all(g["amsgrad"] for g in opt.param_groups)
    for step in range(4, 7):
        _set_grads(remote, step)
        opt.step()
    got, expected = _by_name(opt.state_dict(), remote), _by_name(alone_opt.state_dict(), alone)
    for n in ("w1", "b1", "w2"):
        assert float(got[n]["step"]) == float(expected[n]["step"]) == 6
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            assert bits_equal(got[n][key], expected[n][key]), (n, key)


def test_a_diverged_runs_state_dict_loads_as_torchs_does(daemon, prefix):
    # Finite gradients at float32's edge, torch's defaults: 3.4e38 then -3.4e38 leave
    # exp_avg_sq +inf, exp_avg -inf and the params NaN, in torch's AdamW as on the daemon.
    # torch's load_state_dict takes that state; RemoteAdamW refused it ("not finite"),
    # though the daemon's ImportState takes it. Loaded, it is the saved state bit for bit.
    def diverged(make_opt):
        p = torch.nn.Parameter(torch.ones(256))
        opt = make_opt([p])
        for value in (3.4e38, -3.4e38):
            p.grad = torch.full((256,), value)
            opt.step()
        return p, opt

    ref_p, ref = diverged(lambda ps: torch.optim.AdamW(ps, fused=True))
    p, opt = diverged(lambda ps: RemoteAdamW(ps, target=daemon.target,
                                             name_prefix=prefix + "a/"))
    saved = opt.state_dict()
    for key in ("exp_avg", "exp_avg_sq"):
        assert bits_equal(saved["state"][0][key], ref.state_dict()["state"][0][key]), key
    assert bits_equal(p.detach(), ref_p.detach())
    assert torch.isnan(p.detach()).all() and torch.isinf(saved["state"][0]["exp_avg"]).all()
    # A fresh model's values (a NaN one could not be registered), the saved moments.
    q = torch.nn.Parameter(torch.ones(256))
    loaded = RemoteAdamW([q], target=daemon.target, name_prefix=prefix + "b/")
    loaded.load_state_dict(copy.deepcopy(saved))
    again = loaded.state_dict()
    for key in ("exp_avg", "exp_avg_sq"):
        assert bits_equal(again["state"][0][key], saved["state"][0][key]), key
    assert float(again["state"][0]["step"]) == float(saved["state"][0]["step"]) == 2.0
    opt.close()
    loaded.close()
