#!/usr/bin/env bash
# Builds the GPU checks here and packs them, with the shared libraries the
# device machine lacks (Abseil, gRPC, protobuf: it reaches no package
# registry), into .gpu-bundle/ for a device run:
#   here:   bash tests/gpu/bundle.sh
#   device: BUNDLE=.gpu-bundle bash tests/gpu/run.sh     (carry .gpu-bundle)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build-gpu}
BUNDLE=${BUNDLE:-$ROOT/.gpu-bundle}
TARGETS=(optstated cuda_kernel_test cuda_backend_test cuda_durability_test cuda_large_paged_test
         gpu_step_bench vram_budget_test paging_policy_test)

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DOPTSTATE_WITH_CUDA=ON -DOPTSTATE_BUILD_BENCH=ON > "$BUILD.configure.log"
grep -q "CUDA backend ON" "$BUILD.configure.log" || { echo "bundle.sh: nvcc not found" >&2; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]}"

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
for target in "${TARGETS[@]}"; do
  binary=$(find "$BUILD" -type f -name "$target" -perm -u+x | head -1)
  cp "$binary" "$BUNDLE/bin/"
  # Every shared library but the C and C++ runtimes, which the device has.
  ldd "$binary" | awk '/=> \// {print $3}' |
    grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
    xargs -r -I{} cp -L -n {} "$BUNDLE/lib/"
done
du -sh "$BUNDLE"
