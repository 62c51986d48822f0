#!/usr/bin/env bash
# Two builds of optstate measured back to back on one machine, interleaved
# (A, B, A, B): the CPU kernel at 64M elements on 2 threads, lora7b fp32 and
# bf16 with the gRPC echo baselines, and a dense 64M group, each build with
# its own optstated. For "did this change move the step path's speed".
#   bash bench/compare_builds.sh BUILD_A BUILD_B [OUT_DIR]
set -euo pipefail
a="$1"; b="$2"; out="${3:-compare-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
for round in 1 2; do
  for side in a b; do
    dir="$a"; [ "$side" = b ] && dir="$b"
    "$dir/bench/kernel" --benchmark_filter='elems:67108864/threads:2' \
      --benchmark_repetitions=3 --benchmark_min_time=0.2 > "$out/kernel-$side-$round.txt" 2>&1
    "$dir/bench/optstate-bench" --daemon="$dir/server/optstated" --shape=lora7b \
      --wire=fp32,bf16 --clients=1 --reps=3 --seconds=2 --raw_adamw=false --tcp=false \
      > "$out/lora7b-$side-$round.txt" 2>&1
    "$dir/bench/optstate-bench" --daemon="$dir/server/optstated" --shape=dense:67108864 \
      --wire=fp32 --clients=1 --reps=2 --seconds=2 --echo=false --raw_adamw=false --tcp=false \
      > "$out/dense-$side-$round.txt" 2>&1
  done
done
grep -h 'real_time_median' "$out"/kernel-*.txt || true
grep -h -E '^(lora7b|dense:67108864) ' "$out"/*.txt || true
echo "raw output: $out"
