#!/usr/bin/env bash
# Installs the Bochs CPU emulator's Python binding (bochscpu-python, pinned)
# into .torch-venv for tests/emulated: the kernel's AVX-512 machine code run
# in an emulated CPU that has AVX-512, on machines whose CPU does not. The
# wheel (cp311, manylinux_2_28) brings Bochs itself. Installs torch's venv
# first when missing (scripts/install-torch.sh; the test uses its numpy).
# Cheap when the pinned version is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.torch-venv
version=0.4.0
bash scripts/install-torch.sh
if "$venv/bin/python3" - <<PY 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(version("bochscpu-python") != "$version")
PY
then
  exit 0
fi
echo "install-emulator: installing bochscpu-python $version into $venv"
# --no-deps: the wheel lists its build tools (nanobind, setuptools, wheel) as
# requirements; the built extension needs none of them, and the venv's
# nanobind is pinned by scripts/install-python.sh.
"$venv/bin/python3" -m pip install --quiet --disable-pip-version-check --no-deps \
  "bochscpu-python==$version"
