#!/usr/bin/env python3
"""One optimizer step of a stack of Linear layers (100M parameters by default):
optstate.torch.RemoteAdamW (fp32 wire and bf16 wire; and with shared_buffers=True, a float32
and a bfloat16 model, whose Python work is reported against their own step) against
torch.optim.AdamW with
foreach=True and fused=True on the same machine in the same run, and against the C++
client stepping the same bytes (optstate-client-step, bench/python/client_step_timing.cc:
groups of the same sizes registered with the same initial values, stepped with the same
gradients, each group with its own lr, float32 buffers narrowed/widened by the client).

Every measurement is repeated --reps times, interleaved in a shuffled order with a pause
before each (torch's OpenMP workers spin after a step); best, median and worst are
reported (the machine is shared: noise only makes a step slower). Beside the wall time,
each step's CPU time of the client process (RemoteAdamW's: this Python process; the C++
client's: its own) and of the daemon (its threads' schedstat). The Python layer's
overhead is RemoteAdamW's step time over the C++ client's for the same groups and wire,
as a fraction of RemoteAdamW's (best against best, and median against median); the
budget is 5%. The client CPU time shows the same without the daemon's share of the noise.

  .torch-venv/bin/python3 bench/python/remote_adamw_step.py            # 100M parameters
  .torch-venv/bin/python3 bench/python/remote_adamw_step.py --params 4000000 --width 1024
"""
import argparse
import copy
import glob
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import optstate
from optstate._optstate import _prepare_param_step
from optstate.torch import RemoteAdamW

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_daemon(binary, threads):
    process = subprocess.Popen([binary, "--listen=127.0.0.1:0", "--log_level=warning",
                                f"--threads={threads}"], stdout=subprocess.PIPE, text=True)
    match = re.search(r"listening on port (\d+)", process.stdout.readline())
    if not match:
        process.kill()
        sys.exit("optstated did not report its port")
    return process, f"127.0.0.1:{match.group(1)}"


def linear_stack(params, width, seed=0):
    torch.manual_seed(seed)
    layers = max(1, round(params / (width * width + width)))
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


class CppClient:
    """optstate-client-step: one C++ Client::Step of the same groups per request."""

    def __init__(self, binary, target, params, grads):
        sizes = [p.numel() for p in params]
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            files = {}
            for what, tensors in (("values", params), ("grads", grads)):
                files[what] = os.path.join(tmp, what)
                with open(files[what], "wb") as f:
                    for t in tensors:
                        f.write(t.detach().contiguous().numpy().tobytes())
            self.process = subprocess.Popen(
                [binary, f"--target={target}", f"--sizes={','.join(map(str, sizes))}",
                 "--prefix=bench/cpp/", f"--values={files['values']}",
                 f"--grads={files['grads']}"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert self.process.stdout.readline().strip() == "ready", "optstate-client-step failed"

    def step(self, wire):
        """(wall seconds, CPU seconds of the client process), by the tool's own clocks."""
        self.process.stdin.write(wire + "\n")
        self.process.stdin.flush()
        wall, cpu = self.process.stdout.readline().split()
        return float(wall), float(cpu)

    def close(self):
        self.process.stdin.close()
        self.process.wait()


class TimedClient:
    """An optstate.Client that adds up the wall time and the calling thread's CPU time spent
    inside its step() calls, so the Python work of RemoteAdamW.step around them can be told
    apart."""

    def __init__(self, target):
        self.client = optstate.Client(target)
        self.inside = 0.0
        self.inside_cpu = 0.0

    def __getattr__(self, name):
        """Every other call (register, stats, ...) is the client's, untimed."""
        return getattr(self.client, name)

    def step(self, *args, **kwargs):
        start, start_cpu = time.perf_counter(), time.thread_time()
        try:
            return self.client.step(*args, **kwargs)
        finally:
            self.inside += time.perf_counter() - start
            self.inside_cpu += time.thread_time() - start_cpu

    def __getattr__(self, name):
        return getattr(self.client, name)


def binding_seconds(client, optimizer, model, prefix, wire, calls=200):
    """Wall time of one Client.step call that views and checks every buffer of the model's
    step, as RemoteAdamW passes them (the _PreparedStep its step reads from the parameters,
    or tuples where it takes its Python loop), and that the C++ client then refuses at once
    (step 0, before anything is sent): the binding's own work per call, an exception
    included."""
    entries = _prepare_param_step(
        [(group["params"], float(group["lr"]), group) for group in optimizer.param_groups],
        optimizer._registered, optimizer._owner, 0, optimizer._shared_grads,
        optimizer._step_plan)
    if entries is None:
        entries = [(prefix + n, p.grad, p.data, 1e-3) for n, p in model.named_parameters()]
    start = time.perf_counter()
    for _ in range(calls):
        try:
            client.step(entries, 0, wire_dtype=wire)
        except optstate.InvalidArgument:
            pass
    return (time.perf_counter() - start) / calls


def print_python_work(remote, outside, outside_cpu, binding, best):
    """RemoteAdamW.step's own time around Client.step, and the binding's, per step."""
    python = statistics.median(outside[remote])
    python_cpu = statistics.median(outside_cpu[remote])
    print(f"  {remote}: Python work around Client.step {python * 1e3:.3f} ms wall per "
          f"step (median; best {min(outside[remote]) * 1e3:.3f}, worst "
          f"{max(outside[remote]) * 1e3:.3f}), {python_cpu * 1e3:.3f} ms of the "
          f"thread's CPU time (median); the binding's own {binding[remote] * 1e3:.3f} ms "
          f"per call; wall and binding together "
          f"{(python + binding[remote]) / best[remote]:.3%} of the best step")


def cpu_seconds_of(pid):
    """CPU time of all threads of process `pid` (schedstat, nanoseconds), in seconds."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as f:
                total += int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            pass  # a thread that ended
    return total * 1e-9


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=int, default=100_000_000)
    parser.add_argument("--width", type=int, default=4096, help="Linear(width, width) layers")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="optstated --threads (0: all)")
    parser.add_argument("--pause", type=float, default=0.3,
                        help="seconds of rest before each measurement")
    parser.add_argument("--skip-torch", action="store_true",
                        help="only RemoteAdamW and the C++ client (no local torch.optim.AdamW)")
    parser.add_argument("--target", help="an optstated to use instead of starting one")
    parser.add_argument("--optstated", default=os.path.join(ROOT, "build/server/optstated"))
    parser.add_argument("--client-step",
                        default=os.path.join(ROOT, "build/bench/optstate-client-step"))
    args = parser.parse_args()

    daemon = None
    target = args.target
    if target is None:
        daemon, target = start_daemon(args.optstated, args.threads)
    try:
        base = linear_stack(args.params, args.width)
        sizes = [p.numel() for p in base.parameters()]
        total = sum(sizes)
        print(f"model: {len(base)} x Linear({args.width}, {args.width}), {total:,} parameters "
              f"in {len(sizes)} tensors; torch {torch.__version__}, "
              f"{torch.get_num_threads()} torch threads; load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        names = ["RemoteAdamW fp32", "RemoteAdamW bf16 wire", "RemoteAdamW fp32 shared",
                 "RemoteAdamW bf16 shared"]
        if not args.skip_torch:
            names = ["torch foreach", "torch fused"] + names
        models = {name: copy.deepcopy(base) for name in names}
        gen = torch.Generator().manual_seed(1)
        grads = [torch.randn(p.shape, generator=gen) * 1e-2 for p in base.parameters()]
        # A bfloat16 model (its parameters and gradients in 16 bits, stepped in place in a
        # shared buffer, the daemon's master weights in float32).
        models["RemoteAdamW bf16 shared"].to(torch.bfloat16)
        for model in models.values():  # the same gradients for every optimizer
            for p, g in zip(model.parameters(), grads):
                p.grad = g.to(p.dtype, copy=True)  # each model its own gradients
        timed = {name: TimedClient(target) for name in names if name.startswith("Remote")}
        optimizers = {
            "RemoteAdamW fp32": RemoteAdamW(models["RemoteAdamW fp32"].named_parameters(),
                                            client=timed["RemoteAdamW fp32"],
                                            name_prefix="bench/py/fp32/"),
            "RemoteAdamW bf16 wire": RemoteAdamW(
                models["RemoteAdamW bf16 wire"].named_parameters(),
                client=timed["RemoteAdamW bf16 wire"], name_prefix="bench/py/bf16/",
                wire_dtype=torch.bfloat16),
            # Parameters and gradients in a buffer shared with the daemon: nothing copied.
            "RemoteAdamW fp32 shared": RemoteAdamW(
                models["RemoteAdamW fp32 shared"].named_parameters(),
                client=timed["RemoteAdamW fp32 shared"], name_prefix="bench/py/shared/",
                shared_buffers=True),
            "RemoteAdamW bf16 shared": RemoteAdamW(
                models["RemoteAdamW bf16 shared"].named_parameters(),
                client=timed["RemoteAdamW bf16 shared"], name_prefix="bench/py/shared-bf16/",
                shared_buffers=True),
        }
        if not args.skip_torch:
            optimizers["torch foreach"] = torch.optim.AdamW(
                models["torch foreach"].parameters(), foreach=True)
            optimizers["torch fused"] = torch.optim.AdamW(
                models["torch fused"].parameters(), fused=True)
        # The same bytes: the model's initial values and the same gradients.
        cpp = CppClient(args.client_step, target, list(base.parameters()), grads)
        del base, grads
        steps = {name: optimizers[name].step for name in names}
        steps["C++ client fp32"] = lambda: cpp.step("fp32")
        steps["C++ client bf16 wire"] = lambda: cpp.step("bf16")
        times = {name: [] for name in steps}
        outside = {name: [] for name in timed}  # RemoteAdamW.step's time around Client.step
        outside_cpu = {name: [] for name in timed}  # the same in the thread's CPU time
        client_cpu = {name: [] for name in steps}
        daemon_cpu = {name: [] for name in steps}
        order = random.Random(0)
        for rep in range(args.reps + 1):  # the first round warms up and is not counted
            names_now = list(steps)
            order.shuffle(names_now)  # no configuration always follows the same one
            for name in names_now:
                # torch's OpenMP workers spin for a while after a parallel region; on a
                # small machine they would take the daemon's cores from whatever came next.
                time.sleep(args.pause)
                d0 = cpu_seconds_of(daemon.pid) if daemon is not None else 0.0
                c0 = time.process_time()
                start = time.perf_counter()
                if name in timed:
                    timed[name].inside = timed[name].inside_cpu = 0.0
                thread0 = time.thread_time()
                reported = steps[name]()
                thread_cpu = time.thread_time() - thread0
                elapsed = time.perf_counter() - start
                cpu = time.process_time() - c0
                d1 = cpu_seconds_of(daemon.pid) if daemon is not None else 0.0
                if name.startswith("C++"):
                    elapsed, cpu = reported  # the C++ client's own clocks, around Client::Step
                if rep:
                    times[name].append(elapsed)
                    if name in timed:
                        outside[name].append(elapsed - timed[name].inside)
                        outside_cpu[name].append(thread_cpu - timed[name].inside_cpu)
                    client_cpu[name].append(cpu)
                    daemon_cpu[name].append(d1 - d0)
        cpp.close()
        binding = {"RemoteAdamW fp32": binding_seconds(
                       timed["RemoteAdamW fp32"].client, optimizers["RemoteAdamW fp32"],
                       models["RemoteAdamW fp32"], "bench/py/fp32/", "float32"),
                   "RemoteAdamW bf16 wire": binding_seconds(
                       timed["RemoteAdamW bf16 wire"].client, optimizers["RemoteAdamW bf16 wire"],
                       models["RemoteAdamW bf16 wire"], "bench/py/bf16/", "bfloat16"),
                   "RemoteAdamW fp32 shared": binding_seconds(
                       timed["RemoteAdamW fp32 shared"].client,
                       optimizers["RemoteAdamW fp32 shared"], models["RemoteAdamW fp32 shared"],
                       "bench/py/shared/", "float32"),
                   "RemoteAdamW bf16 shared": binding_seconds(
                       timed["RemoteAdamW bf16 shared"].client,
                       optimizers["RemoteAdamW bf16 shared"], models["RemoteAdamW bf16 shared"],
                       "bench/py/shared-bf16/", "bfloat16")}

        best = {name: min(t) for name, t in times.items()}
        median = {name: statistics.median(t) for name, t in times.items()}
        fused = best.get("torch fused")
        print(f"{'configuration':<24}{'best s':>9}{'median s':>10}{'worst s':>9}{'G elem/s':>10}"
              f"{'vs fused':>9}{'client CPU s':>14}{'daemon CPU s':>14}")
        for name, t in times.items():
            ratio = f"{fused / best[name]:>9.3f}" if fused else f"{'-':>9}"
            print(f"{name:<24}{best[name]:>9.4f}{median[name]:>10.4f}{max(t):>9.4f}"
                  f"{total / best[name] / 1e9:>10.3f}{ratio}"
                  f"{statistics.median(client_cpu[name]):>14.4f}"
                  f"{statistics.median(daemon_cpu[name]):>14.4f}")
        ok = True
        for remote, native in (("RemoteAdamW fp32", "C++ client fp32"),
                               ("RemoteAdamW bf16 wire", "C++ client bf16 wire")):
            overhead = (best[remote] - best[native]) / best[remote]
            by_median = (median[remote] - median[native]) / median[remote]
            by_cpu = (statistics.median(client_cpu[remote]) -
                      statistics.median(client_cpu[native])) / best[remote]
            paired = statistics.median((r - n) / r for r, n in zip(times[remote], times[native]))
            ok &= overhead <= 0.05
            print(f"Python overhead, {remote} over {native}: {overhead:+.2%} of the step best "
                  f"against best ({'within' if overhead <= 0.05 else 'OVER'} the 5% budget), "
                  f"{by_median:+.2%} median against median, {paired:+.2%} the median of "
                  f"the repetitions' (interleaved pairs'); client CPU time "
                  f"{by_cpu:+.2%} of the step")
            print_python_work(remote, outside, outside_cpu, binding, best)
        # The shared buffers' steps have no C++ run here (optstate-client-step copies through
        # its own buffers): their Python work and binding against their own best step.
        print_python_work("RemoteAdamW fp32 shared", outside, outside_cpu, binding, best)
        print_python_work("RemoteAdamW bf16 shared", outside, outside_cpu, binding, best)
        return 0 if ok else 1
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait()


if __name__ == "__main__":
    sys.exit(main())
