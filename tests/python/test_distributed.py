"""RemoteAdamW(shard=True) under torch.distributed: 2 processes, gloo, DDP. Each rank
steps its contiguous, balanced share of the parameters and broadcasts the results; the
final params equal a single-process torch.optim.AdamW on the averaged gradients."""
import time

import pytest
import torch

import ddp_worker
import optstate
from optstate.torch import RemoteAdamW
from reference import bits_equal, compare_to_torch_step, ieee_adamw_

STEPS = 8


def test_two_gloo_ranks_sharded_match_torch_on_the_averaged_gradients(daemon, prefix, tmp_path):
    ranks = ddp_worker.two_ranks(ddp_worker.run, daemon.target, tmp_path, "job", prefix, STEPS)
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
    # Each group's gradient came from one rank only: its initial values and STEPS gradients.
    received = {g["info"]["name"]: g["bytes_received"] for g in client.stats()["groups"]}
    for n, p in params.items():
        stepped = n in ranks[0]["grads"][0]
        assert received[prefix + n] == 4 * p.numel() * (1 + (STEPS if stepped else 0)), n
    for n, p in params.items():
        assert bits_equal(ranks[1]["final"][n], ranks[0]["final"][n]), n
        if n in ranks[0]["grads"][0]:
            state = client.export_state(prefix + n)
            assert set(state.page_steps.tolist()) == {STEPS}
            assert bits_equal(torch.from_numpy(state.exp_avg).reshape(p.shape),
                              ref.state[p]["exp_avg"]), n
            assert bits_equal(torch.from_numpy(state.exp_avg_sq).reshape(p.shape),
                              ref.state[p]["exp_avg_sq"]), n


def test_without_shard_every_rank_steps_every_group_and_the_later_ones_replay(daemon, client,
                                                                              prefix):
    """Two data-parallel ranks without shard=True (simulated in one process: two optimizers
    over the same group names, the same averaged gradients): the first rank's step applies,
    the second's replays and gets the same params back; every rank sent the whole gradient."""
    gen = torch.Generator().manual_seed(4)
    initial = torch.randn(5000, generator=gen)
    ranks = [torch.nn.Parameter(initial.clone()) for _ in range(2)]
    # The ranks of one job share its lease holder (RemoteAdamW broadcasts rank 0's id
    # under torch.distributed; here, one process, it is given).
    opts = [RemoteAdamW([("w", p)], target=daemon.target, name_prefix=prefix,
                        lease_holder=f"{prefix}holder".replace("/", "_")) for p in ranks]
    p_ref, m_ref, v_ref = initial.clone(), torch.zeros(5000), torch.zeros(5000)
    for step in range(1, 4):
        g = torch.randn(5000, generator=gen)
        ieee_adamw_(p_ref, g, m_ref, v_ref, step, 1e-3)
        for p, opt in zip(ranks, opts):
            p.grad = g.clone()
            opt.step()
        assert bits_equal(ranks[0].detach(), p_ref) and bits_equal(ranks[1].detach(), p_ref)
    group = {g["info"]["name"]: g for g in client.stats()["groups"]}[prefix + "w"]
    assert (group["chunks_applied"], group["chunks_replayed"]) == (3, 3)
    assert group["bytes_received"] == 4 * 5000 * (1 + 2 * 3)  # initial values, 6 gradients


def test_a_rank_that_stepped_a_parameter_fewer_times_hears_why(daemon, prefix):
    """Two data-parallel ranks without shard=True (one process, as above) where rank 0's
    parameter had no gradient at step 2 (None on that rank only): its step 3 named a step
    the daemon's group had passed, in the daemon's words alone ("a replay must name the
    page's current step"), at every later step. The error now says what put the ranks
    apart and the ways on."""
    gen = torch.Generator().manual_seed(5)
    initial = torch.randn(300, generator=gen)
    ranks = [torch.nn.Parameter(initial.clone()) for _ in range(2)]
    opts = [RemoteAdamW([("w", p)], target=daemon.target, name_prefix=prefix,
                        lease_holder=f"{prefix}holder".replace("/", "_")) for p in ranks]
    for step in range(1, 4):
        g = torch.randn(300, generator=gen)
        for rank in (1, 0):  # rank 1 steps first
            ranks[rank].grad = None if (step == 2 and rank == 0) else g.clone()
            if step == 3 and rank == 0:
                with pytest.raises(optstate.FailedPrecondition) as apart:
                    opts[rank].step()
                message = str(apart.value)
                assert "is already at step 3, past step 2" in message, message
                assert "stepped that group's parameter to step 1 only" in message, message
                assert "None on some ranks only" in message and "shard=True" in message
                continue
            opts[rank].step()


def test_a_sharded_job_resumed_from_the_daemon_continues_bit_identical(fresh_daemons, tmp_path):
    # Each rank took the daemon's values of its own share only: the others kept the fresh
    # initial values, so the first forward pass after the restart ran on a mixed model
    # (params off by up to 0.0108 three steps later).
    daemon = fresh_daemons("--lease_seconds=1")
    alone = ddp_worker.two_ranks(ddp_worker.run, daemon.target, tmp_path, "alone", "alone.", 7)
    ddp_worker.two_ranks(ddp_worker.run, daemon.target, tmp_path, "first", "job.", 4)
    time.sleep(1.2)  # the dead ranks' lease expires
    resumed = ddp_worker.two_ranks(ddp_worker.run_resumed, daemon.target, tmp_path, "resumed",
                                   "job.", 5, 7)
    for rank in (0, 1):
        for name, value in alone[rank]["before"][4].items():  # the values step 5 starts from
            assert bits_equal(resumed[rank]["resumed"][name], value), (rank, name)
        for name, value in alone[rank]["final"].items():
            assert bits_equal(resumed[rank]["final"][name], value), (rank, name)


def test_a_torn_step_of_a_sharded_job_is_the_jobs_refused_or_finished_on_every_rank(
        fresh_daemons, tmp_path):
    # Step 4 reached rank 0's share of the groups and none of rank 1's. Each rank judged
    # its own share: rank 0's all at step 4, rank 1's all at 3, so neither saw a torn
    # step; rank 0 stepped on from 4 and rank 1 from 3, and the job was split for good.
    daemon = fresh_daemons("--lease_seconds=1")
    alone = ddp_worker.two_ranks(ddp_worker.run, daemon.target, tmp_path, "alone", "alone.", 7)
    ddp_worker.two_ranks(ddp_worker.run, daemon.target, tmp_path, "first", "job.", 3)
    time.sleep(1.2)  # the dead ranks' lease expires: the plain client below takes none
    grads = alone[0]["grads"][3]  # step 4's (DDP-averaged: every rank's the same)
    torch.save(grads, tmp_path / "step4-grads.pt")
    client = optstate.Client(daemon.target, data_plane="wire")
    share = [n for n in alone[0]["owned"] if n in grads]
    client.step([("job." + n, grads[n]) for n in share], 4)
    steps = {g.name: g.max_step for g in client.list_groups() if g.name.startswith("job.")}
    assert {steps["job." + n] for n in share} == {4} and 3 in steps.values(), steps
    refused = ddp_worker.two_ranks(ddp_worker.run_torn, daemon.target, tmp_path, "refused",
                                   "job.", False, str(tmp_path / "step4-grads.pt"), 7)
    for rank in (0, 1):
        assert "stopped part-way through step 4" in refused[rank].get("refused", ""), rank
    time.sleep(1.2)
    finished = ddp_worker.two_ranks(ddp_worker.run_torn, daemon.target, tmp_path, "finished",
                                    "job.", True, str(tmp_path / "step4-grads.pt"), 7)
    for rank in (0, 1):
        for name, value in alone[rank]["final"].items():
            assert bits_equal(finished[rank]["final"][name], value), (rank, name)


def test_a_gradient_that_is_not_finite_refuses_the_sharded_step_on_every_rank(daemon, tmp_path):
    # The rank owning the poisoned parameter was refused; the other had applied its share
    # already (a torn step), then waited for the first at the broadcast: a hang.
    alone = ddp_worker.two_ranks(ddp_worker.run, daemon.target, tmp_path, "alone",
                                 "nan-alone.", 3)
    poisoned = "fc2.weight"
    out = ddp_worker.two_ranks(ddp_worker.run_nonfinite, daemon.target, tmp_path, "nan",
                               "nan.", poisoned)
    owner = out[0]["owner"][poisoned]
    assert "'nan.fc2.weight' is not finite" in out[owner]["refused"]
    assert "another rank's share" in out[1 - owner]["refused"]
    for rank in (0, 1):
        assert {s for n, s in out[rank]["steps"].items()
                if n.startswith("nan.") and s[1] > 0} == {(1, 1)}, out[rank]["steps"]
        for name, value in alone[rank]["final"].items():
            assert bits_equal(out[rank]["final"][name], value), (rank, name)


def test_one_ranks_share_failing_at_the_daemon_fails_the_sharded_step_on_every_rank(
        daemon, tmp_path):
    # Rank 1's share could not reach the daemon (Unavailable); rank 0's was applied, and
    # rank 0 then waited in the broadcast for rank 1, whose step() again (as its error
    # says) waited in the next step's agreement: both hung until gloo's timeout. Now every
    # rank raises, and step() again on every rank replays rank 0's share and applies rank
    # 1's: the run ends as one that never failed.
    alone = ddp_worker.two_ranks(ddp_worker.run, daemon.target, tmp_path, "whole",
                                 "unreached-alone.", 4)
    out = ddp_worker.two_ranks(ddp_worker.run_share_unreachable, daemon.target, tmp_path,
                               "unreached", "unreached.", 4, 3)
    assert out[0]["owned"] and out[1]["owned"]
    assert out[1]["error"][0] == "Unavailable", out[1]["error"]
    assert out[0]["error"][0] == "Unavailable", out[0]["error"]
    assert "another rank's share of this step failed" in out[0]["error"][1]
    assert "Call step() again on every rank" in out[0]["error"][1]
    for rank in (0, 1):
        for name, value in alone[rank]["final"].items():
            assert bits_equal(out[rank]["final"][name], value), (rank, name)


def test_model_parallel_stages_run_again_before_their_first_step_take_their_own_values(
        daemon, tmp_path):
    # Ranks without shard=True left the import of an untrained job's values to rank 0,
    # taking them for data-parallel replicas: a pipeline's other stages stepped from the
    # previous run's weights.
    ddp_worker.two_ranks(ddp_worker.run_stage, daemon.target, tmp_path, "first", "pipe/", 1)
    again = ddp_worker.two_ranks(ddp_worker.run_stage, daemon.target, tmp_path, "again",
                                 "pipe/", 7)
    for rank in (0, 1):
        for name, value in again[rank]["values"].items():
            assert bits_equal(again[rank]["daemon"][name], value), (rank, name)


def test_hyperparameters_one_ranks_share_refuses_refuse_the_sharded_step_on_every_rank(
        daemon, tmp_path):
    # An lr of -1e-3 in the param group rank 1 steps: rank 1 was refused by the daemon,
    # rank 0 had applied its share (a torn step) and waited at the broadcast (a hang).
    alone = ddp_worker.two_ranks(ddp_worker.run, daemon.target, tmp_path, "alone",
                                 "lr-alone.", 3)
    out = ddp_worker.two_ranks(ddp_worker.run_bad_lr, daemon.target, tmp_path, "lr", "lr.")
    assert out[0]["owner"]["fc1.weight"] == 0 and out[0]["owner"]["fc2.weight"] == 1
    assert "lr must be finite and >= 0" in out[1]["refused"], out[1]["refused"]
    assert "another rank's share" in out[0]["refused"], out[0]["refused"]
    for rank in (0, 1):
        assert {s for n, s in out[rank]["steps"].items()
                if n.startswith("lr.") and s[1] > 0} == {(1, 1)}, out[rank]["steps"]
        for name, value in alone[rank]["final"].items():
            assert bits_equal(out[rank]["final"][name], value), (rank, name)


def test_ranks_that_list_the_parameters_apart_are_refused_at_construction(daemon, tmp_path):
    # Rank 1's parameters in another order: each rank placed them by its own order, some
    # were stepped twice and others never, and the broadcast copied one parameter's values
    # into another, silently.
    out = ddp_worker.two_ranks(ddp_worker.run_listed_apart, daemon.target, tmp_path, "apart",
                               "apart.")
    for rank in (0, 1):
        assert "the ranks list different parameters" in out[rank].get("refused", ""), rank
    assert not [g for g in optstate.Client(daemon.target).list_groups()
                if g.name.startswith("apart.")]

