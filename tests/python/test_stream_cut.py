"""The connection to the daemon is cut in the middle of a step's stream: the client
resends what got no reply, the daemon applies every page exactly once, and training goes
on matching the reference bit for bit."""
import torch

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
