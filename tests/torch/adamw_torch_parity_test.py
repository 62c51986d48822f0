#!/usr/bin/env python3
"""optstate's CPU AdamW step against torch.optim.AdamW itself.

For each case, one step from the same state (p, m, v at step t-1) and the same
gradient goes through torch.optim.AdamW (its default CPU implementation) and
through the project's kernel (adamw_step_driver, both the dispatching path and
the scalar path). Asserted, bit for bit:
  - m and v equal torch's everywhere;
  - p equals torch's wherever torch's own sqrt(v) is correctly rounded
    (x86 builds of torch take sqrt from MKL, which is not always);
  - p equals, everywhere, what torch's own ops give from a correctly rounded
    sqrt: (p * (1 - lr*wd)).addcdiv_(m, sqrt(v) / bc2 ** 0.5 + eps, -step_size).
Exits non-zero on any difference, printing the first ones.
"""
import argparse
import ctypes
import os
import struct
import subprocess
import sys
import tempfile

import torch


class Case:
    def __init__(self, name, n, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                 weight_decay=1e-2, grad_scale=1.0, seed=0, fresh=False,
                 grad_dtype=torch.float32):
        self.name, self.n, self.step = name, n, step
        self.lr, self.beta1, self.beta2 = lr, beta1, beta2
        self.eps, self.weight_decay, self.grad_scale = eps, weight_decay, grad_scale
        self.seed, self.fresh, self.grad_dtype = seed, fresh, grad_dtype


CASES = [
    Case("torch defaults, step 1 from zero moments", 100_003, 1, fresh=True),
    Case("torch defaults, step 7", 1_000_003, 7, seed=1),
    Case("torch defaults, step 1000", 100_003, 1000, seed=2),
    Case("lr 3e-4, betas (0.8, 0.95), eps 1e-6, wd 0.1, step 3", 100_003, 3,
         lr=3e-4, beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.1, seed=3),
    Case("beta1 0.3 (lerp's second form), step 5", 100_003, 5, beta1=0.3, seed=4),
    Case("beta1 0.5, no weight decay, step 2", 10_007, 2, beta1=0.5, weight_decay=0.0, seed=5),
    Case("grad_scale 1/1024 (loss-scale unscaling), step 11", 100_003, 11,
         grad_scale=1.0 / 1024, seed=6),
    Case("grad_scale 0.37, step 4", 100_003, 4, grad_scale=0.37, seed=7),
    Case("lr 0 (frozen), step 9", 10_007, 9, lr=0.0, seed=8),
    Case("a schedule's lr 0.0123456789, step 250", 100_003, 250, lr=0.0123456789, seed=9),
    Case("7 elements (no vector body), step 2", 7, 2, seed=10),
    Case("beta2 0.99999, step 1000000", 100_003, 1_000_000, beta2=0.99999, seed=11),
    # A bf16 or fp16 gradient: torch steps its exact float32 widening.
    Case("bfloat16 gradient, step 3", 100_003, 3, seed=12, grad_dtype=torch.bfloat16),
    Case("float16 gradient, grad_scale 1/512, step 6", 100_003, 6, grad_scale=1.0 / 512,
         seed=13, grad_dtype=torch.float16),
]
GRAD_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def random_state(case):
    gen = torch.Generator().manual_seed(case.seed)
    n = case.n

    def spread(lo, hi):  # Magnitudes spread log-uniformly over [1e-lo, 1e-hi].
        return 10 ** torch.empty(n).uniform_(lo, hi, generator=gen)

    p = torch.randn(n, generator=gen) * spread(-4, 1)
    g = torch.randn(n, generator=gen) * spread(-8, 3)
    if case.grad_dtype == torch.float16:
        g = g.clamp(-60000.0, 60000.0)  # Finite in float16.
    g[::97] = 0.0
    g[1::101] = -0.0
    if case.fresh:
        m, v = torch.zeros(n), torch.zeros(n)
    else:
        m = torch.randn(n, generator=gen) * spread(-8, 1)
        v = torch.rand(n, generator=gen) * spread(-12, 4)
        m[2::89] = 0.0
        v[3::83] = 0.0
    return p, m, v, g.to(case.grad_dtype)


def torch_step(case, p, m, v, g):
    param = torch.nn.Parameter(p.clone())
    opt = torch.optim.AdamW([param], lr=case.lr, betas=(case.beta1, case.beta2),
                            eps=case.eps, weight_decay=case.weight_decay)
    # The gradient widened to float32, then the trainer's unscaling as a
    # float32 multiply (what grad_scale means).
    g = g.float()
    param.grad = g * case.grad_scale if case.grad_scale != 1.0 else g.clone()
    opt.state[param]["step"] = torch.tensor(float(case.step - 1))
    opt.state[param]["exp_avg"] = m.clone()
    opt.state[param]["exp_avg_sq"] = v.clone()
    opt.step()
    state = opt.state[param]
    return param.detach().clone(), state["exp_avg"].clone(), state["exp_avg_sq"].clone()


def torch_p_with_exact_sqrt(case, p, m_new, v_new):
    """torch's own last two ops, fed a correctly rounded sqrt(v)."""
    bias_correction1 = 1 - case.beta1 ** case.step
    bias_correction2 = 1 - case.beta2 ** case.step
    step_size = case.lr / bias_correction1
    exact_sqrt = v_new.double().sqrt().float()  # Correctly rounded for float32.
    denom = (exact_sqrt / bias_correction2 ** 0.5).add_(case.eps)
    out = p.clone().mul_(1 - case.lr * case.weight_decay)
    return out.addcdiv_(m_new, denom, value=-step_size)


def run_driver(driver, case, path, p, m, v, g, tmp):
    inp, out = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
    with open(inp, "wb") as f:
        f.write(struct.pack("<QQdddddfII", case.n, case.step, case.lr, case.beta1, case.beta2,
                            case.eps, case.weight_decay, case.grad_scale, path,
                            GRAD_TYPES[case.grad_dtype]))
        for t in (p, m, v, g):
            t = t.contiguous()
            f.write(ctypes.string_at(t.data_ptr(), t.element_size() * t.numel()))
    subprocess.run([driver, inp, out], check=True)
    with open(out, "rb") as f:
        raw = bytearray(f.read())
    return torch.frombuffer(raw, dtype=torch.float32).view(3, case.n)


def bits(t):
    return t.contiguous().view(torch.int32)


def differences(name, got, want, mask=None):
    """A line per array that differs, naming the first elements; [] when equal."""
    diff = bits(got) != bits(want)
    if mask is not None:
        diff &= mask
    count = int(diff.sum())
    if count == 0:
        return []
    idx = diff.nonzero().flatten()[:3].tolist()
    shown = ", ".join(f"[{i}] {got[i].item()!r} != {want[i].item()!r}" for i in idx)
    return [f"{name}: {count} elements differ, first {shown}"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    kernel_path = subprocess.run([args.driver, "--path"], check=True, capture_output=True,
                                 text=True).stdout.strip()
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}; "
          f"the kernel's dispatching path here: {kernel_path}")
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            p, m, v, g = random_state(case)
            tp, tm, tv = torch_step(case, p, m, v, g)
            exact_p = torch_p_with_exact_sqrt(case, p, tm, tv)
            sqrt_rounded_alike = bits(tv.sqrt()) == bits(tv.double().sqrt().float())
            for path in (0, 1):
                ours = run_driver(args.driver, case, path, p, m, v, g, tmp)
                problems = (differences("m", ours[1], tm) + differences("v", ours[2], tv) +
                            differences("p (where torch's sqrt is correctly rounded)", ours[0],
                                        tp, sqrt_rounded_alike) +
                            differences("p (torch's ops, correctly rounded sqrt)", ours[0],
                                        exact_p))
                label = "dispatch" if path == 0 else "scalar"
                if problems:
                    failures += 1
                    print(f"FAIL {case.name} [{label}]")
                    for line in problems:
                        print(f"    {line}")
                else:
                    off = int((~sqrt_rounded_alike).sum())
                    p_off = int((bits(ours[0]) != bits(tp)).sum())
                    rel = ((ours[0].double() - tp.double()).abs() /
                           tp.double().abs().clamp_min(1e-30)).max().item()
                    print(f"ok   {case.name} [{label}]: {case.n} elements, m and v bit-identical; "
                          f"torch's sqrt rounded {off} differently, so p differs at {p_off} "
                          f"(max relative {rel:.1e}), and equals torch's ops with an exact sqrt")
    total = 2 * len(CASES)
    print(f"{total - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
