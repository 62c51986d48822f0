"""DeepSpeed's CPU Adam (DeepSpeedCPUAdam) against optstate's CPU kernel, same run.

Builds (first use: a JIT build, minutes) or loads DeepSpeed's cpu_adam op,
prints the SIMD width and compile flags it was built with and the CPU, then
times, repetition by repetition and interleaved (the order rotates each
repetition):
  - DeepSpeedCPUAdam.step (adamw_mode=True, lr 1e-3, betas (0.9, 0.999),
    eps 1e-8, weight_decay 1e-2: torch.optim.AdamW's defaults) on one fp32
    tensor of --elements with its gradient set, --threads OpenMP threads;
  - bench/kernel's step on the kernel's path of DeepSpeed's SIMD width
    (BM_AdamWKernelOnPath_avx512 for an AVX-512 build, _avx2 for AVX2, else
    BM_AdamWKernel_fp32, the widest path) and BM_MemoryPass (28
    bytes/element) at the same elements and threads, each a subprocess per
    repetition.
Every figure is the mean time of one step within its repetition (Google
Benchmark's real_time; DeepSpeed: the mean over the steps of --seconds).
Prints best/median of each and the ratios kernel/DeepSpeed and
DeepSpeed/memory pass (throughput ratios). Exits non-zero on an error, not
on a missed target. Needs .torch-venv with deepspeed
(scripts/install-deepspeed.sh) and build/bench/kernel; `make bench-deepspeed`.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="build/bench/kernel", help="bench/kernel binary")
    parser.add_argument(
        "--elements", type=int, default=64 << 20, choices=[1 << 20, 16 << 20, 64 << 20],
        help="elements of the one tensor (a size bench/kernel has)")
    parser.add_argument("--threads", type=int, default=2, choices=[1, 2])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="measuring time of each benchmark per repetition")
    return parser.parse_args()


ARGS = parse_args()
# Before torch and DeepSpeed load: the op's OpenMP runtime reads it at start.
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402


def cpu_description():
    out = subprocess.run(["lscpu"], check=True, capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    model = fields.get("Model name", "?").strip()
    flags = fields.get("Flags", "").split()
    simd = [f for f in flags if re.match(r"(sse4|avx|fma|f16c)", f)]
    return model, fields.get("CPU(s)", "?").strip(), simd


def deepspeed_op_flags():
    """The op's cxx flags as DeepSpeed computes them and as its build used them."""
    from deepspeed.ops.op_builder.cpu import CPUAdamBuilder
    builder = CPUAdamBuilder()
    computed = builder.strip_empty_entries(builder.cxx_args())
    ninja = os.path.join(cpp_extension._get_build_directory(builder.name, False), "build.ninja")
    built = None
    if os.path.exists(ninja):
        with open(ninja) as f:
            for line in f:
                if line.startswith("cflags ="):
                    built = line.split("=", 1)[1].split()
    return builder.simd_width(), computed, built, ninja


def native_march():
    """What gcc's -march=native resolves to on this machine (c++, as the op's build)."""
    proc = subprocess.run(["c++", "-march=native", "-Q", "--help=target"], capture_output=True,
                          text=True)
    for line in proc.stdout.splitlines():
        if line.strip().startswith("-march="):
            return line.split()[-1]
    return "? (c++ -march=native -Q --help=target said nothing)"


SIMD_NAMES = {"-D__AVX512__": "AVX-512 (16 fp32 lanes)", "-D__AVX256__": "AVX2 (8 fp32 lanes)",
              "-D__SCALAR__": "scalar", "-D__NEON__": "NEON", "-D__SVE__": "SVE"}


# bench/kernel's step on the path of DeepSpeed's SIMD width: the issue's
# comparison is at the same width.
SAME_WIDTH_KERNEL = {"-D__AVX512__": "BM_AdamWKernelOnPath_avx512",
                     "-D__AVX256__": "BM_AdamWKernelOnPath_avx2"}


class DeepSpeedStep:
    def __init__(self, n):
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        torch.manual_seed(0)
        self.param = torch.nn.Parameter(torch.randn(n))
        self.param.grad = torch.randn(n) * 1e-2
        start = time.perf_counter()
        self.optimizer = DeepSpeedCPUAdam([self.param], lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                          weight_decay=1e-2, adamw_mode=True)
        self.load_seconds = time.perf_counter() - start
        self.optimizer.step()  # State allocated, first touch: not timed.
        if not torch.isfinite(self.param).all():
            raise RuntimeError("DeepSpeedCPUAdam's first step left non-finite parameters")

    def measure(self, seconds):
        """Mean seconds per step over at least 3 steps and `seconds`."""
        steps = 0
        start = time.perf_counter()
        while steps < 3 or time.perf_counter() - start < seconds:
            self.optimizer.step()
            steps += 1
        return (time.perf_counter() - start) / steps


def kernel_bench(binary, name, n, threads, seconds):
    """Mean seconds per iteration of bench/kernel's `name` at {n, threads}."""
    full = f"{name}/elems:{n}/threads:{threads}/real_time"
    proc = subprocess.run(
        [binary, f"--benchmark_filter=^{re.escape(full)}$", f"--benchmark_min_time={seconds}",
         "--benchmark_format=json"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{binary} {full} exited {proc.returncode}: {proc.stderr.strip()}")
    try:
        runs = [b for b in json.loads(proc.stdout)["benchmarks"] if b["name"] == full]
    except (ValueError, KeyError):
        raise RuntimeError(f"{binary} printed no benchmark JSON for {full}: "
                           f"{(proc.stdout + proc.stderr).strip()[-500:]}")
    if len(runs) != 1 or runs[0].get("error_occurred"):
        raise RuntimeError(f"{binary} ran no single {full}: {proc.stdout[-500:]}")
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[runs[0]["time_unit"]]
    return runs[0]["real_time"] * scale


def main():
    if not os.access(ARGS.kernel, os.X_OK):
        sys.exit(f"deepspeed_cpu_adam: no bench/kernel binary at {ARGS.kernel} "
                 "(cmake --build build --target kernel_bench)")
    torch.set_num_threads(ARGS.threads)
    n, threads = ARGS.elements, ARGS.threads
    import deepspeed
    model, cpus, simd_flags = cpu_description()
    print(f"date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"cpu: {model}, {cpus} CPUs; SIMD flags: {' '.join(simd_flags)}")
    print(f"torch {torch.__version__}, deepspeed {deepspeed.__version__}")
    ds = DeepSpeedStep(n)
    simd, computed, built, ninja = deepspeed_op_flags()
    print(f"deepspeed cpu_adam: SIMD width {simd} = {SIMD_NAMES.get(simd, '?')}; "
          f"loaded/built in {ds.load_seconds:.1f} s")
    print(f"  cxx flags DeepSpeed computes here: {' '.join(computed)}")
    print(f"  cflags of the build used ({ninja}): "
          f"{' '.join(f for f in built if f.startswith(('-O', '-m', '-D__', '-f'))) if built else 'build.ninja not found'}")
    print(f"  -march=native is here: {native_march()}")
    if built is not None and simd not in built:
        print(f"  WARNING: the cached build was not built with {simd}")
    print(f"elements {n} fp32 (one tensor), threads {threads}, repetitions {ARGS.repetitions}, "
          f"{ARGS.seconds} s each")

    kernel_name = SAME_WIDTH_KERNEL.get(simd, "BM_AdamWKernel_fp32")
    print(f"kernel: bench/kernel {kernel_name} (the kernel's path of DeepSpeed's SIMD width)")
    names = ["kernel", "memory pass", "deepspeed"]
    runners = {
        "kernel": lambda: kernel_bench(ARGS.kernel, kernel_name, n, threads, ARGS.seconds),
        "memory pass": lambda: kernel_bench(ARGS.kernel, "BM_MemoryPass", n, threads, ARGS.seconds),
        "deepspeed": lambda: ds.measure(ARGS.seconds),
    }
    times = {name: [] for name in names}
    for rep in range(ARGS.repetitions):
        order = names[rep % 3:] + names[:rep % 3]
        for name in order:
            times[name].append(runners[name]())
        print(f"rep {rep + 1}: " + ", ".join(
            f"{name} {times[name][-1] * 1e3:.1f} ms ({n / times[name][-1] / 1e6:.0f} Melem/s)"
            for name in names), flush=True)

    def rate(t):
        return n / t

    print(f"{'':12} {'best ms':>8} {'median ms':>10} {'best Melem/s':>13} {'median Melem/s':>15}")
    for name in names:
        best, median = min(times[name]), statistics.median(times[name])
        print(f"{name:12} {best * 1e3:8.1f} {median * 1e3:10.1f} {rate(best) / 1e6:13.0f} "
              f"{rate(median) / 1e6:15.0f}")

    def ratios(a, b):
        per_rep = [tb / ta for ta, tb in zip(times[a], times[b])]
        return (min(times[b]) / min(times[a]),
                statistics.median(times[b]) / statistics.median(times[a]), per_rep)

    for a, b in [("kernel", "deepspeed"), ("deepspeed", "memory pass"), ("kernel", "memory pass")]:
        best, median, per_rep = ratios(a, b)
        print(f"{a} / {b} (throughput): best {best:.3f}, median {median:.3f}, per repetition "
              f"median {statistics.median(per_rep):.3f} range {min(per_rep):.3f}-{max(per_rep):.3f}")
    best, median, _ = ratios("kernel", "deepspeed")
    print(f"target kernel >= 1.0 x DeepSpeed's CPU Adam ({SIMD_NAMES.get(simd, simd)} build), "
          f"{n} elements, {threads} threads: {'met' if median >= 1.0 else 'not met'} "
          f"(median {median:.3f}, best {best:.3f})")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    try:
        main()
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError, KeyError) as e:
        sys.exit(f"deepspeed_cpu_adam: {e}")
