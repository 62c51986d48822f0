"""RemoteAdamW(shard=True) under torch.distributed: 2 processes, gloo, DDP. Each rank
steps its contiguous, balanced share of the parameters and broadcasts the results; the
final params equal a single-process torch.optim.AdamW on the averaged gradients."""
import torch
import torch.multiprocessing as mp

import ddp_worker
import optstate
from reference import bits_equal, compare_to_torch_step, ieee_adamw_

STEPS = 8


def test_two_gloo_ranks_sharded_match_torch_on_the_averaged_gradients(daemon, prefix, tmp_path):
    init_file = tmp_path / "init"
    outs = [str(tmp_path / f"rank{r}.pt") for r in range(2)]
    processes = []
    ctx = mp.get_context("spawn")
    for rank in range(2):
        proc = ctx.Process(target=ddp_worker.run,
                           args=(rank, 2, str(init_file), daemon.target, prefix, outs[rank], STEPS))
        proc.start()
        processes.append(proc)
    for proc in processes:
        proc.join(timeout=120)
        assert proc.exitcode == 0, f"a rank failed (exit code {proc.exitcode})"
    ranks = [torch.load(o) for o in outs]
    names = ranks[0]["names"]
    # Contiguous shares, every parameter owned by exactly one rank, both ranks stepping.
    owned = ranks[0]["owned"] + ranks[1]["owned"]
    assert owned == names and ranks[0]["owned"] and ranks[1]["owned"]
    print("rank 0 steps", ranks[0]["owned"], "rank 1 steps", ranks[1]["owned"])
    client = optstate.Client(daemon.target)
    model = ddp_worker.MLP(seed=0)
    params = dict(model.named_parameters())
    ref = torch.optim.AdamW(list(params.values()), lr=1e-2)
    chain = {n: [p.detach().clone(), torch.zeros_like(p), torch.zeros_like(p)]
             for n, p in params.items()}
    for step in range(1, STEPS + 1):
        grads = ranks[0]["grads"][step - 1]
        for n in grads:  # DDP gave both ranks the same averaged gradients
            assert bits_equal(grads[n], ranks[1]["grads"][step - 1][n]), n
        before = ranks[0]["before"][step - 1]
        for r in (0, 1):  # and both ranks the same params after every step
            assert all(bits_equal(before[n], ranks[r]["before"][step - 1][n]) for n in names)
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(before[n])
                p.grad = grads.get(n)
        ref.step()
        after = ranks[0]["before"][step] if step < STEPS else ranks[0]["final"]
        for n, p in params.items():
            if n not in grads:
                assert bits_equal(after[n], before[n]), n  # frozen
                continue
            ieee_adamw_(chain[n][0], grads[n], chain[n][1], chain[n][2], step, 1e-2)
            assert bits_equal(after[n], chain[n][0]), f"{n} at step {step}"
            compare_to_torch_step(f"step {step} {n}", after[n], p.detach(), before[n],
                                  ref.state[p]["exp_avg_sq"], quiet=step < STEPS)
    for n, p in params.items():
        assert bits_equal(ranks[1]["final"][n], ranks[0]["final"][n]), n
        if n in ranks[0]["grads"][0]:
            state = client.export_state(prefix + n)
            assert set(state.page_steps.tolist()) == {STEPS}
            assert bits_equal(torch.from_numpy(state.exp_avg).reshape(p.shape),
                              ref.state[p]["exp_avg"]), n
            assert bits_equal(torch.from_numpy(state.exp_avg_sq).reshape(p.shape),
                              ref.state[p]["exp_avg_sq"]), n
