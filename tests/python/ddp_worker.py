"""One rank of the DDP tests (test_distributed.py, test_jobs.py, test_scale_out.py,
test_staging.py), started with the spawn method; two_ranks starts them."""
import faulthandler
import gc

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from models import MLP
from optstate.torch import RemoteAdamW


def start_rank():
    """A rank that dies of a signal (abort, segfault) prints every thread's Python stack
    first, so the test's captured stderr says where it died."""
    faulthandler.enable(all_threads=True)
    torch.set_num_threads(1)


def end_rank():
    """Ends the rank's process group while the interpreter is alive; the caller has dropped
    its DDP module and optimizer first. Both hold the group, the module in reference cycles
    that only the collector frees; a gloo group that outlives destroy_process_group() so is
    destroyed during interpreter exit, and a finished work that its threads still hold then
    takes the GIL of a finalizing interpreter: SIGABRT, "terminate called without an active
    exception" (torch 2.15, about one run in a hundred under load)."""
    gc.collect()
    dist.destroy_process_group()


def run(rank, world, init_file, target, prefix, out_path, steps):
    start_rank()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    model = MLP(seed=0)  # the same initial weights on every rank
    ddp = DistributedDataParallel(model)
    opt = RemoteAdamW(model.named_parameters(), target=target, name_prefix=prefix, lr=1e-2,
                      shard=True)
    names = [n for n, _ in model.named_parameters()]
    record = {"owned": [n for n, p in model.named_parameters() if opt._owner[id(p)] == rank],
              "before": [], "grads": []}
    for step in range(1, steps + 1):
        gen = torch.Generator().manual_seed(100 * step + rank)  # each rank its own batch
        x, y = torch.randn(64, 32, generator=gen), torch.randn(64, 10, generator=gen)
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()  # DDP averages the gradients over the ranks
        record["before"].append({n: p.detach().clone() for n, p in model.named_parameters()})
        record["grads"].append({n: p.grad.clone() for n, p in model.named_parameters()
                                if p.grad is not None})
        opt.step()
    record["final"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    record["names"] = names
    torch.save(record, out_path)
    del ddp, opt
    end_rank()


def run_resumed(rank, world, init_file, target, prefix, out_path, first, last):
    """A rank of a sharded job restarted after step first - 1: a freshly initialised model
    (other weights on each rank, but for the frozen ones), RemoteAdamW(shard=True,
    resume="daemon"), then steps first..last with run()'s batches."""
    start_rank()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    model = MLP(seed=50 + rank)
    with torch.no_grad():  # frozen parameters come from where they came from (pretrained)
        for p, q in zip(model.parameters(), MLP(seed=0).parameters()):
            if not p.requires_grad:
                p.copy_(q)
    ddp = DistributedDataParallel(model)
    opt = RemoteAdamW(model.named_parameters(), target=target, name_prefix=prefix, lr=1e-2,
                      shard=True, resume="daemon", takeover=True)
    record = {"resumed": {n: p.detach().clone() for n, p in model.named_parameters()}}
    for step in range(first, last + 1):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(64, 32, generator=gen), torch.randn(64, 10, generator=gen)
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        opt.step()
    record["final"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.save(record, out_path)
    del ddp, opt
    end_rank()


def run_torn(rank, world, init_file, target, prefix, out_path, finish, grads_path, last):
    """A rank of a sharded job restarted after a torn step k (one rank's share at k, the
    other's at k - 1): RemoteAdamW(shard=True, resume="daemon", finish_torn_step=finish).
    Records the refusal, if any; else finishes step k with step k's gradients (saved at
    grads_path, by parameter name), then steps k + 1..last with run()'s batches."""
    start_rank()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    model = MLP(seed=50 + rank)
    with torch.no_grad():
        for p, q in zip(model.parameters(), MLP(seed=0).parameters()):
            if not p.requires_grad:
                p.copy_(q)
    ddp = DistributedDataParallel(model)
    try:
        opt = RemoteAdamW(model.named_parameters(), target=target, name_prefix=prefix,
                          lr=1e-2, shard=True, resume="daemon", takeover=True,
                          finish_torn_step=finish)
    except Exception as e:  # every rank must refuse, or none
        torch.save({"refused": str(e)}, out_path)
        del ddp
        end_rank()
        return
    torn = opt.resumed_step
    grads = torch.load(grads_path)
    for n, p in model.named_parameters():
        p.grad = grads[n].clone() if n in grads else None
    opt.step()  # finishes step `torn`: only the groups behind are stepped
    for step in range(torn + 1, last + 1):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(64, 32, generator=gen), torch.randn(64, 10, generator=gen)
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        opt.step()
    torch.save({"final": {n: p.detach().clone() for n, p in model.named_parameters()}},
               out_path)
    del ddp, opt
    end_rank()


def run_nonfinite(rank, world, init_file, target, prefix, out_path, poisoned):
    """A rank of a sharded job whose step 2 gradient of parameter `poisoned` (stepped by
    one rank) is NaN on every rank: each rank records step()'s refusal, the steps every
    group is at then, and goes on to step 2 with finite gradients and step 3."""
    import optstate
    start_rank()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    model = MLP(seed=0)
    ddp = DistributedDataParallel(model)
    opt = RemoteAdamW(model.named_parameters(), target=target, name_prefix=prefix, lr=1e-2,
                      shard=True)
    record = {"owner": {n: opt._owner[id(p)] for n, p in model.named_parameters()}}
    for step in (1, 2, 2, 3):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(64, 32, generator=gen), torch.randn(64, 10, generator=gen)
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        if step == 2 and "refused" not in record:
            dict(model.named_parameters())[poisoned].grad[0, 0] = float("nan")
            try:
                opt.step()
            except optstate.InvalidArgument as e:
                record["refused"] = str(e)
            record["steps"] = {g.name: (g.min_step, g.max_step)
                               for g in opt.client.list_groups()}
            continue
        opt.step()
    record["final"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.save(record, out_path)
    del ddp, opt
    end_rank()


def run_share_unreachable(rank, world, init_file, target, prefix, out_path, steps, failing):
    """A rank of a sharded job (`run`'s model, data and steps) whose rank 1 reaches the
    daemon through a proxy of its own, which refuses every connection during step
    `failing`'s first try: rank 1's share fails there (Unavailable) while rank 0's is
    applied. Each rank records step()'s error, then, once the proxy forwards again, calls
    step() again with the same gradients, as that error says, and steps on."""
    import optstate
    from cutting_proxy import CuttingProxy
    start_rank()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    proxy = CuttingProxy(int(target.rsplit(":", 1)[1])) if rank == 1 else None
    model = MLP(seed=0)
    ddp = DistributedDataParallel(model)
    opt = RemoteAdamW(model.named_parameters(), target=proxy.target if proxy else target,
                      name_prefix=prefix, lr=1e-2, shard=True, max_attempts=2,
                      reconnect_timeout=0.5)
    record = {"owned": [n for n, p in model.named_parameters() if opt._owner[id(p)] == rank]}
    for step in range(1, steps + 1):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(64, 32, generator=gen), torch.randn(64, 10, generator=gen)
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        if step == failing:
            if proxy is not None:
                proxy.refuse(True)
            try:
                opt.step()
            except optstate.Error as e:
                record["error"] = (type(e).__name__, str(e))
            dist.barrier()  # both ranks answered: neither waits in a broadcast
            if proxy is not None:
                proxy.refuse(False)
        opt.step()
    record["final"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.save(record, out_path)
    del ddp, opt
    end_rank()


def run_bad_lr(rank, world, init_file, target, prefix, out_path):
    """A rank of a sharded job in two param groups (fc1's, which rank 0 steps, and the
    rest, rank 1's), whose step 2 sets the second group's lr to -1e-3 on every rank: each
    records step()'s refusal and the steps every group is at then, sets lr back and goes
    on to step 2 and step 3."""
    import optstate
    start_rank()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    model = MLP(seed=0)
    ddp = DistributedDataParallel(model)
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if n.startswith("fc1.")]},
              {"params": [p for n, p in named if not n.startswith("fc1.")]}]
    opt = RemoteAdamW(groups, target=target, name_prefix=prefix, lr=1e-2, shard=True)
    record = {"owner": {n: opt._owner[id(p)] for n, p in named}}
    for step in (1, 2, 2, 3):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(64, 32, generator=gen), torch.randn(64, 10, generator=gen)
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        if step == 2 and "refused" not in record:
            opt.param_groups[1]["lr"] = -1e-3
            try:
                opt.step()
            except optstate.InvalidArgument as e:
                record["refused"] = str(e)
            opt.param_groups[1]["lr"] = 1e-2
            record["steps"] = {g.name: (g.min_step, g.max_step)
                               for g in opt.client.list_groups()}
            continue
        opt.step()
    record["final"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.save(record, out_path)
    del ddp, opt
    end_rank()


def run_listed_apart(rank, world, init_file, target, prefix, out_path):
    """A rank of a sharded job whose rank 1 lists the parameters in another order (as a
    set() of them may): records the construction's error on each rank."""
    start_rank()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    model = MLP(seed=0)
    named = list(model.named_parameters())
    if rank == 1:
        named = named[2:] + named[:2]
    record = {}
    try:
        RemoteAdamW(named, target=target, name_prefix=prefix, lr=1e-2, shard=True)
    except ValueError as e:
        record["refused"] = str(e)
    torch.save(record, out_path)
    end_rank()


def run_stage(rank, world, init_file, target, prefix, out_path, seed):
    """A rank of a model-parallel job: its own stage (a Linear of `seed` + rank) under
    prefix + "stage<rank>/", no DDP, no shard. Records the stage's values and the
    daemon's after construction."""
    import optstate
    start_rank()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    torch.manual_seed(seed + rank)
    stage = torch.nn.Linear(16, 16)
    opt = RemoteAdamW(stage.named_parameters(), target=target, lr=1e-2,
                      name_prefix=f"{prefix}stage{rank}/")
    client = optstate.Client(target, data_plane="wire")
    record = {"values": {n: p.detach().clone() for n, p in stage.named_parameters()},
              "daemon": {n: torch.from_numpy(client.export_state(f"{prefix}stage{rank}/{n}")
                                             .params).reshape(p.shape)
                         for n, p in stage.named_parameters()}}
    torch.save(record, out_path)
    opt.close()
    del opt
    end_rank()


def run_wrapped(rank, world, init_file, target, prefix, out_path, steps):
    """A rank of test_jobs.py's DDP job: the optimizer over the DDP module's names
    (module.*), without shard (both ranks step every group under the job's one lease)."""
    start_rank()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    model = MLP(seed=0)
    ddp = DistributedDataParallel(model)
    opt = RemoteAdamW(ddp.named_parameters(), target=target, name_prefix=prefix, lr=1e-2)
    for step in range(1, steps + 1):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(64, 32, generator=gen), torch.randn(64, 10, generator=gen)
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        opt.step()
    torch.save({"final": {n: p.detach().clone() for n, p in model.named_parameters()},
                "holder": opt.lease_holder}, out_path)
    del ddp, opt
    end_rank()


def run_staged(rank, world, init_file, target, prefix, out_path, steps, staged):
    """A rank of test_staging.py's DDP job: ZeRO-1 (shard=True), two micro-batches per step
    (the first under no_sync), clipping; `staged`: the parameters go through host slots
    (staging="always"), their gradients copied by RemoteAdamW's DDP comm hook and clipped
    by the daemon's grad_scale; else the plain path with DDP's own all-reduce and torch's
    clip_grad_norm_."""
    import optstate._staging
    optstate._staging.HOST_COPY_DELAY_S = 0.001  # as test_staging.py's slow_copies
    start_rank()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    model = MLP(seed=0)
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True, bucket_cap_mb=0.004)
    opt = RemoteAdamW(model.named_parameters(), target=target, name_prefix=prefix, lr=1e-2,
                      shard=True, staging="always" if staged else "auto")
    if staged:
        opt.register_ddp_comm_hook(ddp)
    params = []
    for step in range(1, steps + 1):
        opt.zero_grad()
        for micro in range(2):
            gen = torch.Generator().manual_seed(100 * step + 10 * micro + rank)
            x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 10, generator=gen)
            if micro == 0:
                with ddp.no_sync():
                    (F.mse_loss(ddp(x), y) / 2).backward()
            else:
                (F.mse_loss(ddp(x), y) / 2).backward()
        if staged:
            opt.clip_grad_norm_(0.05)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
        params.append({n: p.detach().clone() for n, p in model.named_parameters()})
    torch.save({"params": params, "stats": opt.stats()["staging"],
                "owned": [n for n, p in model.named_parameters()
                          if opt._owner[id(p)] == rank and p.requires_grad]}, out_path)
    opt.close()
    del ddp, opt
    end_rank()


def two_ranks(fn, target, tmp_path, tag, prefix, *args):
    """Runs fn(rank, 2, init_file, target, prefix, out_path, *args) in two spawned
    processes (gloo meets through a file under tmp_path); each must exit 0. Their records
    (out_path's), by rank."""
    import torch.multiprocessing as mp
    outs = [str(tmp_path / f"{tag}-rank{r}.pt") for r in range(2)]
    ctx = mp.get_context("spawn")
    processes = [ctx.Process(target=fn, args=(r, 2, str(tmp_path / f"{tag}-init"), target,
                                              prefix, outs[r], *args))
                 for r in range(2)]
    for proc in processes:
        proc.start()
    for proc in processes:
        proc.join(timeout=180)
        assert proc.exitcode == 0, f"a rank failed (exit code {proc.exitcode})"
    return [torch.load(o) for o in outs]
