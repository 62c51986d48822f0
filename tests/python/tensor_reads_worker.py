"""One process of test_remote_adamw.py's test of how RemoteAdamW.step's C++ loop reads
tensors: `mode` "exchange", through torch's DLPack C exchange table
(torch.Tensor.__dlpack_c_exchange_api__); "to_dlpack", with that table hidden as a torch
without one has none, through torch.utils.dlpack.to_dlpack. The C++ loop reads torch's
objects once per process, hence a process for each. Steps one model through the C++ loop
and the same model through the Python loop, three steps each, and exits 0 only when the
C++ loop took every step, read the tensors the way `mode` says and stepped the bits the
Python loop stepped.

    python tensor_reads_worker.py TARGET NAME_PREFIX MODE
"""
import sys

import torch
import torch.nn.functional as F
import torch.utils.dlpack

from models import MLP, two_groups
from reference import bits_equal


def main(target: str, prefix: str, mode: str) -> None:
    # Both before optstate reads torch's objects at its first step.
    exports = [0]
    to_dlpack = torch.utils.dlpack.to_dlpack

    def counting_to_dlpack(tensor):
        exports[0] += 1
        return to_dlpack(tensor)

    torch.utils.dlpack.to_dlpack = counting_to_dlpack
    if mode == "to_dlpack":
        torch.Tensor.__dlpack_c_exchange_api__ = None
    else:
        assert mode == "exchange", mode
        assert type(torch.Tensor.__dlpack_c_exchange_api__).__name__ == "PyCapsule", \
            "this torch has no DLPack C exchange table"

    import optstate.torch as remote
    from optstate.torch import RemoteAdamW

    prepare = remote._prepare_param_step
    taken = []

    def spy(*args):
        prepared = prepare(*args)
        taken.append(prepared is not None)
        return prepared

    stepped, exported_by_cpp, with_grad = [], None, 0
    for loop, prepare_step in (("cpp", spy), ("python", lambda *args: None)):
        remote._prepare_param_step = prepare_step
        model = MLP(seed=3)
        opt = RemoteAdamW(two_groups(model), target=target,
                          name_prefix=f"{prefix}{mode}/{loop}/")
        before = exports[0]
        for step in range(3):
            gen = torch.Generator().manual_seed(step)
            x, y = torch.randn(64, 32, generator=gen), torch.randn(64, 10, generator=gen)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            with_grad = sum(p.grad is not None for p in model.parameters())
            opt.step()
        if loop == "cpp":
            exported_by_cpp = exports[0] - before
        opt.close()
        stepped.append([p.detach().clone() for p in model.parameters()])

    assert taken == [True] * 3, taken
    # Two tensors a parameter (it and its gradient) at each of the three steps.
    expected = 0 if mode == "exchange" else 2 * with_grad * 3
    assert exported_by_cpp == expected, (mode, exported_by_cpp, expected)
    for (name, _), cpp, python in zip(MLP().named_parameters(), *stepped):
        assert bits_equal(cpp, python), name
    print(f"{mode}: the C++ loop took 3 steps of {with_grad} parameters, "
          f"{exported_by_cpp} to_dlpack exports, the Python loop's bits")


if __name__ == "__main__":
    main(*sys.argv[1:])
