"""Every hyperparameter per step, as torch reads them from param_groups at each step, and
amsgrad: RemoteAdamW against torch.optim.AdamW(fused=True) (whose CPU kernel, like the daemon's,
takes a correctly rounded sqrt) and against the default single-tensor step, chained over
the whole run from the same initial values and the same data, under schedules of betas
(OneCycleLR's momentum cycling), of weight decay, of eps, and with maximize.

The parameters' sizes are multiples of 64 so that torch's fused kernel has no scalar tail
(its tail rounds one operation differently from its vector body; docs/exactness.md):
there every value is compared bit for bit, p, exp_avg and exp_avg_sq, at every step."""
import pytest
import torch
from torch import nn

from optstate.torch import RemoteAdamW
from reference import bits_equal, compare_to_torch_step


class Net(nn.Module):
    """Parameters of 64 x 16, 64, 16 x 64 and 16 elements... all multiples of 16."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 16)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def _loss(model, step):
    gen = torch.Generator().manual_seed(500 + step)
    x, y = torch.randn(32, 16, generator=gen), torch.randn(32, 16, generator=gen)
    return nn.functional.mse_loss(model(x), y)


def _train_side_by_side(make_schedules, steps, prefix, target, fused=True, shared_buffers=False,
                        **kwargs):
    """Trains two equal Nets, one with RemoteAdamW (its parameters and gradients in buffers
    shared with the daemon when `shared_buffers`), one with torch.optim.AdamW(**kwargs,
    fused=fused), each on its own gradients; `make_schedules(opt)` gives the schedulers
    (or a callable(opt, step) changing param_groups) applied after each step. Asserts the
    params, exp_avg and exp_avg_sq bit-equal at every step (fused) and returns the pair."""
    remote_model, torch_model = Net(), Net()
    opt = RemoteAdamW(remote_model.named_parameters(), target=target, name_prefix=prefix,
                      shared_buffers=shared_buffers, **kwargs)
    ref = torch.optim.AdamW(torch_model.parameters(), fused=fused, **kwargs)
    remote_sched, ref_sched = make_schedules(opt), make_schedules(ref)
    for step in range(1, steps + 1):
        for model, o in ((remote_model, opt), (torch_model, ref)):
            o.zero_grad()
            _loss(model, step).backward()
            o.step()
        for sched in (remote_sched, ref_sched):
            sched.step() if hasattr(sched, "step") else sched(step)
        assert opt.param_groups[0]["betas"] == ref.param_groups[0]["betas"]
        assert opt.param_groups[0]["lr"] == ref.param_groups[0]["lr"]
        for (name, p), q in zip(remote_model.named_parameters(), torch_model.parameters()):
            assert bits_equal(p.detach(), q.detach()), f"{name} at step {step}"
        if step % 50 == 0 or step == steps:
            for p, q in zip(remote_model.parameters(), torch_model.parameters()):
                state, want = opt.state[p], ref.state[q]
                assert set(state) == set(want), (set(state), set(want))
                for key in set(want) - {"step"}:  # exp_avg, exp_avg_sq, max_exp_avg_sq
                    assert bits_equal(state[key], want[key]), (key, step)
    print(f"{steps} steps bit-identical to torch.optim.AdamW(fused={fused}, {kwargs})")
    return opt, ref


@pytest.mark.parametrize("shared_buffers", [False, True])
def test_onecyclelr_with_momentum_cycling_is_bit_identical_to_torch_fused_for_200_steps(
        daemon, prefix, shared_buffers):
    # With shared buffers every step after the first is a use of the client's step plan,
    # the lr and beta1 of each step sent once for all parameters (StepRequest.plan).
    def schedules(o):
        return torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.02, total_steps=201)
    opt, ref = _train_side_by_side(schedules, 200, prefix, daemon.target,
                                   shared_buffers=shared_buffers)
    if shared_buffers:
        regions = opt.client.stats()["regions"]
        assert regions["step_plans"] >= 1 and regions["step_plan_uses"] >= 199, regions
    # The momentum did cycle (betas changed every step), and the daemon's registration kept
    # the betas it was registered with: each step sent its own.
    assert opt.param_groups[0]["betas"][0] != 0.9
    assert opt.client.describe(prefix + "fc1.weight").betas == (0.9, 0.999)
    opt.close()


@pytest.mark.parametrize("shared_buffers", [False, True])
def test_a_schedule_of_weight_decay_eps_and_beta2_is_bit_identical_to_torch_fused(
        daemon, prefix, shared_buffers):
    def schedules(o):
        def change(step):
            for g in o.param_groups:
                g["weight_decay"] = 0.1 * (0.9 ** step)
                g["eps"] = 1e-8 * (1 + step % 3)
                g["betas"] = (g["betas"][0], 0.999 - 0.0005 * (step % 4))
        return change
    opt, _ = _train_side_by_side(schedules, 60, prefix, daemon.target, lr=3e-3,
                                 shared_buffers=shared_buffers)
    opt.close()


def test_maximize_set_at_construction_and_changed_later_is_bit_identical_to_torch_fused(
        daemon, prefix):
    def schedules(o):
        def change(step):
            if step == 20:
                for g in o.param_groups:
                    g["maximize"] = False  # as torch, read at the next step
        return change
    opt, _ = _train_side_by_side(schedules, 40, prefix, daemon.target, maximize=True,
                                 weight_decay=0.1)
    opt.close()


def test_maximize_matches_torchs_default_single_tensor_step(daemon, prefix):
    """Against torch's default step (MKL's sqrt there): m and v bit for bit, p as
    compare_to_torch_step allows, one step at a time from the daemon's params."""
    remote_model, torch_model = Net(), Net()
    opt = RemoteAdamW(remote_model.named_parameters(), target=daemon.target, name_prefix=prefix,
                      maximize=True, weight_decay=0.1)
    ref = torch.optim.AdamW(torch_model.parameters(), maximize=True, weight_decay=0.1)
    for step in range(1, 21):
        with torch.no_grad():
            for p, q in zip(remote_model.parameters(), torch_model.parameters()):
                q.copy_(p)
        before = [p.detach().clone() for p in remote_model.parameters()]
        for model, o in ((remote_model, opt), (torch_model, ref)):
            o.zero_grad()
            _loss(model, step).backward()
            o.step()
        for b, p, q in zip(before, remote_model.parameters(), torch_model.parameters()):
            state, want = opt.state[p], ref.state[q]
            assert bits_equal(state["exp_avg"], want["exp_avg"])
            assert bits_equal(state["exp_avg_sq"], want["exp_avg_sq"])
            compare_to_torch_step(f"step {step}", p.detach(), q.detach(), b,
                                  want["exp_avg_sq"], quiet=True)
    opt.close()


@pytest.mark.parametrize("option", ["betas", "maximize"])
def test_a_bad_hyperparameter_set_between_steps_is_refused_and_applies_nothing(daemon, prefix,
                                                                              option):
    model = Net()
    opt = RemoteAdamW(model.named_parameters(), target=daemon.target, name_prefix=prefix)
    _loss(model, 1).backward()
    opt.step()
    before = [p.detach().clone() for p in model.parameters()]
    opt.param_groups[0]["betas"] = (0.9, 1.0) if option == "betas" else (0.9, 0.999)
    opt.param_groups[0]["amsgrad"] = option == "maximize"  # amsgrad may not change
    with pytest.raises(Exception, match="beta2 must be in" if option == "betas" else "amsgrad"):
        opt.step()
    assert all(bits_equal(b, p.detach()) for b, p in zip(before, model.parameters()))
    assert opt.client.describe(prefix + "fc1.weight").min_step == 1
    opt.close()


def test_amsgrad_with_onecyclelr_is_bit_identical_to_torch_fused_for_200_steps(daemon, prefix):
    def schedules(o):
        return torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.02, total_steps=201)
    opt, ref = _train_side_by_side(schedules, 200, prefix, daemon.target, amsgrad=True,
                                   weight_decay=0.1)
    p = next(iter(opt.param_groups[0]["params"]))
    state = opt.state[p]
    # The maximum did hold: somewhere max_exp_avg_sq is above exp_avg_sq.
    assert bool((state["max_exp_avg_sq"] > state["exp_avg_sq"]).any())
    opt.close()


def test_amsgrad_state_moves_both_ways_between_torch_and_remote(daemon, prefix):
    """torch.optim.AdamW(amsgrad=True)'s state_dict loads into RemoteAdamW and steps on as
    torch does, and RemoteAdamW's loads back into torch's, max_exp_avg_sq included."""
    remote_model, torch_model = Net(), Net()
    ref = torch.optim.AdamW(torch_model.parameters(), amsgrad=True, fused=True)
    for step in range(1, 6):
        ref.zero_grad()
        _loss(torch_model, step).backward()
        ref.step()
    remote_model.load_state_dict(torch_model.state_dict())
    opt = RemoteAdamW(remote_model.named_parameters(), target=daemon.target, name_prefix=prefix,
                      amsgrad=True)
    opt.load_state_dict(ref.state_dict())
    for step in range(6, 11):
        for model, o in ((remote_model, opt), (torch_model, ref)):
            o.zero_grad()
            _loss(model, step).backward()
            o.step()
        for p, q in zip(remote_model.parameters(), torch_model.parameters()):
            assert bits_equal(p.detach(), q.detach()), step
    back_model = Net()
    back_model.load_state_dict(remote_model.state_dict())
    back = torch.optim.AdamW(back_model.parameters(), amsgrad=True, fused=True)
    back.load_state_dict(opt.state_dict())
    for p, q in zip(back_model.parameters(), torch_model.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            assert bits_equal(back.state[p][key], ref.state[q][key]), key
    # A state without max_exp_avg_sq cannot resume an amsgrad optimizer.
    sd = ref.state_dict()
    for entry in sd["state"].values():
        del entry["max_exp_avg_sq"]
    with pytest.raises(ValueError, match="max_exp_avg_sq"):
        opt.load_state_dict(sd)
    opt.close()
