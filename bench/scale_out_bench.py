#!/usr/bin/env python3
"""One daemon against three on the same tensors, in one run, across stand-in hosts (network
namespaces, tests/python/netns_hosts.py; needs root): the step's time with one daemon and
with three, each member's own time when stepped alone, and the three-daemon step against
the longest member's time (overlap: about 1.0 when the members' streams run side by side,
the sum of their times / the longest when they take turns). Plain links, then every link
behind 1 ms of delay (a proxy) and a rate limit (tc tbf).

A 2-core machine cannot show CPU scaling (three daemons share the cores the one had); what
it shows is the overlap, and the share of the links' rate a step reaches under the limit.

  sudo .torch-venv/bin/python bench/scale_out_bench.py --elements 16000000 --rate 1gbit
Prints one "RESULT {json}" line per configuration.
"""
import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
os.environ.setdefault("OPTSTATED", str(ROOT / "build" / "server" / "optstated"))

import optstate  # noqa: E402
from netns_hosts import DelayProxy, Hosts  # noqa: E402


def median_step_seconds(client, groups, grads, outs, steps, first_step):
    times = []
    for i in range(steps):
        batch = [(n, grads[n], outs[n]) for n in groups]
        started = time.perf_counter()
        client.step(batch, first_step + i)
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def measure(hosts, targets, groups, steps, label, rate_bits):
    rng = np.random.default_rng(0)
    grads = {n: rng.standard_normal(size).astype(np.float32) for n, size in groups.items()}
    outs = {n: np.empty_like(g) for n, g in grads.items()}
    identities = [h.target for h in hosts]
    members = [{"target": t, "identity": i} for t, i in zip(targets, identities)]
    three = optstate.Client(members, data_plane="wire")
    one = optstate.Client(targets[0], data_plane="wire")
    prefix = f"{label}."
    named = {prefix + n: s for n, s in groups.items()}
    grads = {prefix + n: g for n, g in grads.items()}
    outs = {prefix + n: o for n, o in outs.items()}
    for n, s in named.items():
        three.register(n, s)
        one.register("one." + n, s)
    one_grads = {"one." + n: g for n, g in grads.items()}
    one_outs = {"one." + n: o for n, o in outs.items()}
    step = 1
    # Warm: one step each.
    median_step_seconds(three, list(named), grads, outs, 1, step)
    median_step_seconds(one, list(one_grads), one_grads, one_outs, 1, step)
    step += 1
    t_three = median_step_seconds(three, list(named), grads, outs, steps, step)
    t_one = median_step_seconds(one, list(one_grads), one_grads, one_outs, steps, step)
    step += steps
    # Each member's part alone.
    parts = {}
    for n in named:
        parts.setdefault(three.member_of(n), []).append(n)
    alone = {}
    for member, names in parts.items():
        alone[member] = median_step_seconds(three, names, grads, outs, steps, step)
    longest = max(alone.values())
    total = sum(alone.values())
    elements = sum(named.values())
    result = {
        "label": label, "elements": elements, "steps": steps,
        "one_daemon_s": round(t_one, 4), "three_daemons_s": round(t_three, 4),
        "ratio_one_over_three": round(t_one / t_three, 3),
        "members_alone_s": {m: round(s, 4) for m, s in alone.items()},
        "overlap_three_over_longest": round(t_three / longest, 3),
        "sum_over_longest": round(total / longest, 3),
    }
    if rate_bits:
        # Each link carries the gradients one way and the params the other, each direction
        # at `rate`: the share of the three links' rate in one direction.
        result["link_share"] = round(4 * elements * 8 / t_three / (3 * rate_bits), 3)
    print("RESULT " + json.dumps(result), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=16_000_000)
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rate", default="1gbit", help="tc tbf rate for the limited run")
    parser.add_argument("--delay", type=float, default=0.001)
    args = parser.parse_args()
    size = args.elements // args.groups
    groups = {f"w{i:03d}": size for i in range(args.groups)}
    cpu = open("/proc/cpuinfo").read().split("model name")[1].split(":", 1)[1].splitlines()[0]
    print(f"CPU: {cpu.strip()}, {os.cpu_count()} cores", flush=True)
    hosts = Hosts(3)
    try:
        for h in hosts:
            h.start("--threads=1")
        measure(hosts, [h.target for h in hosts], groups, args.steps, "plain", 0)
        for h in hosts:
            h.limit_rate(args.rate)
        proxies = [DelayProxy(h.target, args.delay) for h in hosts]
        try:
            bits = float(args.rate.rstrip("bit").replace("g", "e9").replace("m", "e6"))
            measure(hosts, [p.target for p in proxies], groups, args.steps, "limited", bits)
        finally:
            for p in proxies:
                p.close()
    finally:
        hosts.close()


if __name__ == "__main__":
    main()
