#!/usr/bin/env bash
# The GPU checks of the CUDA backend, for a host with an NVIDIA GPU (sm_80 or
# newer) and the project's build dependencies: builds, runs the `gpu` tests,
# compute-sanitizer memcheck on a small run, the daemon's
# backend choice, then the GPU benchmark, and prints a short table. About 5
# minutes on an H200 host (estimated; cuda_durability_test and its memcheck
# run were added without a device to time them); meant to stay under 8.
#
#   tests/gpu/run.sh                # build into build-gpu/ and run everything
#   BUILD=/path SKIP_BUILD=1 tests/gpu/run.sh   # reuse a build
#   OUT=/dir tests/gpu/run.sh       # logs go there (default $BUILD/gpu-logs)
#   BUNDLE=.gpu-bundle tests/gpu/run.sh  # binaries packed by tests/gpu/bundle.sh, for a
#                                        # machine without the build dependencies
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build-gpu}
if [[ -n "${BUNDLE:-}" ]]; then
  BUNDLE=$(cd "$BUNDLE" && pwd)
  export LD_LIBRARY_PATH="$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  SKIP_BUILD=1
fi
OUT=${OUT:-${BUNDLE:-$BUILD}/gpu-logs}
if [[ -n "${BUNDLE:-}" ]]; then
  TEST_BIN=$BUNDLE/bin SERVER_BIN=$BUNDLE/bin BENCH_BIN=$BUNDLE/bin
else
  TEST_BIN=$BUILD/tests/gpu SERVER_BIN=$BUILD/server BENCH_BIN=$BUILD/bench/gpu
fi
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
declare -a SUMMARY=()
status=0
note() { SUMMARY+=("$(printf '%-50s %s' "$1" "$2")"); }

if ! nvidia-smi -L >"$OUT/nvidia-smi.txt" 2>&1; then
  echo "run.sh: no NVIDIA GPU here (nvidia-smi -L failed); these checks need one" >&2
  exit 1
fi
cat "$OUT/nvidia-smi.txt"

PYTHON=${PYTHON:-python3}
extension_build=
if [[ -n "${BUNDLE:-}" ]] && ! "$PYTHON" -c 'import optstate._optstate' >/dev/null 2>&1; then
  # A bundle's Python extension is built here, for this machine's Python,
  # while the GPU tests run; the Python checks below wait for it.
  echo "== building the Python extension for $PYTHON (log: $OUT/python-extension.log)"
  PYTHON="$PYTHON" bash "$ROOT/tests/gpu/build_python_extension.sh" "$BUNDLE/site" \
    >"$OUT/python-extension.log" 2>&1 &
  extension_build=$!
fi

if [[ -z "${SKIP_BUILD:-}" ]]; then
  echo "== build ($BUILD)"
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DOPTSTATE_WITH_CUDA=ON -DOPTSTATE_BUILD_BENCH=ON >"$OUT/configure.log" 2>&1 &&
    grep -q "CUDA backend ON" "$OUT/configure.log" &&
    cmake --build "$BUILD" -j"$JOBS" --target optstated cuda_kernel_test cuda_backend_test \
      cuda_durability_test cuda_large_paged_test gpu_step_bench vram_budget_test \
      paging_policy_test \
      >"$OUT/build.log" 2>&1
  if [[ $? -ne 0 ]]; then
    tail -30 "$OUT/configure.log" "$OUT/build.log"
    echo "run.sh: build failed (logs in $OUT)" >&2
    exit 1
  fi
fi

echo "== gpu tests"
export OPTSTATE_REQUIRE_GPU=1  # A test that cannot find the device fails instead of skipping.
if [[ -n "${BUNDLE:-}" ]]; then
  # No ctest tree in a bundle: run each test binary; print a ctest-like total.
  (
    failed=0
    for t in cuda_kernel_test cuda_backend_test cuda_durability_test cuda_large_paged_test \
             vram_budget_test paging_policy_test; do
      timeout 300 "$BUNDLE/bin/$t" || failed=$((failed + 1))
    done
    if [[ $failed -eq 0 ]]; then echo "100% tests passed (6 binaries)"; else
      echo "0% tests passed: $failed of 6 binaries failed"; exit 1; fi
  ) 2>&1 | tee "$OUT/ctest.log"
else
  (cd "$BUILD" && timeout 420 ctest -L 'gpu|paging' --output-on-failure) 2>&1 | tee "$OUT/ctest.log"
fi
if [[ ${PIPESTATUS[0]} -eq 0 ]]; then
  note "gpu + paging tests" "$(grep -Eo '[0-9]+% tests passed.*' "$OUT/ctest.log")"
else
  status=1
  note "gpu + paging tests" "FAILED: $(grep -Eo '[0-9]+% tests passed.*' "$OUT/ctest.log")"
fi

SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
  /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
SMALL='*SmallGroups*:*MovesItInAfterADelete*'
if [[ -n "$SANITIZER" ]]; then
  # memcheck: out-of-bounds and misaligned device accesses, API errors.
  # racecheck and synccheck would add nothing: they only see shared memory
  # and barriers, which the kernel does not use; host/stream ordering is
  # what the bit-exact comparisons above check. The small backend runs, and
  # the checkpoint/import copies of a resident and a paged group.
  for run in "cuda_backend_test:$SMALL" "cuda_durability_test:*"; do
    binary=${run%%:*} filter=${run#*:}
    echo "== compute-sanitizer memcheck $binary"
    timeout 240 "$SANITIZER" --tool memcheck --error-exitcode 3 \
      "$TEST_BIN/$binary" --gtest_filter="$filter" >"$OUT/sanitizer-$binary.log" 2>&1
    rc=$?
    tail -3 "$OUT/sanitizer-$binary.log"
    if [[ $rc -eq 0 ]]; then
      note "compute-sanitizer memcheck $binary" "clean"
    else
      status=1
      note "compute-sanitizer memcheck $binary" "FAILED rc=$rc (see $OUT/sanitizer-$binary.log)"
    fi
  done
else
  note "compute-sanitizer" "not found; skipped"
fi

echo "== optstated --backend=auto and --backend=cuda"
for kind in auto cuda; do
  timeout 20 "$SERVER_BIN/optstated" --backend=$kind --listen=127.0.0.1:0 \
    >"$OUT/optstated-$kind.log" 2>&1 &
  pid=$!
  sleep 5
  kill -TERM $pid 2>/dev/null
  wait $pid
  line=$(grep -m1 'backend: ' "$OUT/optstated-$kind.log")
  echo "$line"
  if grep -q 'backend: cuda' <<<"$line"; then
    note "optstated --backend=$kind" "cuda"
  else
    status=1
    note "optstated --backend=$kind" "FAILED: ${line:-no backend line}"
  fi
done

echo "== gpu benchmark"
timeout 240 "$BENCH_BIN/gpu_step_bench" 2>&1 | tee "$OUT/bench.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || { status=1; note "gpu benchmark" "FAILED"; }

echo "== RemoteAdamW with CUDA parameters (test_cuda_staging.py) and the offload benchmark"
# They need torch with CUDA and optstate's Python package built for this Python
# (pip install ./client/python, or from a bundle built above by build_python_extension.sh);
# without it they are reported NOT RUN and the run fails.
if [[ -n "$extension_build" ]]; then
  if wait "$extension_build"; then
    export PYTHONPATH="$BUNDLE/site${PYTHONPATH:+:$PYTHONPATH}"
  else
    tail -20 "$OUT/python-extension.log"
  fi
fi
if "$PYTHON" -c 'import torch, optstate._optstate; assert torch.cuda.is_available()' \
    >"$OUT/python-check.log" 2>&1; then
  OPTSTATED="$SERVER_BIN/optstated" OPTSTATE_REQUIRE_GPU=1 timeout 300 "$PYTHON" -m pytest \
    -p no:cacheprovider -q "$ROOT/tests/gpu/test_cuda_staging.py" 2>&1 | tee "$OUT/staging.log"
  if [[ ${PIPESTATUS[0]} -eq 0 ]]; then
    note "RemoteAdamW CUDA staging tests" "$(tail -1 "$OUT/staging.log")"
  else
    status=1
    note "RemoteAdamW CUDA staging tests" "FAILED: $(tail -1 "$OUT/staging.log")"
  fi
  "$SERVER_BIN/optstated" --backend=cpu --listen=127.0.0.1:0 --threads="$JOBS" \
    >"$OUT/optstated-offload.log" 2>&1 &
  pid=$!
  sleep 3
  port=$(grep -Eo 'listening on port [0-9]+' "$OUT/optstated-offload.log" | grep -Eo '[0-9]+$')
  timeout 420 "$PYTHON" "$ROOT/tests/gpu/bench_offload.py" --target "127.0.0.1:$port" \
    --out "$OUT/bench_offload.json" 2>&1 | tee "$OUT/bench_offload.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { status=1; note "offload benchmark" "FAILED"; }
  kill -TERM $pid 2>/dev/null
  wait $pid
else
  status=1
  note "RemoteAdamW CUDA staging tests, offload benchmark" \
    "NOT RUN: $PYTHON cannot import torch with CUDA and optstate._optstate ($OUT/python-check.log)"
fi

echo
echo "== summary"
printf '%s\n' "${SUMMARY[@]}"
sed -n '/^figure/,$p' "$OUT/bench.log"
[[ -f "$OUT/bench_offload.log" ]] && sed -n '/^optimizer/,$p' "$OUT/bench_offload.log"
exit $status
