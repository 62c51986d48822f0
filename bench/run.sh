#!/usr/bin/env bash
# make bench: builds the benchmarks, runs the suite (about 5 minutes on the
# 2-core CI machine) and prints every figure with its same-run baseline and
# the ratio against the target. Raw output lands in $RESULTS.
#   BUILD_DIR=build   build directory (configured by `make build`)
#   QUICK=1           fewer repetitions, shorter measurements (a smoke run)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-build}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
RESULTS="${RESULTS:-$BUILD_DIR/bench-results/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$RESULTS"

if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > "$RESULTS/configure.log"
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" --target kernel_bench optstate_bench optstated \
  > "$RESULTS/build.log" || { cat "$RESULTS/build.log"; exit 1; }

KERNEL="$BUILD_DIR/bench/kernel"
E2E="$BUILD_DIR/bench/optstate-bench"
if [[ "${QUICK:-0}" == 1 ]]; then
  KREPS=2; KTIME=0.05; EREPS=1; ESECS=0.5
else
  KREPS=5; KTIME=0.2; EREPS=3; ESECS=2
fi

# Every command is logged next to its output so BENCHMARKS.md can cite it.
run() {
  local name="$1"; shift
  echo "\$ $*" | sed "s|$BUILD_DIR|\$BUILD_DIR|g" > "$RESULTS/$name.cmd"
  echo ">> $name: $(cat "$RESULTS/$name.cmd")" >&2
  "$@" > "$RESULTS/$name.out" 2> "$RESULTS/$name.err" || {
    cat "$RESULTS/$name.err" >&2; exit 1; }
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "memory: $(free -g | awk '/Mem:/ {print $2}') GiB"
  echo "kernel: $(uname -r)"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
} > "$RESULTS/machine.txt"

# 1. CPU kernel against the memory pass and the plain loop, interleaved at
#    random so drift hits every benchmark alike; best repetition counts.
run kernel "$KERNEL" --benchmark_repetitions="$KREPS" --benchmark_enable_random_interleaving=true \
  --benchmark_min_time="$KTIME" --benchmark_format=json --benchmark_out="$RESULTS/kernel.json"

# 2. End to end, lora7b shape: fp32 and bf16 wire (bf16 from float buffers,
#    and from a bf16 model's own buffers), 1 and 8 clients, each with the gRPC
#    echo baseline, the raw echo (no payload copies: gRPC's own ceiling) and
#    the minimal AdamW service (the raw echo plus only the work any AdamW
#    service must do; then with optstate's guarantees); raw TCP in the same run.
run e2e_lora7b "$E2E" --shape=lora7b --wire=fp32,bf16,bf16-native --clients=1,8 --reps="$EREPS" \
  --seconds="$ESECS"

# 3. Linearity: a dense 4M and a dense 64M group, fp32 wire.
run e2e_dense "$E2E" --shape=dense:4194304,dense:67108864 --wire=fp32 --clients=1 \
  --reps="$EREPS" --seconds="$ESECS" --echo=false --raw_adamw=false --tcp=false

# 4. Daemon memory after registering 64M elements with initial values.
run memory "$E2E" --memory_elements=67108864

echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$RESULTS/machine.txt"
python3 "$ROOT/bench/summarize.py" "$RESULTS" | tee "$RESULTS/summary.md"
echo "raw results: $RESULTS" >&2
