#!/usr/bin/env python3
"""Checks the floor plan (docs/architecture.md) on the include lines.

The floor plan:
1. Layers are folders. A file's layer is the deepest folder of LAYERS that
   holds it; every folder under server/, client/, common/ and proto/ is a
   layer or one of HEADER_FOLDERS (client/python/ outside src/ holds Python
   and is not checked). A new folder is a violation until it has a place.
2. A file includes its own layer and what LAYERS lists for it, nothing else:
   server (assembly) -> metrics -> rpc -> auth -> durability -> engine -> backends ->
   state -> kernels -> base (auth sees engine and base only), with regions/ beside state/ (it sees state; state does
   not see it); client (assembly) -> transport/{wire,shared_memory} (not
   each other) -> transport -> call, step -> include (the public API); the
   Python binding (client/python/src) sees the public API only. The client
   sees common's public headers only (optstate/dtype.h...), but for
   transport/shared_memory, which speaks the region protocol. common/ sees
   nothing of ours but itself; proto/ (the hand-written helpers,
   optstate/v1/*.h) sees common/.
3. Server and client share only common/ and proto/: neither includes the
   other.
4. gRPC and protobuf headers (grpc/, grpcpp/, google/protobuf/, generated
   *.pb.h) are seen only by server/rpc, the server assembly, server/probe
   (optstate-probe, which includes none of the daemon's layers), client/call,
   client/transport with its two transports, the client assembly and proto/.
   The client's public headers, its step logic and the Python binding see
   none of them, and no proto helper either. nanobind is the Python
   binding's alone, prometheus-cpp (prometheus/) server/metrics' alone.
5. No include cycle between files of the tree, inside a layer or across.

Every include counts, quoted or in angle brackets. A quoted include is looked
up next to the including file first (as the preprocessor does), then under the
include roots (the source root, client/include, common/include, proto); an
angle-bracket one under the include roots only. So "../rpc/x.h" is the file
it reaches and "optstate/x.h" belongs to client/include or common/include,
whichever holds the file. Headers that are no file of the tree (absl, the
standard library, the system, generated protobuf) are told by their names.

Usage: check_layering.py SOURCE_ROOT. Prints every violation, one a line, as
`PATH[:LINE]: KIND: what`, then a summary; exits 1 when there is any.
KIND is one of: upward, sibling, other-side, internal, proto, grpc, protobuf,
nanobind, prometheus-cpp, outside, cycle, folder.
"""
import collections
import os
import re
import sys

# What is not a folder of ours but may be restricted like a layer.
GRPC, PROTOBUF, NANOBIND, PROMETHEUS = "gRPC", "protobuf", "nanobind", "prometheus-cpp"
RPC = [GRPC, PROTOBUF]
COMMON = ["common/include", "common"]  # common's public headers and the rest of it
PUBLIC_COMMON = ["common/include"]  # optstate/dtype.h and its like, as users see them

# The layers (folders from the source root) and what their files may include
# besides their own layer: other layers, and GRPC, PROTOBUF, NANOBIND, PROMETHEUS.
LAYERS = {
    # Server, bottom up.
    # base: threads, logs, byte buffers; nothing of ours.
    "server/base": COMMON,
    # kernels: the AdamW math on plain pointers.
    "server/kernels": ["server/base"] + COMMON,
    # state: a group's arrays, geometry and page steps.
    "server/state": ["server/kernels", "server/base"] + COMMON,
    # regions: shared-memory regions, beside state (it sees state, not the reverse).
    "server/regions": ["server/state", "server/kernels", "server/base"] + COMMON,
    # backends: the StepBackend interface, seen by both implementations.
    "server/backends": ["server/state", "server/kernels", "server/base"] + COMMON,
    # backends/cpu: host memory and the CPU kernel.
    "server/backends/cpu": ["server/backends", "server/state", "server/kernels",
                            "server/base"] + COMMON,
    # backends/cuda/paging: pure bookkeeping, no other part of the CUDA backend.
    "server/backends/cuda/paging": ["server/state", "server/kernels", "server/base"] + COMMON,
    # backends/cuda: resident or paged groups on a device.
    "server/backends/cuda": ["server/backends/cuda/paging", "server/backends", "server/state",
                             "server/kernels", "server/base"] + COMMON,
    # engine: the state store and exactly-once steps.
    "server/engine": ["server/regions", "server/backends", "server/state", "server/kernels",
                      "server/base"] + COMMON,
    # durability: export, import and checkpoints.
    "server/durability": ["server/engine", "server/regions", "server/backends", "server/state",
                          "server/kernels", "server/base"] + COMMON,
    # auth: who calls (tokens, SPIFFE IDs) and tenants' quotas; above engine
    # (it implements engine's TenantQuotas), no gRPC.
    "server/auth": ["server/engine", "server/base"] + COMMON,
    # rpc: the gRPC edge, the only server layer below the assembly that sees gRPC.
    "server/rpc": ["server/auth", "server/durability", "server/regions", "server/engine", "server/backends",
                   "server/state", "server/kernels", "server/base", "proto"] + COMMON + RPC,
    # metrics: the daemon's metrics for Prometheus (prometheus-cpp), read from
    # the layers below; no gRPC of its own.
    "server/metrics": ["server/rpc", "server/auth", "server/durability", "server/regions", "server/engine",
                       "server/backends", "server/state", "server/kernels",
                       "server/base"] + COMMON + [PROMETHEUS],
    # server: the assembly (flags, backend choice, serving).
    "server": ["server/metrics", "server/rpc", "server/auth", "server/durability", "server/regions", "server/engine",
               "server/backends", "server/backends/cpu", "server/backends/cuda",
               "server/backends/cuda/paging", "server/state", "server/kernels",
               "server/base", "proto"] + COMMON + RPC,
    # server/probe: optstate-probe, a program beside the daemon that includes
    # none of its layers: gRPC and the health proto only.
    "server/probe": RPC,

    # Client, bottom up.
    # include: the public API (optstate/*.h as users include them); optstate's own types only.
    "client/include": PUBLIC_COMMON,
    # step: transport-free step logic (chunks, narrowing, checks).
    "client/step": ["client/include"] + PUBLIC_COMMON,
    # placement: which member holds a group (rendezvous hashing); no gRPC.
    "client/placement": ["client/include"] + PUBLIC_COMMON,
    # call: gRPC calls (status mapping, the retry loop, deadlines, the channel).
    "client/call": ["client/include", "proto"] + PUBLIC_COMMON + RPC,
    # transport: the StepTransport interface and what both transports share.
    "client/transport": ["client/step", "client/call", "client/include",
                         "proto"] + PUBLIC_COMMON + RPC,
    # transport/wire: step bytes in gRPC messages; not the shared-memory transport.
    "client/transport/wire": ["client/transport", "client/step", "client/call",
                              "client/include", "proto"] + PUBLIC_COMMON + RPC,
    # transport/shared_memory: step bytes in a region; the only client folder
    # that speaks the region protocol (common/region_protocol.h); not the wire.
    "client/transport/shared_memory": ["client/transport", "client/step", "client/call",
                                       "client/include", "proto"] + COMMON + RPC,
    # client: Client itself, assembled from the folders above; it holds the
    # channel and stub and makes the unary calls, so it sees gRPC.
    "client": ["client/transport/wire", "client/transport/shared_memory", "client/transport",
               "client/call", "client/step", "client/placement", "client/include",
               "proto"] + PUBLIC_COMMON + RPC,
    # python/src: the nanobind binding, on the public API only.
    "client/python/src": ["client/include", NANOBIND] + PUBLIC_COMMON,

    # Both ends.
    # common/include: common's public headers (optstate/dtype.h).
    "common/include": [],
    # common: wire element types, the region protocol, CPU features.
    "common": ["common/include"],
    # proto: the hand-written helpers of the wire contract (optstate/v1/*.h).
    "proto": COMMON + RPC,
}
# Folders that hold a layer's headers under their include path, not layers.
HEADER_FOLDERS = {"client/include/optstate", "common/include/optstate", "proto/optstate",
                  "proto/optstate/v1"}
# The Python package beside the binding: not C++, not checked.
PYTHON_PACKAGE, BINDING = "client/python", "client/python/src"
# Where the checked files are, and where an include is looked up (the build's -I).
TOPS = ("server", "client", "common", "proto")
INCLUDE_ROOTS = ("", "client/include", "common/include", "proto")
# Layers that see the client's public headers only.
PUBLIC_ONLY = ("client/include", BINDING)
# A project file that is in no layer (tests/, examples/...), as an include's target.
OUTSIDE = "outside"

INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<([^>]+)>)')
SOURCE = re.compile(r'\.(h|hpp|cc|cpp|cu|cuh|inc)$')


def under(path, folder):
    return path == folder or path.startswith(folder + "/")


def ignored(folder):
    """Whether a folder is the Python package's (checked neither for place nor includes)."""
    return under(folder, PYTHON_PACKAGE) and not under(folder, BINDING)


def layer_of(path):
    """The deepest folder of LAYERS that holds `path` (a path from the root), or None."""
    folder = os.path.dirname(path)
    while folder:
        if folder in LAYERS:
            return folder
        folder = os.path.dirname(folder)
    return None


def side(layer):
    """'server' or 'client' for their layers; None for common, proto and the rest."""
    for top in ("server", "client"):
        if under(layer, top):
            return top
    return None


def third_party(name):
    """GRPC, PROTOBUF, NANOBIND or PROMETHEUS for their headers (generated ones included), else None."""
    if name.startswith(("grpc/", "grpcpp/")) or name.endswith(".grpc.pb.h"):
        return GRPC
    if name.startswith("google/protobuf/") or name.endswith(".pb.h"):
        return PROTOBUF
    if name.startswith("nanobind/"):
        return NANOBIND
    if name.startswith("prometheus/"):
        return PROMETHEUS
    return None


def in_tree(root, path):
    """Whether `path` (normalised) is a file under the root."""
    outside = os.path.isabs(path) or path == ".." or path.startswith("../")
    return not outside and os.path.isfile(os.path.join(root, path))


def resolve(root, includer, name, quoted):
    """The file of the tree an include names, as a path from the root, or None."""
    if quoted:
        nearby = os.path.normpath(os.path.join(os.path.dirname(includer), name))
        if in_tree(root, nearby):
            return nearby
    for base in INCLUDE_ROOTS:
        candidate = os.path.normpath(os.path.join(base, name))
        if in_tree(root, candidate):
            return candidate
    return None


def layer_by_name(includer, name, quoted):
    """The layer of an include that names no file of the tree, by its name, or None."""
    if quoted and name.startswith(("./", "../")):
        name = os.path.normpath(os.path.join(os.path.dirname(includer), name))
    if name.startswith(("server/", "client/", "common/", "proto/")):
        return layer_of(name)
    if name.startswith("optstate/v1/"):
        return "proto"
    if name.startswith("optstate/"):
        return "client/include"
    return None


def target_of(root, includer, name, quoted):
    """(what an include brings in: a layer, GRPC, PROTOBUF, NANOBIND, PROMETHEUS, OUTSIDE or None
    for what is free to all; the file of the tree it names or None)."""
    kind = third_party(name)
    if kind:
        return kind, None
    path = resolve(root, includer, name, quoted)
    if path:
        return layer_of(path) or OUTSIDE, path
    return layer_by_name(includer, name, quoted), None


def client_internal(layer):
    """Whether a layer is of the client's insides (not its public API or the binding)."""
    return under(layer, "client") and layer not in PUBLIC_ONLY


def violation(layer, target):
    """The kind of violation of `layer` including `target`, and why; None when allowed."""
    if target is None or target == layer or target in LAYERS[layer]:
        return None
    if target in (GRPC, PROTOBUF, NANOBIND, PROMETHEUS):
        return target.lower(), f"{layer}/ may not see {target}"
    if target == OUTSIDE:
        return "outside", f"{layer}/ may include no file outside the layers"
    if side(layer) and side(target) and side(layer) != side(target):
        return "other-side", "server and client share only common/ and proto/"
    if target == "proto":
        return "proto", f"{layer}/ may not see the proto helpers"
    if layer in PUBLIC_ONLY and client_internal(target):
        return "internal", f"{layer}/ sees the client's public headers only, not {target}/"
    if target == "common" and "common/include" in LAYERS[layer]:
        return "internal", f"{layer}/ sees common's public headers only, not common/"
    if layer in LAYERS.get(target, ()):
        return "upward", f"{target}/ is above {layer}/"
    return "sibling", f"{target}/ is beside {layer}/, not below it"


def includes(root, path):
    """Each include of a file: (line number, name as written, quoted)."""
    with open(os.path.join(root, path), encoding="utf-8") as source:
        for number, line in enumerate(source, 1):
            match = INCLUDE.match(line)
            if match:
                quoted = match.group(1) is not None
                yield number, match.group(1) if quoted else match.group(2), quoted


def walk(root):
    """The checked files (paths from the root) and the folders that have no place."""
    files, misplaced = [], []
    for top in TOPS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            folder = os.path.relpath(dirpath, root)
            if ignored(folder):
                continue
            if folder not in LAYERS and folder not in HEADER_FOLDERS:
                misplaced.append(folder)
            files += [os.path.join(folder, f) for f in sorted(filenames) if SOURCE.search(f)]
    return files, misplaced


def shortest_cycle(graph, start):
    """The shortest include path from `start` back to it, or None."""
    came_from, todo = {}, collections.deque([start])
    while todo:
        node = todo.popleft()
        for nxt, _ in graph.get(node, ()):
            if nxt == start:
                cycle = [start]
                while node != start:
                    cycle.insert(1, node)
                    node = came_from[node]
                return cycle + [start]
            if nxt not in came_from:
                came_from[nxt] = node
                todo.append(nxt)
    return None


def reachable(graph, start):
    """The files `start` reaches through one or more includes."""
    seen, todo = set(), [start]
    while todo:
        for nxt, _ in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def cycles(graph):
    """One cycle per knot (files that all reach each other), from the knot's least
    file: (file, line of its include, cycle, files in the knot)."""
    reverse = {}
    for node, edges in graph.items():
        for nxt, _ in edges:
            reverse.setdefault(nxt, []).append((node, 0))
    found, knotted = [], set()
    for start in sorted(graph):
        if start in knotted:
            continue
        knot = reachable(graph, start) & reachable(reverse, start)
        if start in knot:
            knotted |= knot
            cycle = shortest_cycle(graph, start)
            line = next(n for nxt, n in graph[start] if nxt == cycle[1])
            found.append((start, line, cycle, len(knot)))
    return found


def check(root):
    """Every violation of the floor plan in the tree at `root`, one line each."""
    files, misplaced = walk(root)
    problems = [f"{folder}: folder: folder {folder} has no place in the floor plan "
                f"(tests/layering/check_layering.py)" for folder in misplaced]
    graph = {}
    for path in files:
        layer = layer_of(path)
        edges = graph.setdefault(path, [])
        for number, name, quoted in includes(root, path):
            target, target_file = target_of(root, path, name, quoted)
            if target_file:
                edges.append((target_file, number))
            problem = violation(layer, target)
            if problem:
                kind, why = problem
                written = f'"{name}"' if quoted else f"<{name}>"
                if target_file and target_file != name:
                    written += f" ({target_file})"
                problems.append(f"{path}:{number}: {kind}: includes {written}; {why}")
    for path, number, cycle, size in cycles(graph):
        knot = f" (one cycle of a knot of {size} files that all reach each other)" \
            if size > len(cycle) - 1 else ""
        problems.append(f"{path}:{number}: cycle: {' -> '.join(cycle)}{knot}")
    return problems


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    problems = check(sys.argv[1])
    for p in problems:
        print(p)
    print(f"layering: {len(problems)} violation(s) of the floor plan")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
