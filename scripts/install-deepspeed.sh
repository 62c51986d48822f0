#!/usr/bin/env bash
# Installs DeepSpeed (pinned) into .torch-venv for bench/python/deepspeed_cpu_adam.py,
# the same-run DeepSpeedCPUAdam baseline of the CPU kernel. Not part of `make test`.
# No op is prebuilt (DS_BUILD_OPS=0): DeepSpeed JIT-builds its CPU Adam op with
# torch's cpp_extension and ninja (a deepspeed requirement, from PyPI) on first
# use. Installs torch first when missing (scripts/install-torch.sh); the
# constraints keep pip from replacing the venv's torch or numpy. Cheap when the
# pinned version is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.torch-venv
version=0.19.8
bash scripts/install-torch.sh
if "$venv/bin/python3" - <<PY 2>/dev/null
import sys
from importlib.metadata import version
version("ninja")  # Raises (so exits non-zero) when ninja is missing.
sys.exit(version("deepspeed") != "$version")
PY
then
  exit 0
fi
echo "install-deepspeed: installing deepspeed $version into $venv"
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$venv/bin/python3" - > "$constraints" <<'PY'
from importlib.metadata import version
for name in ("torch", "numpy"):
    print(f"{name}=={version(name)}")
PY
# No build isolation: setup.py imports the venv's torch (with isolation pip
# would fetch another torch into a temporary build env). DS_ACCELERATOR=cpu:
# the machine has no GPU; DeepSpeed's CPU accelerator builds the CPU ops.
DS_BUILD_OPS=0 DS_ACCELERATOR=cpu "$venv/bin/python3" -m pip install --quiet \
  --disable-pip-version-check --no-build-isolation -c "$constraints" "deepspeed==$version"
