#!/usr/bin/env python3
"""Checks the floor plan (docs/architecture.md) on the include lines.

Each folder of server/ is a layer; a file may include its own layer and the
layers below it, never one above:
  server (assembly) -> rpc -> engine -> backends -> state -> kernels -> base
regions/ (shared-memory regions) sits beside state/: it sees state, kernels
and base, and engine, rpc and the assembly may see it.
Inside backends/, cpu/ and cuda/ sit on the StepBackend interface beside them,
and cuda/paging/ (pure bookkeeping) sees no other part of the CUDA backend.
Only rpc/, the assembly and probe/ (optstate-probe, a program beside the
daemon that includes none of its layers) see gRPC or protobuf. client/ and
common/ see no server code; common/ and the proto helpers see no client code. The client's
public headers (client/include/) include neither gRPC nor protobuf nor the
proto helpers (optstate/v1/...), nor client/ internals: users see optstate's
own types only.

Usage: check_layering.py SOURCE_ROOT. Prints every violation, one a line, and
exits 1 when there is any.
"""
import os
import re
import sys

# Folders (relative to the source root) and the folders their files may include.
BELOW = {
    "server/base": [],
    "server/kernels": ["server/base"],
    "server/state": ["server/kernels", "server/base"],
    "server/backends": ["server/state", "server/kernels", "server/base"],
    "server/backends/cpu": ["server/backends", "server/state", "server/kernels", "server/base"],
    "server/backends/cuda/paging": ["server/state", "server/kernels", "server/base"],
    "server/backends/cuda": ["server/backends/cuda/paging", "server/backends", "server/state",
                             "server/kernels", "server/base"],
    "server/regions": ["server/state", "server/kernels", "server/base"],
    "server/engine": ["server/regions", "server/backends", "server/state", "server/kernels",
                      "server/base"],
    "server/durability": ["server/engine", "server/regions", "server/backends", "server/state",
                          "server/kernels", "server/base"],
    "server/rpc": ["server/durability", "server/regions", "server/engine", "server/backends",
                   "server/state", "server/kernels", "server/base"],
    "server": ["server/rpc", "server/durability", "server/regions", "server/engine",
               "server/backends", "server/backends/cpu",
               "server/backends/cuda", "server/backends/cuda/paging", "server/state",
               "server/kernels", "server/base"],
    # optstate-probe, a program of its own: gRPC and the health proto only.
    "server/probe": [],
    "client": [],
    "common": [],
    "proto": [],
}
# Prefixes of headers only the layers named may include.
RPC_HEADERS = re.compile(r'^(grpc/|grpcpp/|google/protobuf/|optstate/v1/.*\.pb\.h$)')
MAY_SEE_RPC = {"server", "server/rpc", "server/probe", "client", "proto"}
# What a public client header may not include: transport and serialization
# types (and the client's internals, which carry them).
NOT_PUBLIC = re.compile(r'^(grpc[^/]*/|google/protobuf/|optstate/v1/|client/)')
PUBLIC_CLIENT = "client/include"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE = re.compile(r'\.(h|cc|cu|cuh)$')


def layer_of(path):
    """The deepest folder of BELOW that holds `path` (a path from the root)."""
    folder = os.path.dirname(path)
    while folder:
        if folder in BELOW:
            return folder
        folder = os.path.dirname(folder)
    return None


def included_layer(include):
    """The layer a quoted include names, or None for third-party headers."""
    if include.startswith(("server/", "client/")):
        return layer_of(include)
    if include.startswith("common/"):
        return "common"
    if include.startswith("optstate/v1/"):
        return "proto"
    if include == "optstate/dtype.h" or include.startswith("optstate/") and include in COMMON_PUBLIC:
        return "common"
    if include.startswith("optstate/"):
        return "client"
    return None


COMMON_PUBLIC = set()


def check(root):
    for dirpath, _, files in os.walk(os.path.join(root, "common", "include", "optstate")):
        for f in files:
            COMMON_PUBLIC.add("optstate/" + f)
    problems = []
    for top in ("server", "client", "common", "proto"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not SOURCE.search(f):
                    continue
                path = os.path.relpath(os.path.join(dirpath, f), root)
                layer = layer_of(path)
                with open(os.path.join(root, path), encoding="utf-8") as source:
                    for number, line in enumerate(source, 1):
                        match = INCLUDE.match(line)
                        if not match:
                            continue
                        include = match.group(1)
                        if path.startswith(PUBLIC_CLIENT + "/") and NOT_PUBLIC.match(include):
                            problems.append(f"{path}:{number}: a public client header includes "
                                            f"{include} (no gRPC, protobuf or client internals)")
                            continue
                        if RPC_HEADERS.match(include) and layer not in MAY_SEE_RPC:
                            problems.append(f"{path}:{number}: {layer}/ may not see gRPC or "
                                            f"protobuf, includes {include}")
                            continue
                        target = included_layer(include)
                        if target is None or target == layer or target == "common":
                            continue
                        if target == "proto" and layer in MAY_SEE_RPC:
                            continue
                        if target not in BELOW.get(layer, []):
                            problems.append(f"{path}:{number}: {layer}/ includes {include} "
                                            f"({target}/ is not below it)")
    return problems


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    problems = check(sys.argv[1])
    for p in problems:
        print(p)
    print(f"layering: {len(problems)} include(s) against the floor plan")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
