#!/usr/bin/env bash
# Builds optstate's Python extension (optstate._optstate) for this machine's
# Python from what tests/gpu/bundle.sh packed, on a GPU machine that has a
# compiler and Python's headers but not the project's build dependencies
# (gRPC, protobuf, Abseil: it reaches no package registry). The client's C++
# libraries come prebuilt in the bundle; only the bindings and nanobind are
# compiled here, against this Python.
#
#   BUNDLE=.gpu-bundle PYTHON=python3 bash tests/gpu/build_python_extension.sh DEST
#
# DEST then holds the package optstate/ (add DEST to PYTHONPATH); the bundle's
# lib/ must be on LD_LIBRARY_PATH when it is imported.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUNDLE=$(cd "${BUNDLE:?set BUNDLE to the folder tests/gpu/bundle.sh made}" && pwd)
PYTHON=${PYTHON:-python3}
DEST=${1:?usage: build_python_extension.sh DEST}
CXX=${CXX:-g++}
mkdir -p "$DEST/optstate"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

PY_INCLUDE=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
SUFFIX=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
[[ -f "$PY_INCLUDE/Python.h" ]] || { echo "build_python_extension: no Python.h in $PY_INCLUDE" >&2; exit 1; }
NB=$BUNDLE/python/nanobind
COMMON_FLAGS=(-O3 -DNDEBUG -fPIC -fvisibility=hidden -fno-stack-protector -ffunction-sections
              -fdata-sections -std=c++17 -I"$PY_INCLUDE" -I"$NB/include")

# The flags nanobind's own CMake gives its static library and a module.
compile() {  # source object flags...
  local source=$1 object=$2
  shift 2
  "$CXX" "${COMMON_FLAGS[@]}" "$@" -c "$source" -o "$object"
}
pids=()
for name in common error implicit nb_datetime nb_enum nb_func nb_internals nb_ndarray \
            nb_static_property nb_type trampoline; do
  compile "$NB/src/$name.cpp" "$WORK/nb_$name.o" -DNB_BUILD -DNB_COMPACT_ASSERTIONS \
    -fno-strict-aliasing -isystem "$NB/ext/robin_map/include" &
  pids+=($!)
done
for source in "$ROOT"/client/python/src/*.cc; do
  name=$(basename "$source" .cc)
  # As client/python/CMakeLists.txt: the per-tensor loops for speed, the rest for size.
  case $name in prepared_step | step_entries | buffers) speed=-O2 ;; *) speed= ;; esac
  # <cstdint> first: some of Abseil 20220623's headers use its types without
  # including it, and GCC 13's standard headers (Ubuntu 24.04's) may not bring
  # it in on the way as GCC 12's do.
  compile "$source" "$WORK/$name.o" -Os $speed -include cstdint -Wall -Wextra \
    -Wno-unused-parameter \
    -I"$ROOT/client/python/src" -I"$ROOT/client/include" -I"$ROOT/common/include" \
    -isystem "$BUNDLE/python/include" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done

"$CXX" -shared -fPIC -Wl,-s -Wl,--gc-sections -o "$DEST/optstate/_optstate$SUFFIX" "$WORK"/*.o \
  -Wl,--start-group "$BUNDLE"/python/lib/*.a -Wl,--end-group \
  -Wl,--as-needed "$BUNDLE"/lib/*.so* -Wl,--no-as-needed -pthread -ldl -lrt -latomic
cp "$ROOT"/client/python/optstate/*.py "$DEST/optstate/"
echo "build_python_extension: $DEST/optstate/_optstate$SUFFIX"
