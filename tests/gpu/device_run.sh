#!/usr/bin/env bash
# Everything a lent GPU machine is for, in one call of about nine minutes: the
# GPU checks (tests/gpu/run.sh from the bundle, the Python extension built
# there for that machine's Python), then the same-host CPU step matrix of
# BENCHMARKS.md on that machine's own (larger) CPU. Prepared here:
#   bash tests/gpu/bundle.sh                      # .gpu-bundle (about 44 MB)
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 -d .whl torchao
#                                                 # optional: the offload benchmark's torchao
# then, on the device machine, carrying .gpu-bundle and .whl:
#   OUT=/dir bash tests/gpu/device_run.sh
# Writes machine.txt, gpu-run.log, gpu-logs.tgz (run.sh's logs) and cpu-bench.log
# to $OUT, and prints run.sh's summary and the matrix's ratios last.
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:?set OUT to a folder for the results}
GPU_LIMIT=${GPU_LIMIT:-330}  # seconds for run.sh; the CPU matrix takes about 200 more
LOGS=$(mktemp -d)
T0=$(date +%s)
{ lscpu; nproc; free -g; nvidia-smi; python3 -V; g++ --version | head -1; } > "$OUT/machine.txt" 2>&1
grep -E "Model name|^CPU\(s\)|L2|L3" "$OUT/machine.txt"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
BUNDLE=.gpu-bundle OUT=$LOGS/gpu timeout "$GPU_LIMIT" bash tests/gpu/run.sh > "$OUT/gpu-run.log" 2>&1
echo "run.sh exited $? after $(( $(date +%s) - T0 )) s" >> "$OUT/gpu-run.log"
tar czf "$OUT/gpu-logs.tgz" -C "$LOGS" . 2>/dev/null

# The same-host matrix (issue: the same-host step at the kernel's speed): the
# daemon on its CPU backend, the kernel alone and torch's fused AdamW on all
# of this machine's cores.
export LD_LIBRARY_PATH=.gpu-bundle/lib
matrix() {
  local limit=$1
  shift
  echo "== $* ($(( $(date +%s) - T0 )) s)"
  timeout "$limit" .gpu-bundle/bin/optstate-bench --daemon=.gpu-bundle/bin/optstated \
    --daemon_args=--backend=cpu --torch_python=python3 --echo=false --raw_adamw=false \
    --tcp=false --wire=fp32,bf16-native --reps=5 --seconds=0.5 "$@"
}
{
  matrix 90 --shape=lora7b --clients=1 \
    --data_plane=wire,shared_memory,shared_buffer,shared_buffer_checked
  matrix 60 --shape=lora7b --clients=8 --data_plane=shared_memory,shared_buffer,shared_buffer_checked
  matrix 70 --shape=dense:67108864 --clients=1 \
    --data_plane=shared_memory,shared_buffer,shared_buffer_checked
  echo "== done ($(( $(date +%s) - T0 )) s)"
} > "$OUT/cpu-bench.log" 2>&1
tail -45 "$OUT/gpu-run.log"
grep -E "^== |x the kernel alone" "$OUT/cpu-bench.log" | cut -c1-160
