"""The connection to the daemon is cut in the middle of a step's stream: the client
resends the step, the daemon applies every page exactly once, and training goes on
matching the reference bit for bit; also when the daemon restarted from a checkpoint
between the cut and the resend, having lost what it had answered."""

import torch

from conftest import Daemon

from cutting_proxy import CuttingProxy
from optstate.torch import RemoteAdamW
from reference import bits_equal, ieee_adamw_

SIZES = (600_000, 300_000, 1000)  # several ~1 MiB messages per step


def test_training_continues_after_the_stream_is_cut_mid_step(daemon, client, prefix):
    proxy = CuttingProxy(daemon.port)
    try:
        gen = torch.Generator().manual_seed(9)
        params = [torch.nn.Parameter(torch.randn(n, generator=gen)) for n in SIZES]
        # Over the wire: the proxy cuts the gRPC connection that carries the
        # gradients (on the shared-memory plane they would not pass it).
        opt = RemoteAdamW(params, target=proxy.target, name_prefix=prefix, lr=1e-2,
                          initial_backoff=0.01, data_plane="wire")
        chain = [[p.detach().clone(), torch.zeros(p.shape), torch.zeros(p.shape)] for p in params]
        gradient_bytes = 4 * sum(SIZES)
        for step in range(1, 7):
            for p, (p_ref, m_ref, v_ref) in zip(params, chain):
                p.grad = torch.randn(p.shape, generator=gen)
                ieee_adamw_(p_ref, p.grad, m_ref, v_ref, step, 1e-2)
            if step in (3, 5):
                proxy.arm(gradient_bytes // 2)  # cut half way through this step's gradients
            opt.step()
            for i, p in enumerate(params):
                assert bits_equal(p.detach(), chain[i][0]), f"param {i} at step {step}"
        assert proxy.cuts == 2 and proxy.connections >= 3
        for i in range(len(SIZES)):
            state = client.export_state(f"{prefix}param.{i}")
            assert set(state.page_steps.tolist()) == {6}
            assert bits_equal(torch.from_numpy(state.exp_avg), chain[i][1])
            assert bits_equal(torch.from_numpy(state.exp_avg_sq), chain[i][2])
        stats = client.stats()
        groups = [g for g in stats["groups"] if g["info"]["name"].startswith(prefix)]
        print("chunks applied", sum(g["chunks_applied"] for g in groups),
              "replayed", sum(g["chunks_replayed"] for g in groups),
              "connections", proxy.connections)
    finally:
        proxy.close()


def test_a_step_resent_to_a_daemon_restarted_from_a_checkpoint_applies_all_of_it(prefix, tmp_path):
    # Step 2 is cut half way through its gradients; before the client reconnects, the
    # daemon is killed and started again from its checkpoint of step 1, so the pages it
    # had applied and answered are back at step 1. The resent step must apply them again:
    # resending only the messages that got no reply returned OK with those pages at
    # step 1 (and the next step then refused).
    state_dir = tmp_path / "state"
    daemons = [Daemon(f"--state_dir={state_dir}")]
    proxy = CuttingProxy(daemons[0].port)
    try:
        gen = torch.Generator().manual_seed(11)
        sizes = (250_000,) * 16  # 16 MB of gradient a step, in messages of about 1 MiB
        params = [torch.nn.Parameter(torch.randn(n, generator=gen)) for n in sizes]
        opt = RemoteAdamW(params, target=proxy.target, name_prefix=prefix, lr=1e-2,
                          initial_backoff=0.01, data_plane="wire")
        chain = [[p.detach().clone(), torch.zeros(p.shape), torch.zeros(p.shape)] for p in params]

        def restart():
            daemons[0].process.kill()
            daemons[0].process.wait()
            daemons.append(Daemon(f"--state_dir={state_dir}"))
            proxy.retarget(daemons[-1].port)

        for step in range(1, 4):
            for p, (p_ref, m_ref, v_ref) in zip(params, chain):
                p.grad = torch.randn(p.shape, generator=gen)
                ieee_adamw_(p_ref, p.grad, m_ref, v_ref, step, 1e-2)
            if step == 2:
                opt.client.checkpoint(wait_for_step=1)
                # Cut near the end, when the daemon has answered most of the messages.
                proxy.arm(4 * sum(sizes) * 9 // 10, then=restart)
            opt.step()
            for i, p in enumerate(params):
                assert bits_equal(p.detach(), chain[i][0]), f"param {i} at step {step}"
        assert proxy.cuts == 1 and len(daemons) == 2
        for i in range(len(sizes)):
            state = opt.client.export_state(f"{prefix}param.{i}")
            assert set(state.page_steps.tolist()) == {3}, (i, state.page_steps)
            assert bits_equal(torch.from_numpy(state.exp_avg), chain[i][1])
            assert bits_equal(torch.from_numpy(state.exp_avg_sq), chain[i][2])
        opt.close()
    finally:
        proxy.close()
        for d in daemons:
            if d.process.poll() is None:
                assert d.stop() == 0
