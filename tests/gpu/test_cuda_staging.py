"""RemoteAdamW with CUDA parameters (pytest; needs a GPU: tests/gpu/run.sh runs it with the
rest of the GPU checks, OPTSTATED set to the daemon binary). The staging logic itself is
tested on the CPU in tests/python/test_staging.py; these are the parts only a GPU has:
side-stream copies ordered by events, pinned and cudaHostRegister-ed slots, the values
copied back before the next forward reads them, and no growth of GPU or host memory."""
import os
import re
import subprocess
import sys
import weakref

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from models import MLP  # noqa: E402
from reference import bits_equal  # noqa: E402

import optstate  # noqa: E402
from optstate.torch import RemoteAdamW  # noqa: E402

if not torch.cuda.is_available():
    if os.environ.get("OPTSTATE_REQUIRE_GPU"):
        raise RuntimeError("OPTSTATE_REQUIRE_GPU is set and torch sees no CUDA device")
    pytest.skip("no CUDA device", allow_module_level=True)

CUDA = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def daemon():
    binary = os.environ["OPTSTATED"]
    process = subprocess.Popen([binary, "--listen=127.0.0.1:0", "--log_level=warning",
                                "--backend=cpu"], stdout=subprocess.PIPE, text=True)
    port = re.search(r"listening on port (\d+)", process.stdout.readline()).group(1)
    yield f"127.0.0.1:{port}"
    process.terminate()
    assert process.wait(timeout=20) == 0


def _batch(step, micro, device):
    gen = torch.Generator().manual_seed(1000 * step + micro)
    return (torch.randn(16, 32, generator=gen).to(device),
            torch.randn(16, 10, generator=gen).to(device))


@pytest.mark.parametrize("data_plane,kind", [("shared_memory", "shared_buffer"),
                                             ("wire", "pinned")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_parameters_step_as_the_cpu_path_given_the_same_gradients(daemon, data_plane,
                                                                       kind, dtype):
    """50 steps of a CUDA model (two micro-batches, opt.clip_grad_norm_, LambdaLR) against
    a CPU copy stepped by the plain path with the CUDA gradients and the same clipping
    coefficient: equal bit for bit after every step. GPU memory does not grow after the
    first step; the slots' memory is released by close()."""
    prefix = f"cuda-{data_plane}-{dtype}/".replace("torch.", "")
    gpu_model = MLP(seed=3).to(CUDA, dtype)
    cpu_model = MLP(seed=3).to(dtype)
    staged = RemoteAdamW(gpu_model.named_parameters(), lr=1e-2, target=daemon,
                         name_prefix=prefix + "gpu/", data_plane=data_plane,
                         delete_on_close=True)
    plain = RemoteAdamW(cpu_model.named_parameters(), lr=1e-2, target=daemon,
                        name_prefix=prefix + "cpu/", delete_on_close=True)
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, lambda e: 0.97 ** e)
                 for o in (staged, plain)]
    allocated = None
    for step in range(1, 51):
        staged.zero_grad()
        for micro in range(2):
            x, y = _batch(step, micro, CUDA)
            (F.mse_loss(gpu_model(x.to(dtype)).float(), y) / 2).backward()
        norm = staged.clip_grad_norm_(0.05)
        scale = torch.clamp(0.05 / (norm + 1e-6), max=1.0).cpu()
        for p, q in zip(gpu_model.parameters(), cpu_model.parameters()):
            q.grad = None if p.grad is None else p.grad.cpu()
        plain._grad_scale = scale  # the same coefficient, as the daemon's grad_scale
        staged.step()
        plain.step()
        for s in schedules:
            s.step()
        for (n, p), q in zip(gpu_model.named_parameters(), cpu_model.parameters()):
            assert bits_equal(p.detach().cpu(), q.detach()), f"{n} at step {step}"
        if step == 2:
            allocated = torch.cuda.memory_allocated()
        elif step > 2:
            assert torch.cuda.memory_allocated() == allocated, step
    stats = staged.stats()["staging"]
    assert stats["kinds"] == [kind]
    assert stats["gradients_copied_at_step"] == 0  # every copy overlapped with backward
    buffers = [weakref.ref(b.memory) for b in staged._staging._buffers]
    staged.close()
    plain.close()
    assert all(r() is None for r in buffers)


def test_grad_scaler_unscales_in_place_and_the_step_sees_it(daemon):
    """fp16 autocast with torch.amp.GradScaler on CUDA: unscale_ (explicit, for clipping,
    or inside scaler.step) divides .grad in place on the device with no version change,
    after backward's early copies; step() sees the changed fingerprints, copies again, and
    steps what a CPU copy stepped with the unscaled gradients steps, bit for bit."""
    gpu_model = MLP(seed=21).to(CUDA)
    cpu_model = MLP(seed=21)
    staged = RemoteAdamW(gpu_model.named_parameters(), lr=1e-2, target=daemon,
                         name_prefix="cuda-scaler/gpu/", delete_on_close=True)
    plain = RemoteAdamW(cpu_model.named_parameters(), lr=1e-2, target=daemon,
                        name_prefix="cuda-scaler/cpu/", delete_on_close=True)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 16)
    for step in range(1, 11):
        staged.zero_grad()
        x, y = _batch(step, 0, CUDA)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.mse_loss(gpu_model(x).float(), y)
        scaler.scale(loss).backward()
        torch.cuda.synchronize()  # backward's copies done: unscale_ makes them stale
        if step % 2:
            scaler.unscale_(staged)
            torch.nn.utils.clip_grad_value_(gpu_model.parameters(), 1e-3)
        skipped_before = scaler.get_scale()
        scaler.step(staged)  # unscales here on even steps
        scaler.update()
        for p, q in zip(gpu_model.parameters(), cpu_model.parameters()):
            q.grad = None if p.grad is None else p.grad.cpu()  # unscaled by now
        if scaler.get_scale() >= skipped_before:  # the scaler did not skip this step
            plain.step()
        for (n, p), q in zip(gpu_model.named_parameters(), cpu_model.parameters()):
            assert bits_equal(p.detach().cpu(), q.detach()), f"{n} at step {step}"
    assert staged.stats()["staging"]["gradients_changed_in_place"] > 0
    staged.close()
    plain.close()


def test_the_next_forward_reads_the_new_values_without_a_host_synchronize(daemon):
    """step() returns with the values' copies queued on the side stream; a forward launched
    right after (stream-ordered by the event wait, default or wait_in_forward) sees the
    new values."""
    for deferred in (False, True):
        model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).to(CUDA)
        opt = RemoteAdamW(model.named_parameters(), lr=1e-1, target=daemon,
                          name_prefix=f"forward-{deferred}/", delete_on_close=True)
        if deferred:
            opt.wait_in_forward(model)
        x = torch.randn(64, 1024, device=CUDA)
        for _ in range(3):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            out = model(x)  # queued behind the copies, not after a synchronize
            with torch.no_grad():
                expected = x
                for layer in model:  # the values the daemon returned
                    state = opt.client.export_state(opt._staging._slots[id(layer.weight)].name)
                    w = torch.from_numpy(state.params).reshape(layer.weight.shape).to(CUDA)
                    b = torch.from_numpy(opt.client.export_state(
                        opt._staging._slots[id(layer.bias)].name).params).to(CUDA)
                    expected = F.linear(expected, w, b)
            assert bits_equal(out.detach(), expected), deferred
        opt.close()


def test_zero1_on_one_nccl_rank_broadcasts_on_the_device(daemon, tmp_path):
    """shard=True under NCCL (one rank: the machine has one GPU): the owner's values come
    back through the slots and the broadcast is ordered after their copy."""
    import torch.distributed as dist
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/init", rank=0,
                            world_size=1)
    try:
        model = MLP(seed=1).to(CUDA)
        reference = MLP(seed=1)
        opt = RemoteAdamW(model.named_parameters(), lr=1e-2, target=daemon, name_prefix="z1/",
                          shard=True, delete_on_close=True)
        plain = RemoteAdamW(reference.named_parameters(), lr=1e-2, target=daemon,
                            name_prefix="z1-cpu/", delete_on_close=True)
        for step in range(1, 6):
            opt.zero_grad()
            x, y = _batch(step, 0, CUDA)
            F.mse_loss(model(x), y).backward()
            for p, q in zip(model.parameters(), reference.parameters()):
                q.grad = None if p.grad is None else p.grad.cpu()
            opt.step()
            plain.step()
            for p, q in zip(model.parameters(), reference.parameters()):
                assert bits_equal(p.detach().cpu(), q.detach())
        opt.close()
        plain.close()
    finally:
        dist.destroy_process_group()
