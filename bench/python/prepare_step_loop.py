"""RemoteAdamW.step's C++ loop alone (`_prepare_param_step`, client/python/src/prepared_step.h)
over a model of many tensors: the median time of one call hot (calls back to back) and cold
(a buffer larger than the caches written before each call, as a step's kernel leaves them).
Nothing is stepped: the calls make the step's groups and drop them.

  .torch-venv/bin/python3 bench/python/prepare_step_loop.py            # 486 tensors, shared
  .torch-venv/bin/python3 bench/python/prepare_step_loop.py --no-shared-buffers
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import torch

import optstate.torch as remote
from optstate.torch import RemoteAdamW

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=243, help="Linear layers (2 tensors each)")
    parser.add_argument("--width", type=int, default=256, help="Linear(width, width)")
    parser.add_argument("--hot-calls", type=int, default=1000)
    parser.add_argument("--cold-calls", type=int, default=300)
    parser.add_argument("--evict-mib", type=int, default=64,
                        help="MiB written before each cold call")
    parser.add_argument("--no-shared-buffers", dest="shared", action="store_false")
    parser.add_argument("--optstated", default=os.path.join(ROOT, "build/server/optstated"))
    args = parser.parse_args()

    torch.set_num_threads(2)
    daemon = subprocess.Popen([args.optstated, "--listen=127.0.0.1:0", "--log_level=warning",
                               "--backend=cpu"], stdout=subprocess.PIPE, text=True)
    try:
        port = re.search(r"listening on port (\d+)", daemon.stdout.readline()).group(1)
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width)
                                      for _ in range(args.layers)])
        opt = RemoteAdamW(model.named_parameters(), target=f"127.0.0.1:{port}",
                          shared_buffers=args.shared, name_prefix="bench/prepare-loop/")
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-2
        opt.step()  # with shared buffers, the gradients move into their slots here
        opt.zero_grad(set_to_none=False)
        for p in model.parameters():
            p.grad.normal_()
        opt.step()
        evict = torch.empty(args.evict_mib << 20, dtype=torch.uint8)
        # An extension from before the plan (for an alternated comparison) takes no plan.
        plan = (opt._step_plan,) if hasattr(opt, "_step_plan") else ()

        def one_call(cold):
            if cold:
                evict.add_(1)
            groups = [(g["params"], float(g["lr"]), g) for g in opt.param_groups]
            start = time.perf_counter()
            prepared = remote._prepare_param_step(groups, opt._registered, opt._owner, 0,
                                                  opt._shared_grads, *plan)
            elapsed = time.perf_counter() - start
            if prepared is None or len(prepared) != 2 * args.layers:
                sys.exit("the C++ loop did not take this step")
            return elapsed

        hot = sorted(one_call(False) for _ in range(args.hot_calls))
        cold = sorted(one_call(True) for _ in range(args.cold_calls))
        tensors = 2 * args.layers
        print(f"_prepare_param_step over {tensors} tensors "
              f"({'shared buffers' if args.shared else 'no shared buffers'}): "
              f"hot {statistics.median(hot) * 1e3:.3f} ms (best {hot[0] * 1e3:.3f}), "
              f"cold {statistics.median(cold) * 1e3:.3f} ms (best {cold[0] * 1e3:.3f}); "
              f"{statistics.median(cold) / tensors * 1e6:.2f} us a tensor cold")
        opt.close()
    finally:
        daemon.terminate()
        daemon.wait()


if __name__ == "__main__":
    main()
