"""A job's state is its own (docs/jobs.md): leases, resume modes, torn steps, names that
survive torch.compile and DDP, a daemon restart ridden out, connect timeouts.

Each test is a surprise a user met before jobs existed: the naive restart, two jobs on
one prefix, a trainer killed mid-step, renamed parameters, a restarted daemon. Every
"bit-identical" is torch.equal against a run that was never interrupted.
"""
import threading
import time
import warnings

import numpy as np
import pytest
import torch

import optstate
from optstate.torch import RemoteAdamW

from models import MLP


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g))
            for _ in range(n)]


def train(model, opt, data, sched=None):
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if sched is not None:
            sched.step()


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def die_part_way(model, opt, batch, step, prefix, reached):
    """A trainer killed part-way through `step`: its gradients of `batch`, of which only
    parameter `reached`'s reach the daemon (with the step's lr). Returns the gradients,
    by parameter name, for the trainer that finishes the step."""
    x, y = batch
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    opt.client.step([(prefix + reached, grads[reached])], step, lr=opt.param_groups[0]["lr"])
    return grads


def torn_at_step_three(fresh_daemons, prefix, reached):
    """A job trained to step 2 whose trainer died part-way through step 3 (only
    parameter `reached` got it), its lease expired since: the daemon, the uninterrupted
    run's params (4 steps), the batches (4) and step 3's gradients by parameter name."""
    d = fresh_daemons("--lease_seconds=1")
    expected = uninterrupted(d.target, "alone/", 4)
    data = batches(4)
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    train(model, opt, data[:2], sched)
    grads = die_part_way(model, opt, data[2], 3, prefix, reached)
    del opt, sched
    time.sleep(1.2)
    return d, expected, data, grads


def checkpoint_trained(opt, model, prefix, step):
    """A checkpoint of the groups `model` trains, once all are at `step` (the frozen ones
    stay at step 0: waiting for them would not end)."""
    opt.client.checkpoint(groups=[prefix + n for n, p in model.named_parameters()
                                  if p.requires_grad], wait_for_step=step)


def trained_then_restored(fresh_daemons, prefix, tmp_path, stepped):
    """A job trained to step `stepped` whose daemon (--state_dir `tmp_path`) was killed
    and restarted, on its port, from its checkpoint of step 2: the daemon, the model and
    its optimizer, the batches (5)."""
    d = fresh_daemons(f"--state_dir={tmp_path}", "--checkpoint_interval=0")
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                      reconnect_timeout=30)
    data = batches(5)
    train(model, opt, data[:2])
    checkpoint_trained(opt, model, prefix, 2)
    train(model, opt, data[2:stepped])
    d.process.kill()
    d.process.wait()
    fresh_daemons(f"--state_dir={tmp_path}", "--checkpoint_interval=0",
                  f"--listen=127.0.0.1:{d.port}")
    return d, model, opt, data


def fresh_model(seed):
    """The model a restarted trainer builds: its own initialisation, except for the frozen
    parameters (fc1.bias, norm.bias), which such a trainer loads from where they came from
    (pretrained weights): the optimizer never steps them, so the daemon has no newer values
    of them than registration gave."""
    model = MLP(seed=seed)
    original = MLP()
    with torch.no_grad():
        model.fc1.bias.copy_(original.fc1.bias)
        model.norm.bias.copy_(original.norm.bias)
    return model


def uninterrupted(target, prefix, steps, gamma=0.9):
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=target, name_prefix=prefix,
                      delete_on_close=True)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma)
    train(model, opt, batches(steps), sched)
    out = params(model)
    opt.close()
    return out


def test_a_name_prefix_is_required(daemon, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    with pytest.raises(ValueError, match="name_prefix"):
        RemoteAdamW(MLP().named_parameters(), target=daemon.target)
    # Plain torchrun (no --rdzv-id, no --standalone) sets the run id "none", which every
    # such run shares: still required, saying how torchrun gives one.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    with pytest.raises(ValueError, match="--rdzv-id=ID, or --standalone"):
        RemoteAdamW(MLP().named_parameters(), target=daemon.target)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-1234")
    with pytest.warns(UserWarning, match="run-1234/"):
        opt = RemoteAdamW(MLP().named_parameters(), target=daemon.target, delete_on_close=True)
    assert opt.client.describe("run-1234/fc1.weight").num_elements == 64 * 32
    opt.close()


def test_the_naive_restart_is_refused_and_changes_nothing(daemon, prefix):
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=daemon.target, name_prefix=prefix)
    train(model, opt, batches(3))
    before = {g.name: (g.min_step, g.max_step) for g in opt.client.list_groups()}
    # The same script started again: a fresh model, the same prefix.
    with pytest.raises(optstate.FailedPrecondition) as refused:
        RemoteAdamW(MLP().named_parameters(), 1e-2, target=daemon.target, name_prefix=prefix)
    message = str(refused.value)
    assert "already has state" in message and "step 3" in message
    for way in ("resume='daemon'", "resume='state_dict'", "name_prefix"):
        assert way in message
    assert {g.name: (g.min_step, g.max_step) for g in opt.client.list_groups()} == before
    for name in before:  # the holder deletes its own (another would wait for the lease)
        if name.startswith(prefix):
            opt.client.delete(name)
    opt.close()


def test_resume_daemon_continues_bit_identical_with_the_lr(fresh_daemons, prefix):
    d = fresh_daemons("--lease_seconds=1")
    expected = uninterrupted(d.target, "alone/", 6)

    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    data = batches(6)
    train(model, opt, data[:3], sched)
    # The trainer dies (nothing closed, nothing saved but the model's code and data).
    del opt, sched
    restarted = fresh_model(7)  # freshly initialised: other weights
    # The dead trainer's lease is live for 1 s: refused without takeover, named.
    with pytest.raises(optstate.FailedPrecondition, match="leased by job"):
        RemoteAdamW(restarted.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                    resume="daemon")
    time.sleep(1.2)
    opt = RemoteAdamW(restarted.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                      resume="daemon", takeover=True)
    assert opt.resumed_step == 3
    assert opt.param_groups[0]["lr"] == (1e-2 * 0.9) * 0.9  # step 3's, as the schedule made it
    assert opt.state[restarted.fc1.weight]["step"].item() == 3
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    opt.resume_scheduler(sched)
    assert sched.last_epoch == 3 and opt.param_groups[0]["lr"] == ((1e-2 * 0.9) * 0.9) * 0.9
    train(restarted, opt, data[3:], sched)
    assert same(params(restarted), expected)
    opt.close()


_RESUMED_SCHEDULES = {
    "warmup then cosine": lambda o: torch.optim.lr_scheduler.SequentialLR(
        o, [torch.optim.lr_scheduler.LinearLR(o, 0.1, 1.0, total_iters=3),
            torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=9)], milestones=[3]),
    "chained": lambda o: torch.optim.lr_scheduler.ChainedScheduler(
        [torch.optim.lr_scheduler.ExponentialLR(o, 0.95),
         torch.optim.lr_scheduler.StepLR(o, 4, 0.5)]),
    "warm restarts": lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(
        o, T_0=3, T_mult=2),
}


@pytest.mark.parametrize("schedule", sorted(_RESUMED_SCHEDULES))
def test_resume_scheduler_rebuilds_composite_and_cycling_schedules(daemon, prefix, schedule):
    """SequentialLR (its current scheduler at its own epoch), ChainedScheduler (each of
    its schedulers) and CosineAnnealingWarmRestarts (its place in a cycle) resumed after 7
    of 12 steps: every later lr and the final parameters equal an uninterrupted run's."""
    make = _RESUMED_SCHEDULES[schedule]
    data = batches(12)
    expected_model = MLP()
    expected_opt = RemoteAdamW(expected_model.named_parameters(), 1e-2, target=daemon.target,
                               name_prefix=prefix + "alone/", delete_on_close=True)
    expected_sched = make(expected_opt)
    expected_lrs = []
    for batch in data:
        train(expected_model, expected_opt, [batch], expected_sched)
        expected_lrs.append(expected_opt.param_groups[0]["lr"])
    expected_opt.close()

    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=daemon.target,
                      name_prefix=prefix + "job/")
    train(model, opt, data[:7], make(opt))
    opt.close()
    restarted = fresh_model(7)
    opt = RemoteAdamW(restarted.named_parameters(), 1e-2, target=daemon.target,
                      name_prefix=prefix + "job/", resume="daemon", takeover=True,
                      delete_on_close=True)
    sched = make(opt)
    opt.resume_scheduler(sched)
    lrs = [opt.param_groups[0]["lr"]]
    for batch in data[7:]:
        train(restarted, opt, [batch], sched)
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == expected_lrs[6:]
    assert same(params(restarted), params(expected_model))
    opt.close()


def test_resume_scheduler_refuses_what_it_cannot_rebuild(daemon, prefix):
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=daemon.target,
                      name_prefix=prefix)
    train(model, opt, batches(2))
    opt.close()
    opt = RemoteAdamW(fresh_model(7).named_parameters(), 1e-2, target=daemon.target,
                      name_prefix=prefix, resume="daemon", takeover=True, delete_on_close=True)
    with pytest.raises(ValueError, match="ReduceLROnPlateau.*state_dict"):
        opt.resume_scheduler(torch.optim.lr_scheduler.ReduceLROnPlateau(opt))
    stepped = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    with pytest.warns(UserWarning, match="before `optimizer.step"):
        stepped.step()  # (torch warns: no step of this process came first)
    with pytest.raises(ValueError, match="stepped 1 times since it was made"):
        opt.resume_scheduler(stepped)
    opt.close()


def test_resume_takes_the_daemons_hyperparameters_over_the_constructors(fresh_daemons, prefix):
    # A restarted trainer constructed with other hyperparameters than the run it resumes:
    # registration answered ALREADY_EXISTS, "Delete it first", which would destroy the job.
    d = fresh_daemons("--lease_seconds=1")
    expected = uninterrupted(d.target, "alone/", 5)
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    data = batches(5)
    train(model, opt, data[:3], sched)
    del opt, sched
    time.sleep(1.2)
    other = dict(lr=5e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    restarted = fresh_model(7)
    with pytest.raises(optstate.FailedPrecondition, match="already has state"):
        RemoteAdamW(restarted.named_parameters(), **other, target=d.target, name_prefix=prefix,
                    takeover=True)
    with pytest.raises(optstate.AlreadyExists, match="amsgrad=False.*amsgrad=True"):
        RemoteAdamW(restarted.named_parameters(), **other, amsgrad=True, target=d.target,
                    name_prefix=prefix, resume="daemon", takeover=True)
    opt = RemoteAdamW(restarted.named_parameters(), **other, target=d.target, name_prefix=prefix,
                      resume="daemon", takeover=True)
    group = opt.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == \
        ((1e-2 * 0.9) * 0.9, (0.9, 0.999), 1e-8, 1e-2)  # step 3's, from the daemon
    # A scheduler's base lr is the job's (the daemon's registered lr), not the new lr=.
    assert group["initial_lr"] == 1e-2
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    assert sched.base_lrs == [1e-2]
    opt.resume_scheduler(sched)
    train(restarted, opt, data[3:], sched)
    assert same(params(restarted), expected)
    opt.close()


def test_two_jobs_on_one_prefix_are_refused_and_apart_are_bit_identical(daemon, prefix):
    alone = uninterrupted(daemon.target, prefix + "alone/", 4)
    model_a, model_b = MLP(), MLP()
    a = RemoteAdamW(model_a.named_parameters(), 1e-2, target=daemon.target, name_prefix=prefix,
                    delete_on_close=True)
    b = RemoteAdamW(model_b.named_parameters(), 1e-2, target=daemon.target, name_prefix=prefix)
    sched_a = torch.optim.lr_scheduler.ExponentialLR(a, 0.9)
    data = batches(4)
    train(model_a, a, data[:1], sched_a)
    x, y = data[0]
    torch.nn.functional.cross_entropy(model_b(x), y).backward()
    with pytest.raises(optstate.FailedPrecondition) as refused:
        b.step()
    assert "leased by job" in str(refused.value) and prefix in str(refused.value)
    train(model_a, a, data[1:], sched_a)
    assert same(params(model_a), alone)  # job A never saw job B
    b.close()
    a.close()

    # Given their own prefixes, two jobs stepping in turn train as each alone.
    model_a, model_b = MLP(), MLP()
    a = RemoteAdamW(model_a.named_parameters(), 1e-2, target=daemon.target,
                    name_prefix=prefix + "a/", delete_on_close=True)
    b = RemoteAdamW(model_b.named_parameters(), 1e-2, target=daemon.target,
                    name_prefix=prefix + "b/", delete_on_close=True)
    sa = torch.optim.lr_scheduler.ExponentialLR(a, 0.9)
    sb = torch.optim.lr_scheduler.ExponentialLR(b, 0.9)
    for batch in data:
        train(model_a, a, [batch], sa)
        train(model_b, b, [batch], sb)
    assert same(params(model_a), alone) and same(params(model_b), alone)
    a.close()
    b.close()


def test_a_lease_shows_in_list_groups_and_refuses_delete(daemon, prefix):
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=daemon.target, name_prefix=prefix,
                      delete_on_close=True)
    train(model, opt, batches(1))
    info = optstate.Client(daemon.target).describe(prefix + "fc1.weight")
    assert info.lease["job"] == prefix and not info.lease["expired"]
    assert info.last_step == {"step": 1, "lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8,
                              "weight_decay": 1e-2, "maximize": False}
    other = optstate.Client(daemon.target, lease_holder="someone-else")
    with pytest.raises(optstate.FailedPrecondition, match="leased by job"):
        other.delete(prefix + "fc1.weight")
    with pytest.raises(optstate.FailedPrecondition, match="leased by job"):
        optstate.Client(daemon.target).delete(prefix + "fc1.weight")  # no holder, live lease
    assert optstate.Client(daemon.target).describe(prefix + "fc1.weight").max_step == 1
    opt.close()  # the holder deletes its own


def test_a_torn_step_is_refused_then_finished_or_loaded(fresh_daemons, prefix):
    d = fresh_daemons("--lease_seconds=1")
    expected = uninterrupted(d.target, "alone/", 4)
    data = batches(4)

    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    train(model, opt, data[:2], sched)
    checkpoint = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                  "opt": opt.state_dict(), "sched": sched.state_dict()}
    # Step 3 dies part-way: fc1.weight reaches step 3, the other groups stay at 2.
    grads = die_part_way(model, opt, data[2], 3, prefix, "fc1.weight")
    del opt, sched
    time.sleep(1.2)

    resumed = fresh_model(5)
    with pytest.raises(optstate.FailedPrecondition) as torn:
        RemoteAdamW(resumed.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                    resume="daemon", takeover=True)
    assert "part-way through step 3" in str(torn.value) and "finish_torn_step" in str(torn.value)

    # Way 1: finish step 3 with its gradients (only the groups behind are stepped).
    opt = RemoteAdamW(resumed.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                      resume="daemon", takeover=True, finish_torn_step=True)
    assert opt.resumed_step == 3
    for n, p in resumed.named_parameters():
        if n in grads:
            p.grad = grads[n].clone()
    opt.param_groups[0]["lr"] = (1e-2 * 0.9) * 0.9  # step 3's lr, as the schedule made it
    opt.step()
    assert {g.min_step for g in opt.client.list_groups()
            if g.name.startswith(prefix) and g.max_step > 0} == {3}
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    opt.resume_scheduler(sched)
    train(resumed, opt, data[3:], sched)
    assert same(params(resumed), expected)
    opt.close()

    # Way 2: a new trainer loads its checkpoint of step 2 (state_dict replaces each group).
    time.sleep(1.2)
    reloaded = MLP(seed=9)
    reloaded.load_state_dict(checkpoint["model"])
    opt = RemoteAdamW(reloaded.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                      resume="state_dict", takeover=True, delete_on_close=True)
    opt.load_state_dict(checkpoint["opt"])
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    sched.load_state_dict(checkpoint["sched"])
    train(reloaded, opt, data[2:], sched)
    assert same(params(reloaded), expected)
    opt.close()


def test_a_trainer_that_finished_a_torn_step_and_died_leaves_a_job_the_next_takes_over(
        fresh_daemons, prefix):
    # Trainer A died part-way through step 3; trainer B finished it (stepping only the
    # groups behind, so only they took B's lease) and died before step 4. The job's
    # groups were then leased by two gone holders, and every takeover was refused, "take
    # them over one job at a time", even once both leases had expired.
    d, expected, data, grads = torn_at_step_three(fresh_daemons, prefix, "fc1.weight")

    b_model = fresh_model(5)
    b = RemoteAdamW(b_model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                    resume="daemon", takeover=True, finish_torn_step=True)
    for n, p in b_model.named_parameters():
        if n in grads:
            p.grad = grads[n].clone()
    b.param_groups[0]["lr"] = (1e-2 * 0.9) * 0.9
    b.step()
    holders = {g.lease["holder"] for g in b.client.list_groups()
               if g.name.startswith(prefix) and g.max_step > 0}
    assert len(holders) == 2 and b.lease_holder in holders
    del b
    time.sleep(1.2)

    c_model = fresh_model(6)
    c = RemoteAdamW(c_model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                    resume="daemon", takeover=True, delete_on_close=True)
    assert c.resumed_step == 3
    sched = torch.optim.lr_scheduler.ExponentialLR(c, 0.9)
    c.resume_scheduler(sched)
    train(c_model, c, data[3:], sched)
    assert same(params(c_model), expected)
    assert {g.lease["holder"] for g in c.client.list_groups()
            if g.name.startswith(prefix) and g.lease is not None} == {c.lease_holder}
    c.close()


def test_a_torn_first_step_is_refused_then_finished(fresh_daemons, prefix):
    # Step 1 reached fc1.weight only: the groups behind were at step 0, where frozen
    # parameters' groups stay too, and resume="daemon" attached at step 1 silently, taking
    # them for frozen: their step-1 gradients were never applied.
    d = fresh_daemons("--lease_seconds=1")
    expected = uninterrupted(d.target, "alone/", 3)
    data = batches(3)
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix)
    grads = die_part_way(model, opt, data[0], 1, prefix, "fc1.weight")
    del opt
    time.sleep(1.2)

    resumed = fresh_model(5)
    with pytest.raises(optstate.FailedPrecondition) as torn:
        RemoteAdamW(resumed.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                    resume="daemon", takeover=True)
    assert "part-way through step 1" in str(torn.value), torn.value
    assert "fc2.weight" in str(torn.value) and "fc1.bias" not in str(torn.value), torn.value
    opt = RemoteAdamW(resumed.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                      resume="daemon", takeover=True, finish_torn_step=True)
    assert opt.resumed_step == 1
    for n, p in resumed.named_parameters():
        if n in grads:
            p.grad = grads[n].clone()
    opt.step()
    steps = {g.name[len(prefix):]: g.max_step for g in opt.client.list_groups()
             if g.name.startswith(prefix)}
    assert steps == {n: 1 if p.requires_grad else 0 for n, p in resumed.named_parameters()}
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    opt.resume_scheduler(sched)
    train(resumed, opt, data[1:], sched)
    assert same(params(resumed), expected)
    opt.close()


@pytest.mark.parametrize("scheduler_first", [False, True])
def test_a_torn_step_finishes_with_its_own_lr_whichever_parameter_got_it(fresh_daemons, prefix,
                                                                         scheduler_first):
    # Step 3 reached only fc2.bias, the model's last parameter: param_groups took the lr of
    # the first parameter's record (step 2's), so the finishing step and every step after
    # it ran one lr behind. resume_scheduler() before the finishing step moved lr on to
    # step 4's, which finished step 3 with it.
    d, expected, data, grads = torn_at_step_three(fresh_daemons, prefix, "fc2.bias")

    resumed = fresh_model(5)
    opt = RemoteAdamW(resumed.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                      resume="daemon", takeover=True, finish_torn_step=True,
                      delete_on_close=True)
    assert opt.resumed_step == 3
    assert opt.param_groups[0]["lr"] == (1e-2 * 0.9) * 0.9  # step 3's
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    if scheduler_first:
        opt.resume_scheduler(sched)
    for n, p in resumed.named_parameters():
        if n in grads:
            p.grad = grads[n].clone()
    opt.step()
    if not scheduler_first:
        opt.resume_scheduler(sched)
    assert opt.param_groups[0]["lr"] == ((1e-2 * 0.9) * 0.9) * 0.9  # step 4's
    assert {g.last_step["lr"] for g in opt.client.list_groups()
            if g.name.startswith(prefix) and g.max_step > 0} == {(1e-2 * 0.9) * 0.9}
    train(resumed, opt, data[3:], sched)
    assert same(params(resumed), expected)
    opt.close()


def test_a_job_a_live_trainer_steps_is_refused_for_its_lease_not_as_torn(fresh_daemons, prefix):
    # The live trainer is part-way through its steps' groups (some at 3, some at 2): the
    # second trainer was told to finish a torn step, and only after doing so heard that
    # the job was another's.
    d = fresh_daemons()
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                      delete_on_close=True)
    train(model, opt, batches(2))
    opt.client.step([(prefix + "fc1.weight", torch.ones_like(model.fc1.weight))], 3, lr=1e-2)
    for finish in (False, True):
        with pytest.raises(optstate.FailedPrecondition) as refused:
            RemoteAdamW(fresh_model(5).named_parameters(), 1e-2, target=d.target,
                        name_prefix=prefix, resume="daemon", takeover=True,
                        finish_torn_step=finish)
        message = str(refused.value)
        assert "whose lease is live" in message and "part-way" not in message, message
    opt.close()


def test_a_stale_trainer_after_a_restart_hears_of_the_new_holder(fresh_daemons, prefix,
                                                                  tmp_path):
    # The daemon restarted from its checkpoint of step 2 and a new trainer resumed there
    # and stepped to 4. The old trainer's next step is refused for the new one's lease;
    # it was told the daemon "restored step 4" (the live step) and to rewind to it.
    d, model, old, data = trained_then_restored(fresh_daemons, prefix, tmp_path, 3)
    new = RemoteAdamW(fresh_model(5).named_parameters(), 1e-2, target=d.target,
                      name_prefix=prefix, resume="daemon", delete_on_close=True)
    assert new.resumed_step == 2
    for _ in range(2):
        for group in new.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = torch.ones_like(p)
        new.step()
    with pytest.raises(optstate.FailedPrecondition) as refused:
        train(model, old, data[3:4])
    message = str(refused.value)
    assert "leased by" in message and new.lease_holder in message, message
    assert "restored step" not in message, message
    new.close()


def test_groups_more_than_one_step_apart_are_not_finished_as_a_torn_step(fresh_daemons, prefix):
    # One daemon of a job restored an older checkpoint (here: fc1.weight stepped twice on
    # alone). finish_torn_step=True stepped the groups behind one step each with the
    # gradients given, leaving them a step behind for good, with no error.
    d = fresh_daemons("--lease_seconds=1")
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix)
    train(model, opt, batches(2))
    grad = torch.ones_like(model.fc1.weight)
    for step in (3, 4):
        opt.client.step([(prefix + "fc1.weight", grad)], step, lr=1e-2)
    del opt
    time.sleep(1.2)

    def steps():
        return sorted((g.name, g.min_step, g.max_step)
                      for g in optstate.Client(d.target).list_groups() if g.name.startswith(prefix))

    before = steps()
    with pytest.raises(optstate.FailedPrecondition, match="more than one step apart") as apart:
        RemoteAdamW(fresh_model(5).named_parameters(), 1e-2, target=d.target,
                    name_prefix=prefix, resume="daemon", takeover=True, finish_torn_step=True)
    assert "steps 2 to 4" in str(apart.value) and "resume='state_dict'" in str(apart.value)
    with pytest.raises(optstate.FailedPrecondition, match="more than one step apart"):
        RemoteAdamW(fresh_model(5).named_parameters(), 1e-2, target=d.target,
                    name_prefix=prefix, resume="daemon", takeover=True)
    assert steps() == before


def test_resume_state_dict_steps_only_after_load_state_dict(fresh_daemons, prefix):
    # A restarted trainer that attached with resume='state_dict' and forgot to load its
    # checkpoint: its step continued the daemon's step-2 state with the new model's
    # gradients and overwrote the model with the daemon's values.
    d = fresh_daemons("--lease_seconds=1")
    expected = uninterrupted(d.target, "alone/", 4)
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    train(model, opt, batches(4)[:2], sched)
    checkpoint = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                  "opt": opt.state_dict(), "sched": sched.state_dict()}
    del opt, sched
    time.sleep(1.2)

    restarted = MLP(seed=9)
    opt = RemoteAdamW(restarted.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                      resume="state_dict", takeover=True, delete_on_close=True)
    before = params(restarted)
    with pytest.raises(optstate.FailedPrecondition, match="load_state_dict\\(\\) has not been"):
        train(restarted, opt, batches(4)[2:3])
    assert same(params(restarted), before)
    assert {g.max_step for g in opt.client.list_groups()
            if g.name.startswith(prefix) and g.max_step > 0} == {2}
    restarted.load_state_dict(checkpoint["model"])
    opt.load_state_dict(checkpoint["opt"])
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    sched.load_state_dict(checkpoint["sched"])
    train(restarted, opt, batches(4)[2:], sched)
    assert same(params(restarted), expected)
    opt.close()


class Wrapper(torch.nn.Module):
    """Names its model as DDP and FSDP do: module.*."""

    def __init__(self, model):
        super().__init__()
        self.module = model

    def forward(self, x):
        return self.module(x)


@pytest.mark.parametrize("first,second", [("plain", "compiled"), ("compiled", "plain"),
                                          ("plain", "ddp"), ("ddp", "compiled")])
def test_names_survive_torch_compile_and_ddp_wrapping(fresh_daemons, prefix, first, second):
    d = fresh_daemons("--lease_seconds=1")
    expected = uninterrupted(d.target, "alone/", 4, gamma=1.0)
    wrap = {"plain": lambda m: m, "compiled": torch.compile, "ddp": Wrapper}
    data = batches(4)
    model = MLP()
    opt = RemoteAdamW(wrap[first](model).named_parameters(), 1e-2, target=d.target,
                      name_prefix=prefix)
    train(model, opt, data[:2])
    names = sorted(g.name for g in opt.client.list_groups() if g.name.startswith(prefix))
    assert names == sorted(prefix + n for n, _ in MLP().named_parameters())
    del opt
    time.sleep(1.2)
    model2 = fresh_model(3)
    opt = RemoteAdamW(wrap[second](model2).named_parameters(), 1e-2, target=d.target,
                      name_prefix=prefix, resume="daemon", takeover=True, delete_on_close=True)
    assert opt.resumed_step == 2
    train(model2, opt, data[2:])
    assert same(params(model2), expected)
    assert sorted(g.name for g in opt.client.list_groups() if g.name.startswith(prefix)) == names
    opt.close()


def test_new_parameters_beside_trained_ones_are_refused_unless_added(fresh_daemons, prefix):
    d = fresh_daemons("--lease_seconds=1")
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix)
    train(model, opt, batches(2))
    del opt
    time.sleep(1.2)
    grown = MLP(seed=4)
    grown.head = torch.nn.Linear(10, 3)
    with pytest.raises(optstate.FailedPrecondition, match="add_param_group") as refused:
        RemoteAdamW(grown.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                    resume="daemon", takeover=True)
    assert "head.weight" in str(refused.value)
    client = optstate.Client(d.target)
    assert all(not g.name.startswith(prefix + "head") for g in client.list_groups())
    body = [(n, p) for n, p in grown.named_parameters() if not n.startswith("head")]
    opt = RemoteAdamW(body, 1e-2, target=d.target, name_prefix=prefix, resume="daemon",
                      takeover=True, delete_on_close=True)
    opt.add_param_group({"params": list(grown.head.named_parameters(prefix="head"))})
    assert client.describe(prefix + "head.weight").max_step == 0
    opt.close()
    # resume="state_dict" takes new parameters beside trained ones (one daemon of several
    # may have lost its groups), but not renamed ones: the old names' trained groups
    # would stay on the daemon, named by no parameter.
    job = prefix + "again/"
    trained = MLP()
    trained_opt = RemoteAdamW(trained.named_parameters(), 1e-2, target=d.target, name_prefix=job)
    train(trained, trained_opt, batches(2))
    saved = trained_opt.state_dict()
    time.sleep(1.2)  # its lease expires
    renamed = [("renamed." + n, p) for n, p in MLP(seed=5).named_parameters()]
    with pytest.raises(optstate.FailedPrecondition, match="renamed parameters") as refused:
        RemoteAdamW(renamed, 1e-2, target=d.target, name_prefix=job, resume="daemon",
                    takeover=True)
    assert "no parameter of this model" in str(refused.value)
    assert all(not g.name.startswith(job + "renamed.") for g in client.list_groups())
    # resume="state_dict" asks at load_state_dict(), once groups added later are known
    # too; nothing is imported.
    opt = RemoteAdamW(renamed, 1e-2, target=d.target, name_prefix=job, resume="state_dict",
                      takeover=True, delete_on_close=True)
    with pytest.raises(optstate.FailedPrecondition, match="renamed parameters"):
        opt.load_state_dict(saved)
    assert {g.max_step for g in client.list_groups() if g.name.startswith(job + "renamed.")} == {0}
    opt.close()


def test_a_daemon_killed_and_restarted_is_ridden_out_with_state_dir(fresh_daemons, prefix,
                                                                    tmp_path):
    d = fresh_daemons(f"--state_dir={tmp_path}", "--checkpoint_interval=0")
    expected = uninterrupted(d.target, "alone/", 5)
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                      reconnect_timeout=30)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    data = batches(5)
    train(model, opt, data[:3], sched)
    checkpoint_trained(opt, model, prefix, 3)
    d.process.kill()
    d.process.wait()
    restarted = []

    def restart():
        time.sleep(1.5)
        restarted.append(fresh_daemons(f"--state_dir={tmp_path}", "--checkpoint_interval=0",
                                       f"--listen=127.0.0.1:{d.port}"))

    thread = threading.Thread(target=restart)
    thread.start()
    train(model, opt, data[3:], sched)  # step 4 waits for the daemon, then goes on
    thread.join()
    assert same(params(model), expected)
    assert restarted[0].port == d.port
    opt.close()


def test_a_step_that_fails_says_what_it_left_and_the_same_step_again_goes_on(fresh_daemons,
                                                                             prefix, tmp_path):
    # A daemon lost during step() left the parameters of the groups it had applied at
    # step k and the others as they were; the error (UNAVAILABLE) did not say so. It does,
    # and the way on it gives, step() again with the same gradients once the daemon is
    # back, continues bit-identical to a run never interrupted.
    d = fresh_daemons(f"--state_dir={tmp_path}", "--checkpoint_interval=0")
    expected = uninterrupted(d.target, "alone/", 4)
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                      reconnect_timeout=0.5)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    data = batches(4)
    train(model, opt, data[:2], sched)
    checkpoint_trained(opt, model, prefix, 2)
    d.process.kill()
    d.process.wait()
    x, y = data[2]
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    before = params(model)
    with pytest.raises(optstate.Unavailable) as failed:
        opt.step()
    assert "step() failed during step 3" in str(failed.value), failed.value
    assert "same gradients" in str(failed.value)
    assert same(params(model), before)
    fresh_daemons(f"--state_dir={tmp_path}", "--checkpoint_interval=0",
                  f"--listen=127.0.0.1:{d.port}")
    opt.step()  # the same gradients, step 3 again
    sched.step()
    train(model, opt, data[3:], sched)
    assert same(params(model), expected)
    opt.close()


def test_a_daemon_restored_from_an_older_checkpoint_names_the_step_it_restored(
        fresh_daemons, prefix, tmp_path):
    # The model's frozen parameters (fc1.bias, norm.bias) have groups that stay at step 0;
    # the error took the lowest step of every group and said "restored step 0 ... Rewind
    # the trainer to step 0", where the checkpoint held step 2.
    _, model, opt, data = trained_then_restored(fresh_daemons, prefix, tmp_path, 4)
    x, y = data[4]
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(optstate.FailedPrecondition) as refused:
        opt.step()
    message = str(refused.value)
    assert "restored step 2 from its checkpoint; this job is at step 4" in message, message
    assert "Rewind the trainer to step 2" in message, message


def test_a_daemon_back_within_reconnect_timeout_is_found_in_time(fresh_daemons, prefix, tmp_path):
    # The daemon is away 3 s of an 8 s reconnect_timeout. The client's retries slept
    # between attempts while nothing polled the channel, so a connection attempt's outcome
    # was seen only by gRPC's backup poller (every 5 s): the daemon went unnoticed 6-9 s
    # after it was back, and the step failed UNAVAILABLE past the timeout.
    d = fresh_daemons(f"--state_dir={tmp_path}", "--checkpoint_interval=0")
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                      reconnect_timeout=8)
    data = batches(3)
    train(model, opt, data[:2])
    checkpoint_trained(opt, model, prefix, 2)
    d.process.kill()
    d.process.wait()
    thread = threading.Timer(3.0, lambda: fresh_daemons(
        f"--state_dir={tmp_path}", "--checkpoint_interval=0", f"--listen=127.0.0.1:{d.port}"))
    thread.start()
    train(model, opt, data[2:])  # step 3 waits for the daemon, then goes on
    thread.join()
    assert {g.max_step for g in opt.client.list_groups()
            if g.name.startswith(prefix) and g.max_step > 0} == {3}
    opt.close()


def test_after_both_crash_resume_daemon_gets_the_lr_from_the_checkpoint(fresh_daemons, prefix,
                                                                        tmp_path):
    d = fresh_daemons(f"--state_dir={tmp_path}", "--checkpoint_interval=0")
    expected = uninterrupted(d.target, "alone/", 5)
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    data = batches(5)
    train(model, opt, data[:3], sched)
    checkpoint_trained(opt, model, prefix, 3)
    d.process.kill()  # the daemon and the trainer die together
    d.process.wait()
    del opt, sched
    again = fresh_daemons(f"--state_dir={tmp_path}", "--checkpoint_interval=0")
    restarted = fresh_model(17)
    opt = RemoteAdamW(restarted.named_parameters(), 1e-2, target=again.target,
                      name_prefix=prefix, resume="daemon", delete_on_close=True)
    assert opt.resumed_step == 3
    assert opt.param_groups[0]["lr"] == (1e-2 * 0.9) * 0.9  # step 3's, from the checkpoint
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    opt.resume_scheduler(sched)
    train(restarted, opt, data[3:], sched)
    alone = uninterrupted(again.target, "alone/", 5)
    assert same(params(restarted), expected) and same(alone, expected)
    opt.close()


def test_close_after_an_outage_waits_for_the_daemon_and_deletes_the_groups(fresh_daemons,
                                                                            prefix, tmp_path):
    # close() with delete_on_close failed at once (UNAVAILABLE) on a daemon back from a
    # restart, marked the optimizer closed, and left its groups on the daemon.
    flags = (f"--state_dir={tmp_path}", "--checkpoint_interval=0")
    d = fresh_daemons(*flags)
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                      delete_on_close=True, reconnect_timeout=30)
    train(model, opt, batches(1))
    checkpoint_trained(opt, model, prefix, 1)
    d.process.kill()
    d.process.wait()
    again = fresh_daemons(f"--listen=127.0.0.1:{d.port}", *flags)
    opt.close()
    assert [g.name for g in optstate.Client(again.target).list_groups()] == []


def test_a_with_block_that_raises_keeps_its_exception_when_close_fails(fresh_daemons, prefix):
    # The daemon gone at the end of the block: close()'s Unavailable took the place of the
    # block's own exception.
    d = fresh_daemons()
    with pytest.raises(KeyError, match="the block's own"):
        with pytest.warns(UserWarning, match=r"close\(\) at the end of a with block"):
            with RemoteAdamW(MLP().named_parameters(), 1e-2, target=d.target,
                             name_prefix=prefix, delete_on_close=True,
                             reconnect_timeout=0.5) as opt:
                d.process.kill()
                d.process.wait()
                raise KeyError("the block's own")
    # What close() could not delete, a later close() deletes (here: still gone).
    with pytest.raises(optstate.Unavailable):
        opt.close()


def test_an_optimizer_of_this_process_holding_the_groups_is_named_as_such(daemon, prefix):
    # Made again in one process (a notebook cell run twice), the second optimizer was told
    # the first's process "is not known to be gone" (it is this one), and takeover=True
    # was refused even once the first was closed.
    first_model = MLP()
    first = RemoteAdamW(first_model.named_parameters(), 1e-2, target=daemon.target,
                        name_prefix=prefix)
    train(first_model, first, batches(1))
    model = MLP()
    with pytest.raises(optstate.FailedPrecondition) as e:
        RemoteAdamW(model.named_parameters(), 1e-2, target=daemon.target, name_prefix=prefix,
                    resume="daemon")
    assert "another optimizer of this process" in str(e.value)
    assert f"lease_holder='{first.lease_holder}'" in str(e.value)
    with pytest.raises(optstate.FailedPrecondition, match=r"still open. close\(\) it first"):
        RemoteAdamW(model.named_parameters(), 1e-2, target=daemon.target, name_prefix=prefix,
                    resume="daemon", takeover=True)
    first.close()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=daemon.target, name_prefix=prefix,
                      resume="daemon", takeover=True, delete_on_close=True)
    assert opt.resumed_step == 1
    train(model, opt, batches(2)[1:])
    assert optstate.Client(daemon.target).describe(prefix + "fc1.weight").lease["holder"] == \
        opt.lease_holder
    opt.close()
    # A holder no optimizer here was made with (a Client given as client=, which steps
    # as its own lease_holder) is never taken for gone: taken over, it was broken while
    # its optimizer stepped on.
    given = optstate.Client(daemon.target, lease_holder="given-client")
    third_model = MLP()
    third = RemoteAdamW(third_model.named_parameters(), 1e-2, client=given,
                        name_prefix=prefix + "given/", delete_on_close=True)
    train(third_model, third, batches(1))
    with pytest.raises(optstate.FailedPrecondition, match="whose lease is live"):
        RemoteAdamW(MLP().named_parameters(), 1e-2, target=daemon.target,
                    name_prefix=prefix + "given/", resume="daemon", takeover=True)
    train(third_model, third, batches(2)[1:])
    third.close()


def test_a_daemon_restarted_without_state_dir_is_reported_clearly(fresh_daemons, prefix):
    d = fresh_daemons()
    model = MLP()
    opt = RemoteAdamW(model.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                      reconnect_timeout=30)
    data = batches(3)
    train(model, opt, data[:2])
    d.process.kill()
    d.process.wait()
    fresh_daemons(f"--listen=127.0.0.1:{d.port}")
    with pytest.raises(optstate.NotFound) as gone:
        train(model, opt, data[2:])
    message = str(gone.value)
    assert "restarted at" in message and "without --state_dir" in message
    assert "step 2" in message and "resume='state_dict'" in message
    # The daemon's own NOT_FOUND says it too, to any client.
    with pytest.raises(optstate.NotFound) as raw:
        optstate.Client(d.target).describe(prefix + "fc1.weight")
    assert "This optstated started at" in str(raw.value)
    assert "without --state_dir" in str(raw.value)


def test_connect_fails_within_connect_timeout_and_bad_targets_are_value_errors(prefix):
    started = time.monotonic()
    with pytest.raises(optstate.Unavailable, match="127.0.0.1:1"):
        RemoteAdamW(MLP().named_parameters(), target="127.0.0.1:1", name_prefix=prefix,
                    connect_timeout=1.0)
    assert time.monotonic() - started < 10
    for target in ("http://127.0.0.1:50051", "https://example:1"):
        with pytest.raises(ValueError, match="http"):
            RemoteAdamW(MLP().named_parameters(), target=target, name_prefix=prefix)
    with pytest.raises(ValueError, match="target"):
        RemoteAdamW(MLP().named_parameters(), target="", name_prefix=prefix)


def test_a_job_is_rewound_to_its_checkpoint_while_another_keeps_stepping(fresh_daemons,
                                                                         prefix, tmp_path):
    d = fresh_daemons(f"--state_dir={tmp_path}", "--checkpoint_interval=0")
    alone_a = uninterrupted(d.target, "alone-a/", 4, gamma=1.0)
    alone_b = uninterrupted(d.target, "alone-b/", 6, gamma=1.0)
    data = batches(6)
    model_a, model_b = MLP(), MLP()
    a = RemoteAdamW(model_a.named_parameters(), 1e-2, target=d.target, name_prefix=prefix + "a/")
    b = RemoteAdamW(model_b.named_parameters(), 1e-2, target=d.target, name_prefix=prefix + "b/",
                    delete_on_close=True)
    stepped_a = [prefix + "a/" + n for n, p in model_a.named_parameters() if p.requires_grad]
    for batch in data[:2]:
        train(model_a, a, [batch])
        train(model_b, b, [batch])
    a.client.checkpoint(groups=stepped_a, wait_for_step=2)
    for batch in data[2:4]:
        train(model_a, a, [batch])  # A goes on to step 4, then finds it must go back to 2
        train(model_b, b, [batch])

    with pytest.raises(optstate.NotFound, match="at step 3"):
        a.client.rewind_job(prefix + "a/", step=3)
    with pytest.raises(optstate.FailedPrecondition, match="leased by job"):
        optstate.Client(d.target, lease_holder="another-job").rewind_job(prefix + "a/")
    rewound = a.client.rewind_job(prefix + "a/", step=2)
    assert rewound["step"] == 2 and sorted(rewound["groups"]) == sorted(
        prefix + "a/" + n for n, _ in MLP().named_parameters())
    client = optstate.Client(d.target)
    assert {client.describe(n).max_step for n in stepped_a} == {2}
    assert {client.describe(prefix + "b/" + n).max_step for n, p in model_b.named_parameters()
            if p.requires_grad} == {4}
    train(model_b, b, data[4:5])  # B steps on through A's rewind

    # A's trainer attaches again (its lease holder kept) and steps 3 and 4 anew.
    resumed = fresh_model(11)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the checkpoint holds step 2's record: no warning
        a2 = RemoteAdamW(resumed.named_parameters(), 1e-2, target=d.target,
                         name_prefix=prefix + "a/", resume="daemon", delete_on_close=True,
                         lease_holder=a.lease_holder)
    assert a2.resumed_step == 2
    assert a2.client.describe(prefix + "a/fc1.weight").last_step["step"] == 2
    train(resumed, a2, data[2:4])
    train(model_b, b, data[5:6])
    assert same(params(resumed), alone_a) and same(params(model_b), alone_b)
    a2.close()
    b.close()


@pytest.mark.parametrize("quota", ["max_groups=2", "max_host_bytes=1536"])
def test_a_rewind_at_the_tenants_quota_replaces_its_groups(fresh_daemons, prefix, tmp_path,
                                                           quota):
    # Two groups of 64 elements (768 host bytes each) filling the tenant's quota
    # exactly: the rewind counted the checkpoint's copies of the job's live groups as new
    # groups and answered NOT_FOUND, "no checkpoint holds the job", naming the quota (a
    # tenant past half its quota could not rewind at all).
    import hashlib
    (tmp_path / "tokens").write_text(
        f"team {hashlib.sha256(b'secret').hexdigest()} {quota}\n")
    d = fresh_daemons(f"--state_dir={tmp_path / 'state'}", "--checkpoint_interval=0",
                      f"--auth_tokens_file={tmp_path / 'tokens'}")
    client = optstate.Client(d.target, token="secret", lease_holder="job")
    names = [prefix + "a", prefix + "b"]
    for name in names:
        client.register(name, torch.ones(64))
    for step in (1, 2, 3):
        client.step([(name, torch.full((64,), 0.1)) for name in names], step)
        if step == 2:
            client.checkpoint(wait_for_step=2)
            at_two = client.export_state(names[0])
    assert client.rewind_job(prefix, validate_only=True)["step"] == 2
    assert client.rewind_job(prefix)["step"] == 2
    assert [client.describe(name).max_step for name in names] == [2, 2]
    rewound = client.export_state(names[0])
    assert (rewound.params == at_two.params).all() and (rewound.exp_avg == at_two.exp_avg).all()
    # An import over a live group is no new group either.
    state = client.export_state(names[1])
    client.import_state(names[1], state.params, state.exp_avg, state.exp_avg_sq,
                        list(state.page_steps))
    # A third group is still past the quota.
    with pytest.raises(optstate.ResourceExhausted, match="quota"):
        client.register(prefix + "c", torch.ones(64))
    stats = client.stats()
    assert stats["num_groups"] == 2 and stats["host_bytes"] == 1536


def test_rewind_needs_a_state_dir(daemon, prefix):
    with pytest.raises(optstate.FailedPrecondition, match="without --state_dir"):
        optstate.Client(daemon.target).rewind_job(prefix)
    # The request's own fault is named first, whatever the daemon keeps.
    with pytest.raises(optstate.InvalidArgument, match="non-empty name prefix"):
        optstate.Client(daemon.target).rewind_job("")


def test_a_group_registered_again_with_another_size_is_refused_by_the_rewind(
        fresh_daemons, prefix, tmp_path):
    # A job group deleted and registered again with another size since the checkpoint
    # got ImportState's ALREADY_EXISTS, "the imported state ... import under another name".
    d = fresh_daemons(f"--state_dir={tmp_path}", "--checkpoint_interval=0")
    client = optstate.Client(d.target, lease_holder="job")
    names = [prefix + "a", prefix + "b"]
    for name in names:
        client.register(name, torch.ones(128))
    client.step([(name, torch.full((128,), 0.1)) for name in names], 1)
    client.checkpoint(wait_for_step=1)
    client.step([(name, torch.full((128,), 0.1)) for name in names], 2)
    client.delete(names[1])
    client.register(names[1], torch.ones(256))
    kept = client.export_state(names[0])
    for validate_only in (True, False):
        with pytest.raises(optstate.FailedPrecondition,
                           match="num_elements=256 .* here, but num_elements=128") as e:
            client.rewind_job(prefix, validate_only=validate_only)
        assert f"group '{names[1]}'" in str(e.value) and "Delete it first" in str(e.value)
    assert [client.describe(n).max_step for n in names] == [2, 0]
    assert (client.export_state(names[0]).params == kept.params).all()
    # Deleted, it is made again from the checkpoint.
    client.delete(names[1])
    rewound = client.rewind_job(prefix)
    assert rewound["step"] == 1 and sorted(rewound["groups"]) == names
    assert client.describe(names[1]).num_elements == 128


def test_a_checkpoint_from_before_the_first_step_holds_the_job_at_step_zero(
        fresh_daemons, prefix, tmp_path):
    # A checkpoint written before the job's first step held its groups at step 0, which
    # the rewind took for frozen groups (the same at every step): any step asked was
    # answered OK with that step, and the job's trained steps were gone (at step 0).
    d = fresh_daemons(f"--state_dir={tmp_path}", "--checkpoint_interval=0")
    client = optstate.Client(d.target, lease_holder="job")
    names = [prefix + "a", prefix + "b"]
    for name in names:
        client.register(name, torch.ones(64))
    client.checkpoint()
    before = {n: client.export_state(n) for n in names}
    client.step([(names[0], torch.full((64,), 0.1))], 1)
    client.step([(names[0], torch.full((64,), 0.1))], 2)
    client.checkpoint()
    trained = client.export_state(names[0])
    for validate_only in (True, False):
        with pytest.raises(optstate.NotFound, match="at step 99") as e:
            client.rewind_job(prefix, step=99, validate_only=validate_only)
        assert "it holds the job at step 0" in str(e.value)
    assert [client.describe(n).max_step for n in names] == [2, 0]
    assert (client.export_state(names[0]).params == trained.params).all()
    # Asked for no step, the newest checkpoint that holds the job whole is taken: step 2's
    # holds a at 2 and b (never stepped, live too) at any step.
    assert client.rewind_job(prefix, validate_only=True)["step"] == 2
    # Step 0 is what the first checkpoint holds: the job before its first step.
    rewound = client.rewind_job(prefix, step=0)
    assert rewound["step"] == 0 and sorted(rewound["groups"]) == names
    assert [client.describe(n).max_step for n in names] == [0, 0]
    assert (client.export_state(names[0]).params == before[names[0]].params).all()


def test_a_rewind_to_before_a_parameter_was_unfrozen_gives_it_back_its_frozen_state(
        fresh_daemons, prefix, tmp_path):
    # A checkpoint holding a at step 2 and b at 0 (frozen then), b stepped since (unfrozen):
    # the checkpoint holds the job at step 2, b frozen at it.
    d = fresh_daemons(f"--state_dir={tmp_path}", "--checkpoint_interval=0")
    client = optstate.Client(d.target, lease_holder="job")
    a, b = prefix + "a", prefix + "b"
    client.register(a, torch.ones(64))
    client.register(b, torch.ones(64))
    for step in (1, 2):
        client.step([(a, torch.full((64,), 0.1))], step)
    client.checkpoint(groups=[a], wait_for_step=2)
    frozen = client.export_state(b)
    client.step([(a, torch.full((64,), 0.1))], 3)
    client.step([(b, torch.full((64,), 0.1))], 1)  # b's first step (torch counts per parameter)
    rewound = client.rewind_job(prefix, step=2)
    assert rewound["step"] == 2 and sorted(rewound["groups"]) == [a, b]
    assert [client.describe(n).max_step for n in (a, b)] == [2, 0]
    assert (client.export_state(b).params == frozen.params).all()


def test_a_ddp_job_shares_one_lease_and_resumes_unwrapped_after_its_ranks_died(
        fresh_daemons, prefix, tmp_path):
    """Two gloo ranks under real DistributedDataParallel step the same groups (module.*
    names stripped) under the job's one lease holder; once they are gone (their pids on
    this host dead), a plain, unwrapped trainer takes the job over at once (takeover=True:
    dead=) and resumes from the daemon's state."""
    import ddp_worker
    d = fresh_daemons()
    saved = ddp_worker.two_ranks(ddp_worker.run_wrapped, d.target, tmp_path, "wrapped", prefix, 3)
    assert saved[0]["holder"] == saved[1]["holder"]  # one job, one lease
    client = optstate.Client(d.target)
    names = sorted(g.name for g in client.list_groups())
    assert names == sorted(prefix + n for n, _ in MLP().named_parameters())
    assert client.describe(prefix + "fc1.weight").lease["holder"] == saved[0]["holder"]

    resumed = fresh_model(13)
    opt = RemoteAdamW(resumed.named_parameters(), 1e-2, target=d.target, name_prefix=prefix,
                      resume="daemon", takeover=True, delete_on_close=True)
    assert opt.resumed_step == 3
    assert all(torch.equal(p.detach(), saved[0]["final"][n])
               for n, p in resumed.named_parameters())
    train(resumed, opt, batches(1))
    assert client.describe(prefix + "fc1.weight").lease["holder"] == opt.lease_holder
    opt.close()


def test_a_rewound_job_is_what_a_daemon_killed_after_the_rewind_restores(fresh_daemons, prefix,
                                                                          tmp_path):
    # The newest checkpoint before the rewind holds the history the job left (step 8). The
    # daemon writes one after the rewind, so a daemon killed while the job steps its new
    # history restores the rewound job: its step 6 anew is applied, not taken as a replay
    # of the old step 6.
    d = fresh_daemons(f"--state_dir={tmp_path}", "--checkpoint_interval=0")
    holder = "rewinding-job"
    c = optstate.Client(d.target, lease_holder=holder)
    name = prefix + "w"
    c.register(name, np.linspace(-1.0, 1.0, 64, dtype=np.float32))
    params = np.zeros(64, dtype=np.float32)

    def grad(step, history):
        return np.full(64, 0.01 * step + history, dtype=np.float32)

    for step in range(1, 6):
        c.step(name, step, grad(step, 0.0), params)
    c.checkpoint(wait_for_step=5)
    at_five = c.export_state(name)
    for step in range(6, 9):
        c.step(name, step, grad(step, 0.0), params)
    c.checkpoint(wait_for_step=8)
    rewound = c.rewind_job(prefix, step=5)
    assert rewound["step"] == 5 and rewound["not_written"] == ""
    assert rewound["written_checkpoint_id"] not in ("", rewound["checkpoint_id"])
    d.process.kill()
    d.process.wait()
    again = fresh_daemons(f"--state_dir={tmp_path}", "--checkpoint_interval=0",
                          f"--listen=127.0.0.1:{d.port}")
    c2 = optstate.Client(again.target, lease_holder=holder)
    assert c2.describe(name).max_step == 5
    restored = c2.export_state(name)
    assert np.array_equal(restored.params, at_five.params)
    assert np.array_equal(restored.exp_avg_sq, at_five.exp_avg_sq)
    c2.step(name, 6, grad(6, 1.0), params)  # the new history's step 6: applied
    assert c2.describe(name).max_step == 6
    assert not np.array_equal(c2.export_state(name).exp_avg, at_five.exp_avg)
