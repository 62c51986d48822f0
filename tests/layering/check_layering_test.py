#!/usr/bin/env python3
"""check_layering.py passes the clean fixture tree and rejects each planted violation.

Each folder of fixtures/ is a small source tree (include lines and a comment per
file). The clean one uses every kind of include the floor plan allows; each
other one plants one kind of violation, and the check must report exactly the
expected (file, kind) pairs and exit 1.

Usage: check_layering_test.py (run by ctest as layering_fixtures).
"""
import os
import re
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "check_layering.py")
FIXTURES = os.path.join(HERE, "fixtures")
# `PATH[:LINE]: KIND: what`
VIOLATION = re.compile(r"^([^:\s]+)(?::\d+)?: ([a-z-]+): ")

# Fixture tree -> the violations the check must report, as (file, kind).
EXPECTED = {
    "relative_climb": {("server/engine/step_engine.h", "upward")},
    "angle_bracket_upward": {("server/kernels/adamw_kernel.h", "upward")},
    "grpc_below_rpc": {("server/engine/step_engine.h", "grpc")},
    "protobuf_in_step": {("client/step/step_wire.h", "protobuf")},
    "proto_helper_in_step": {("client/step/plan_chunks.h", "proto")},
    "sibling_transports": {("client/transport/wire/wire_transport.h", "sibling")},
    "state_includes_regions": {("server/state/page_table.h", "upward")},
    "public_includes_internal": {("client/include/optstate/client.h", "internal")},
    "cycle_in_layer": {("server/engine/state_store.h", "cycle")},
    "cycle_across_layers": {("server/engine/step_engine.h", "upward"),
                            ("server/engine/step_engine.h", "cycle")},
    "folder_not_in_plan": {("server/plugins", "folder"), ("client/transport/grpc", "folder")},
    "server_includes_client": {("server/rpc/service.h", "other-side")},
    "client_includes_server": {("client/call/status_mapping.h", "other-side")},
    "binding_includes_internal": {("client/python/src/errors.h", "internal")},
    "binding_includes_grpc": {("client/python/src/module.cc", "grpc")},
}


def run_check(tree):
    """The check's exit status and its violations as a set of (file, kind)."""
    result = subprocess.run([sys.executable, CHECK, os.path.join(FIXTURES, tree)],
                            capture_output=True, text=True)
    found = set()
    for line in result.stdout.splitlines():
        match = VIOLATION.match(line)
        if match:
            found.add(match.groups())
    return result.returncode, found, result.stdout + result.stderr


class CheckLayeringTest(unittest.TestCase):
    def test_clean_tree_passes(self):
        status, found, output = run_check("clean")
        self.assertEqual(found, set(), output)
        self.assertEqual(status, 0, output)

    def test_each_planted_violation_is_reported_exactly(self):
        for tree, expected in EXPECTED.items():
            with self.subTest(tree=tree):
                status, found, output = run_check(tree)
                self.assertEqual(found, expected, output)
                self.assertEqual(status, 1, output)

    def test_every_fixture_tree_has_expectations(self):
        trees = set(os.listdir(FIXTURES)) - {"clean"}
        self.assertEqual(trees, set(EXPECTED))


if __name__ == "__main__":
    unittest.main()
