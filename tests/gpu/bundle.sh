#!/usr/bin/env bash
# Builds the GPU checks here and packs them, with the shared libraries the
# device machine lacks (Abseil, gRPC, protobuf: it reaches no package
# registry), into .gpu-bundle/ for a device run:
#   here:   bash tests/gpu/bundle.sh
#   device: BUNDLE=.gpu-bundle bash tests/gpu/run.sh     (carry .gpu-bundle)
# Besides the GPU binaries it packs the same-host CPU benchmarks (optstate-bench,
# kernel) and what tests/gpu/build_python_extension.sh needs to build optstate's
# Python extension there for that machine's own Python: the client's static
# libraries (position-independent), Abseil's headers and nanobind.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build-gpu}
BUNDLE=${BUNDLE:-$ROOT/.gpu-bundle}
PYTHON=${PYTHON:-$ROOT/.torch-venv/bin/python3}
# target:file, the file being what the target's binary is called.
TARGETS=(optstated cuda_kernel_test cuda_backend_test cuda_durability_test cuda_large_paged_test
         gpu_step_bench vram_budget_test paging_policy_test optstate_bench:optstate-bench
         kernel_bench:kernel)

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DOPTSTATE_WITH_CUDA=ON -DOPTSTATE_BUILD_BENCH=ON > "$BUILD.configure.log"
grep -q "CUDA backend ON" "$BUILD.configure.log" || { echo "bundle.sh: nvcc not found" >&2; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]%%:*}"

# The Python extension's C++ part, built as client/python builds it (PIC).
NANOBIND=$("$PYTHON" -c 'import nanobind, os; print(os.path.dirname(nanobind.__file__))')
cmake -S "$ROOT/client/python" -B "$BUILD/python" -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$PYTHON" -Dnanobind_DIR="$NANOBIND/cmake" > "$BUILD.python.configure.log"
cmake --build "$BUILD/python" -j "$(nproc)" --target optstate_client

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib" "$BUNDLE/python/lib" "$BUNDLE/python/include"
for target in "${TARGETS[@]}"; do
  file=${target#*:}
  binary=$(find "$BUILD" -type f -name "$file" -perm -u+x | head -1)
  cp "$binary" "$BUNDLE/bin/"
  # Every shared library but the C and C++ runtimes, which the device has.
  ldd "$binary" | awk '/=> \// {print $3}' |
    grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
    xargs -r -I{} cp -L -n {} "$BUNDLE/lib/"
done
find "$BUILD/python" -name 'liboptstate_*.a' -exec cp {} "$BUNDLE/python/lib/" \;
cp -r /usr/include/absl "$BUNDLE/python/include/"
cp -r "$NANOBIND" "$BUNDLE/python/nanobind"
rm -rf "$BUNDLE/python/nanobind/__pycache__"
du -sh "$BUNDLE"
