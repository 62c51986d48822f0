"""RemoteAdamW's host staging of GPU parameters, driven on the CPU (staging="always": CPU
tensors through the same slots, hooks, version checks, copies-back and waits as CUDA ones;
only the copy engine differs: a worker thread runs the copies in order, each ending an
event, as a side stream does). Every staged run is compared bit for bit with the plain path and
with the IEEE reference chain; the CUDA-only parts (streams, events, pinning) are in
tests/gpu/test_cuda_staging.py."""
import copy
import gc
import weakref

import pytest
import torch
import torch.nn.functional as F

import optstate
import optstate._staging
from models import MLP
from optstate.torch import RemoteAdamW
from reference import bits_equal, ieee_adamw_

STEPS = 50


@pytest.fixture(autouse=True)
def slow_copies(monkeypatch):
    """Every staged copy runs 1 ms late on HostCopies' worker thread, so a wait the staging
    logic misses (a slot read before its copy, a parameter before its values) reads stale
    bytes and the comparisons fail."""
    monkeypatch.setattr(optstate._staging, "HOST_COPY_DELAY_S", 0.001)

MICRO_BATCHES = 2
MAX_NORM = 0.05  # small enough that most steps clip


def _batch(step, micro):
    gen = torch.Generator().manual_seed(1000 * step + micro)
    return torch.randn(16, 32, generator=gen), torch.randn(16, 10, generator=gen)


def _backward(model, step, accumulate=MICRO_BATCHES):
    for micro in range(accumulate):
        x, y = _batch(step, micro)
        (F.mse_loss(model(x), y) / accumulate).backward()


def _schedule(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 0.97 ** epoch)


def _trainable(model):
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("data_plane,kind", [("shared_memory", "shared_buffer"),
                                             ("wire", "host")])
def test_staged_steps_equal_the_plain_path_and_the_reference_for_50_steps(
        daemon, prefix, data_plane, kind):
    """Clipping (the staged side by opt.clip_grad_norm_, i.e. the daemon's grad_scale; the
    plain side by torch's in-place clip_grad_norm_), gradient accumulation over two
    micro-batches, a LambdaLR schedule, frozen parameters: the staged model's params equal
    the plain one's bit for bit after every step, and both the IEEE chain's."""
    plain_model, staged_model = MLP(seed=3), MLP(seed=3)
    plain = RemoteAdamW(plain_model.named_parameters(), lr=1e-2, target=daemon.target,
                        name_prefix=prefix + "plain/", data_plane=data_plane)
    staged = RemoteAdamW(staged_model.named_parameters(), lr=1e-2, target=daemon.target,
                         name_prefix=prefix + "staged/", data_plane=data_plane,
                         staging="always")
    schedules = [_schedule(plain), _schedule(staged)]
    chain = {n: [p.detach().clone(), torch.zeros_like(p), torch.zeros_like(p)]
             for n, p in _trainable(plain_model).items()}
    frozen = {n: p.detach().clone() for n, p in plain_model.named_parameters()
              if not p.requires_grad}
    clipped_steps = 0
    for step in range(1, STEPS + 1):
        lr = plain.param_groups[0]["lr"]
        assert staged.param_groups[0]["lr"] == lr
        for model, opt in ((plain_model, plain), (staged_model, staged)):
            opt.zero_grad()
            _backward(model, step)
        norm = torch.nn.utils.clip_grad_norm_(plain_model.parameters(), MAX_NORM)
        staged_norm = staged.clip_grad_norm_(MAX_NORM)
        assert bits_equal(staged_norm.reshape(1), norm.reshape(1))
        clipped_steps += bool(norm > MAX_NORM)
        for n, p in _trainable(plain_model).items():  # the reference: torch-clipped grads
            ieee_adamw_(chain[n][0], p.grad, chain[n][1], chain[n][2], step, lr)
        plain.step()
        staged.step()
        for schedule in schedules:
            schedule.step()
        for (n, p), q in zip(plain_model.named_parameters(), staged_model.parameters()):
            assert bits_equal(q.detach(), p.detach()), f"{n} at step {step}"
            if n in chain:
                assert bits_equal(p.detach(), chain[n][0]), f"{n} at step {step} (reference)"
            else:
                assert bits_equal(p.detach(), frozen[n]), n
    assert clipped_steps > STEPS // 2, clipped_steps  # clipping was exercised
    stats = staged.stats()["staging"]
    trainable = _trainable(staged_model)
    assert stats["kinds"] == [kind]
    # Every gradient copied in backward (each micro-batch's), none again at step().
    assert stats["gradients_copied_early"] == STEPS * MICRO_BATCHES * len(trainable)
    assert stats["gradients_copied_at_step"] == 0
    assert stats["values_copied"] == STEPS * len(trainable)
    # Slots for the trainable parameters only: two times each one's bytes.
    assert stats["parameters"] == {prefix + "staged/" + n: 2 * 4 * p.numel()
                                   for n, p in trainable.items()}
    assert stats["bytes"] >= sum(stats["parameters"].values())
    # The daemon holds the same moments for both.
    client = optstate.Client(daemon.target)
    for n in trainable:
        a = client.export_state(prefix + "plain/" + n)
        b = client.export_state(prefix + "staged/" + n)
        assert bits_equal(torch.from_numpy(b.exp_avg), torch.from_numpy(a.exp_avg)), n
        assert bits_equal(torch.from_numpy(b.exp_avg_sq), torch.from_numpy(a.exp_avg_sq)), n
        assert bits_equal(torch.from_numpy(b.exp_avg), chain[n][1].reshape(-1)), n
    plain.close()
    staged.close()


def test_torchs_own_clip_grad_norm_works_as_is_by_copying_the_changed_gradients_again(
        daemon, prefix):
    """torch.nn.utils.clip_grad_norm_ rescales .grad in place after backward copied it:
    step() sees the gradient's new version and copies it again, so the step is torch's."""
    plain_model, staged_model = MLP(seed=5), MLP(seed=5)
    plain = RemoteAdamW(plain_model.named_parameters(), lr=1e-2, target=daemon.target,
                        name_prefix=prefix + "plain/")
    staged = RemoteAdamW(staged_model.named_parameters(), lr=1e-2, target=daemon.target,
                         name_prefix=prefix + "staged/", staging="always")
    for step in range(1, 6):
        for model, opt in ((plain_model, plain), (staged_model, staged)):
            opt.zero_grad()
            _backward(model, step, accumulate=1)
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            opt.step()
        for (n, p), q in zip(plain_model.named_parameters(), staged_model.parameters()):
            assert bits_equal(q.detach(), p.detach()), f"{n} at step {step}"
    stats = staged.stats()["staging"]
    assert stats["gradients_copied_at_step"] == 5 * len(_trainable(staged_model))


def test_a_gradient_changed_after_backward_or_replaced_is_what_the_step_uses(daemon, prefix):
    """The early copy never decides what is stepped: a gradient written in place after
    backward, or a new .grad tensor (set by hand), reaches the daemon as it is at step()."""
    p = torch.nn.Parameter(torch.linspace(-1, 1, 64))
    q = torch.nn.Parameter(torch.linspace(-1, 1, 64))
    staged = RemoteAdamW([p], lr=1e-2, target=daemon.target, name_prefix=prefix + "s/",
                         staging="always")
    plain = RemoteAdamW([q], lr=1e-2, target=daemon.target, name_prefix=prefix + "p/")
    (p * p).sum().backward()
    (q * q).sum().backward()
    p.grad.mul_(3.0)  # after the hook copied it
    q.grad.mul_(3.0)
    staged.step()
    plain.step()
    assert bits_equal(p.detach(), q.detach())
    p.grad = torch.full((64,), 0.25)  # a new tensor, never seen by a hook
    q.grad = torch.full((64,), 0.25)
    staged.step()
    plain.step()
    assert bits_equal(p.detach(), q.detach())
    # The same gradient stepped twice without a change: the copy in the slot is reused.
    before = staged.stats()["staging"]["gradients_copied_at_step"]
    staged.step()
    plain.step()
    assert bits_equal(p.detach(), q.detach())
    assert staged.stats()["staging"]["gradients_copied_at_step"] == before
    staged.close()
    plain.close()


def test_in_place_changes_that_move_no_version_counter_are_stepped_as_they_are(
        daemon, prefix):
    """GradScaler's unscale_ (torch._amp_foreach_non_finite_check_and_unscale_), an edit
    through p.grad.data and a copy into p.grad.data (what a collective such as
    dist.all_reduce of p.grad does) change the gradient after backward copied it without
    moving its version counter: step() sees the change by the gradient's fingerprint,
    copies it again, and steps what torch.optim.AdamW steps."""
    plain_model, staged_model = MLP(seed=15), MLP(seed=15)
    plain = RemoteAdamW(plain_model.named_parameters(), lr=1e-2, target=daemon.target,
                        name_prefix=prefix + "plain/")
    staged = RemoteAdamW(staged_model.named_parameters(), lr=1e-2, target=daemon.target,
                         name_prefix=prefix + "staged/", staging="always")
    reference_model = MLP(seed=15)
    reference = torch.optim.AdamW(reference_model.parameters(), lr=1e-2, foreach=False)
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0 ** 16) for _ in range(3)]
    trainable = len(_trainable(staged_model))
    for step in range(1, 7):
        for model, opt, scaler in zip((plain_model, staged_model, reference_model),
                                      (plain, staged, reference), scalers):
            opt.zero_grad()
            x, y = _batch(step, 0)
            scaler.scale(F.mse_loss(model(x), y)).backward()
            versions = None
            if opt is staged:
                # Backward's copies are done before the edits below (on a GPU they
                # usually are: the edits queue behind backward): each edit comes after
                # the copy it makes stale.
                for p in staged_model.parameters():
                    if p.grad is not None:
                        staged._staging._slots[id(p)].grad_copied.synchronize()
                versions = [p.grad._version for p in model.parameters() if p.grad is not None]
            if step % 3 == 1:
                scaler.unscale_(opt)  # as before clipping
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.data.clamp_(-1e-3, 1e-3)
            elif step % 3 == 2:
                scaler.unscale_(opt)
                for p in model.parameters():
                    if p.grad is not None:  # a collective's result written in place
                        p.grad.data.copy_(p.grad * 0.5)
            scaler.step(opt)  # step 3: unscales inside
            scaler.update()
            if versions is not None:
                assert versions == [p.grad._version for p in model.parameters()
                                    if p.grad is not None], "an edit moved a version counter"
        for (n, p), q, r in zip(plain_model.named_parameters(), staged_model.parameters(),
                                reference_model.parameters()):
            assert bits_equal(q.detach(), p.detach()), f"{n} at step {step}"
            assert torch.allclose(q.detach(), r.detach(), rtol=1e-6, atol=1e-7), n
    stats = staged.stats()["staging"]
    assert stats["gradients_changed_in_place"] == 6 * trainable
    assert stats["gradients_copied_at_step"] == 6 * trainable
    staged.close()
    plain.close()


def test_a_16_bit_model_stages_its_own_bytes_and_the_daemon_keeps_fp32_masters(daemon, prefix):
    """bfloat16 parameters: slots of 2 bytes per element for gradient and values; the
    params and the daemon's fp32 master weights equal the plain path's bit for bit."""
    plain_model = MLP(seed=7).to(torch.bfloat16)
    staged_model = copy.deepcopy(plain_model)
    plain = RemoteAdamW(plain_model.named_parameters(), lr=1e-2, target=daemon.target,
                        name_prefix=prefix + "plain/")
    staged = RemoteAdamW(staged_model.named_parameters(), lr=1e-2, target=daemon.target,
                         name_prefix=prefix + "staged/", staging="always")
    for step in range(1, 11):
        for model, opt in ((plain_model, plain), (staged_model, staged)):
            opt.zero_grad()
            for micro in range(MICRO_BATCHES):
                x, y = _batch(step, micro)
                F.mse_loss(model(x.bfloat16()).float(), y).backward()
        plain.clip_grad_norm_(1.0)
        staged.clip_grad_norm_(1.0)
        plain.step()
        staged.step()
        for (n, p), q in zip(plain_model.named_parameters(), staged_model.parameters()):
            assert q.dtype == torch.bfloat16
            assert bits_equal(q.detach(), p.detach()), f"{n} at step {step}"
    masters = {k: v["master_param"] for k, v in plain.state_dict()["state"].items()}
    for k, v in staged.state_dict()["state"].items():
        assert bits_equal(v["master_param"], masters[k]), k
    stats = staged.stats()["staging"]
    assert stats["parameters"] == {prefix + "staged/" + n: 2 * 2 * p.numel()
                                   for n, p in _trainable(staged_model).items()}
    staged.close()
    plain.close()


def test_a_non_finite_gradient_or_norm_refuses_the_whole_staged_step(daemon, prefix):
    """An inf gradient (so an inf norm and a clipping scale of 0, which makes inf * 0 a
    NaN): optstate.InvalidArgument, nothing applied to any parameter, and the step repeats
    with finite gradients."""
    model = MLP(seed=9)
    opt = RemoteAdamW(model.named_parameters(), lr=1e-2, target=daemon.target,
                      name_prefix=prefix, staging="always")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _backward(model, 1)
    model.fc2.weight.grad[0, 0] = float("inf")
    opt.clip_grad_norm_(1.0)
    with pytest.raises(optstate.InvalidArgument, match="not finite"):
        opt.step()
    for n, p in model.named_parameters():
        assert bits_equal(p.detach(), before[n]), n
    opt.zero_grad()
    _backward(model, 1)
    opt.step()
    assert not bits_equal(model.fc2.weight.detach(), before["fc2.weight"])
    opt.close()


def test_a_parameter_frozen_at_registration_gets_slots_when_it_first_has_a_gradient(
        daemon, prefix):
    model = MLP(seed=11)
    opt = RemoteAdamW(model.named_parameters(), lr=1e-2, target=daemon.target,
                      name_prefix=prefix, staging="always")
    assert prefix + "fc1.bias" not in opt.stats()["staging"]["parameters"]
    model.fc1.bias.requires_grad_(True)
    _backward(model, 1)
    opt.step()
    assert opt.stats()["staging"]["parameters"][prefix + "fc1.bias"] == 2 * 4 * 64
    opt.close()


def test_staging_memory_does_not_grow_and_close_releases_it(daemon, prefix):
    model = MLP(seed=13)
    opt = RemoteAdamW(model.named_parameters(), lr=1e-2, target=daemon.target,
                      name_prefix=prefix, staging="always", delete_on_close=True)
    _backward(model, 1)
    opt.step()
    first = opt.stats()["staging"]["bytes"]
    buffers = [weakref.ref(b.memory) for b in opt._staging._buffers]
    for step in range(2, 12):
        opt.zero_grad()
        _backward(model, step)
        opt.step()
    assert opt.stats()["staging"]["bytes"] == first > 0
    opt.close()
    gc.collect()
    assert opt.stats()["staging"]["bytes"] == 0
    assert all(ref() is None for ref in buffers), "a staging buffer outlived close()"
    # The hooks went with it: a backward after close() copies nothing.
    _backward(model, 99)


def test_wait_in_forward_defers_each_modules_wait_to_its_forward(daemon, prefix):
    """With wait_in_forward(model), step() leaves the waits to the modules' forward
    pre-hooks; every parameter's wait is taken by the next forward, and the results equal
    the plain path's."""
    plain_model, staged_model = MLP(seed=17), MLP(seed=17)
    plain = RemoteAdamW(plain_model.named_parameters(), lr=1e-2, target=daemon.target,
                        name_prefix=prefix + "plain/")
    staged = RemoteAdamW(staged_model.named_parameters(), lr=1e-2, target=daemon.target,
                         name_prefix=prefix + "staged/", staging="always")
    staged.wait_in_forward(staged_model)
    slots = staged._staging._slots
    for step in range(1, 4):
        for model, opt in ((plain_model, plain), (staged_model, staged)):
            opt.zero_grad()
            _backward(model, step, accumulate=1)
            opt.step()
        assert all(slot.waiting for slot in slots.values())
        staged_model(torch.zeros(1, 32))
        assert not any(slot.waiting for slot in slots.values())
        for (n, p), q in zip(plain_model.named_parameters(), staged_model.parameters()):
            assert bits_equal(q.detach(), p.detach()), f"{n} at step {step}"
    staged.close()
    plain.close()


def test_staging_refuses_an_unknown_mode_and_other_devices_by_name(daemon, prefix):
    with pytest.raises(ValueError, match="staging must be 'auto'"):
        RemoteAdamW([torch.nn.Parameter(torch.ones(4))], target=daemon.target,
                    name_prefix=prefix, staging="yes")
    with pytest.raises(ValueError, match="dense CPU or CUDA tensors .*meta"):
        RemoteAdamW([torch.nn.Parameter(torch.ones(4, device="meta"))], target=daemon.target,
                    name_prefix=prefix, staging="always")


def _ddp_job(target, prefix, tmp_path, staged, steps):
    import ddp_worker
    return ddp_worker.two_ranks(ddp_worker.run_staged, target, tmp_path, f"staged-{staged}",
                                prefix, steps, staged)


def test_ddp_zero1_staged_through_the_comm_hook_equals_the_plain_path(daemon, prefix, tmp_path):
    """Two gloo ranks, DDP with bucket views, ZeRO-1, accumulation under no_sync, clipping:
    the staged job (gradients copied in RemoteAdamW's comm hook once all-reduced, the clip
    as grad_scale) gives every rank the plain job's params bit for bit after every step;
    each owned gradient was copied once per step, in the hook (never for the no_sync
    micro-batch, never again at step())."""
    steps = 8
    plain = _ddp_job(daemon.target, prefix + "plain/", tmp_path, False, steps)
    staged = _ddp_job(daemon.target, prefix + "staged/", tmp_path, True, steps)
    for rank in range(2):
        for step in range(steps):
            for n, p in plain[rank]["params"][step].items():
                assert bits_equal(staged[rank]["params"][step][n], p), (rank, step, n)
        stats, owned = staged[rank]["stats"], staged[rank]["owned"]
        assert owned, f"rank {rank} steps nothing"
        assert stats["gradients_copied_early"] == steps * len(owned), (rank, stats)
        assert stats["gradients_copied_at_step"] == 0, (rank, stats)
    assert set(staged[0]["owned"]).isdisjoint(staged[1]["owned"])
    first = plain[0]["params"][0]
    assert any(not bits_equal(plain[0]["params"][-1][n], first[n]) for n in first)
