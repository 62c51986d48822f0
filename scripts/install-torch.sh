#!/usr/bin/env bash
# Installs torch from PyPI into .torch-venv for the torch parity test
# (tests/torch: the AdamW step held against torch.optim.AdamW itself). Cheap
# when that version is already there. About 5 GB on disk (a 2.8 GB download
# from PyPI): the wheel brings its CUDA libraries, though the test runs torch
# on the CPU. numpy comes along so torch does not warn about its absence.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.torch-venv
version=2.15.0
if "$venv/bin/python3" -c "import sys, numpy, torch; sys.exit(torch.__version__.split('+')[0] != '$version')" \
    2>/dev/null; then
  exit 0
fi
echo "install-torch: installing torch $version into $venv"
python3 -m venv "$venv"
"$venv/bin/python3" -m pip install --quiet --disable-pip-version-check "torch==$version" numpy
