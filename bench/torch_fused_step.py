"""A local torch.optim.AdamW(fused=True) step on optstate-bench's tensors.

optstate-bench runs it as its same-run baseline: --tensors N of --elements
each (lora7b: 256 x 65,536; dense:N: 1 x N), fp32, --threads torch threads,
steps for --seconds (at least 3) and prints "elem_per_s X": elements stepped
over the time all steps took, measured as optstate-bench measures optstate's
own steps and the kernel alone (a best single step would flatter the
baseline: 1.2-1.3 x the mean here), then "best_step_elem_per_s Y" for the
fastest step. Needs torch (the project's .torch-venv).
"""
import argparse
import time

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tensors", type=int, required=True)
    parser.add_argument("--elements", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    params = [torch.nn.Parameter(torch.randn(args.elements)) for _ in range(args.tensors)]
    for p in params:
        p.grad = torch.randn(args.elements) * 1e-2
    optimizer = torch.optim.AdamW(params, lr=1e-3, fused=True)
    optimizer.step()  # State allocated, first touch: not timed.
    best = float("inf")
    start = time.perf_counter()
    steps = 0
    while steps < 3 or time.perf_counter() - start < args.seconds:
        t = time.perf_counter()
        optimizer.step()
        best = min(best, time.perf_counter() - t)
        steps += 1
    elapsed = time.perf_counter() - start
    elements = args.tensors * args.elements
    print(f"elem_per_s {steps * elements / elapsed:.6g}", flush=True)
    print(f"best_step_elem_per_s {elements / best:.6g}", flush=True)


if __name__ == "__main__":
    main()
