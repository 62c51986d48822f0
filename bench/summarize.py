#!/usr/bin/env python3
"""Turns one bench/run.sh results directory into the markdown tables of
BENCHMARKS.md: every figure, its same-run baseline, the ratio and the target.
Each figure is the best of its interleaved repetitions (noise on a shared
machine only ever slows a run down); the spread is shown next to it."""
import collections
import json
import os
import sys


def load_results(path):
    out = []
    if not os.path.exists(path):
        return out
    for line in open(path):
        if line.startswith("RESULT "):
            out.append(json.loads(line[len("RESULT "):]))
    return out


def cmd(results, name):
    path = os.path.join(results, name + ".cmd")
    if not os.path.exists(path):
        return "(not run)"
    # As run.sh logged it, less the prompt and with the run's own folder generic.
    text = open(path).read().strip()
    if text.startswith("$ "):
        text = text[2:]
    return text.replace(os.path.basename(os.path.normpath(results)), "<date>")


def kernel_runs(results):
    """run_name -> list of elem/s over the repetitions."""
    path = os.path.join(results, "kernel.json")
    runs = collections.defaultdict(list)
    if not os.path.exists(path):
        return runs
    for b in json.load(open(path))["benchmarks"]:
        if b.get("run_type") == "iteration":
            runs[b["run_name"]].append(b["elem_per_s"])
    return runs


def verdict(value, target, higher_is_better=True):
    ok = value >= target if higher_is_better else value <= target
    return "met" if ok else "**not met**"


def spread(values, scale=1e6):
    return "%.0f-%.0f" % (min(values) / scale, max(values) / scale)


def main():
    results = sys.argv[1]
    print("## Machine\n")
    print("```")
    print(open(os.path.join(results, "machine.txt")).read().strip())
    print("```\n")

    targets = []  # (target, measured ratio text, verdict)

    # Kernel.
    runs = kernel_runs(results)
    best = {}
    if runs:
        print("## CPU kernel (`bench/kernel`)\n")
        print("Command: `%s`\n" % cmd(results, "kernel"))
        print("Best of the interleaved repetitions; elem/s in millions, GB/s at 28 B/elem "
              "(bf16 gradients move 26 B/elem, reported on the same 28 B scale).\n")
        print("| benchmark | elements | threads | best M elem/s | GB/s | spread M elem/s |")
        print("| --- | ---: | ---: | ---: | ---: | --- |")
        for name in sorted(runs, key=lambda n: (n.split("/")[0], int(n.split("/")[1].split(":")[1]),
                                                 n.split("/")[2])):
            parts = name.split("/")
            kind = parts[0][3:]
            elems = int(parts[1].split(":")[1])
            threads = int(parts[2].split(":")[1])
            b = max(runs[name])
            best[(kind, elems, threads)] = b
            print("| %s | %d | %d | %.0f | %.1f | %s |" % (kind, elems, threads, b / 1e6,
                                                         b * 28 / 1e9, spread(runs[name])))
        print()
        print("| ratio (same run) | elements | threads | kernel / memory pass | "
              "kernel / plain loop |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for elems in sorted({k[1] for k in best}):
            for threads in (1, 2):
                k = best.get(("AdamWKernel_fp32", elems, threads))
                mp = best.get(("MemoryPass", elems, threads))
                pl = best.get(("PlainAdamWLoop", elems, threads))
                if k and mp and pl:
                    print("| | %d | %d | %.2f | %.2f |" % (elems, threads, k / mp, k / pl))
        print()
        n = 64 << 20
        k, mp, pl = (best.get(("AdamWKernel_fp32", n, 2)), best.get(("MemoryPass", n, 2)),
                     best.get(("PlainAdamWLoop", n, 2)))
        if k and mp and pl:
            targets.append(("kernel 2T 64M >= 0.9 x memory pass", "%.2f" % (k / mp),
                            verdict(k / mp, 0.9)))
            targets.append(("kernel 2T 64M >= 2.5 x plain AdamW loop", "%.2f" % (k / pl),
                            verdict(k / pl, 2.5)))
            targets.append(("(plain loop / memory pass, 2T 64M: the most the kernel can gain "
                            "over the plain loop is mem/plain)", "%.2f -> at most %.2fx"
                            % (pl / mp, mp / pl), "context"))

    # End to end.
    e2e = load_results(os.path.join(results, "e2e_lora7b.out"))
    tcp = [r for r in e2e if r["kind"] == "tcp"]
    lora = {(r["wire"], r["clients"]): r for r in e2e if r["kind"] == "e2e"}
    if lora:
        print("## End to end, lora7b (`optstate-bench`)\n")
        print("Command: `%s`\n" % cmd(results, "e2e_lora7b"))
        print("lora7b = 256 tensors x 65,536 elements = 16.8M elements per step, all in one "
              "Step stream per client. Wire GB/s counts gradient bytes sent plus param bytes "
              "returned. bf16 steps from and into float buffers (the client narrows the "
              "gradient and widens the params); bf16-native from and into bf16 buffers, as a "
              "bf16 model holds its tensors (GroupStep buffers made by Of16Bit: no "
              "conversion on the client). Best of the repetitions; spread in M elem/s.\n")
        print("| wire | clients | steps/s | M elem/s | wire GB/s | p50 ms | p99 ms | "
              "server CPU ms/step | client CPU ms/step | echo GB/s | echo server CPU ms/step | "
              "optstate / echo | raw echo GB/s | raw echo CPU ms/step (server + client) | "
              "optstate / raw echo | spread |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
              "| ---: | ---: | ---: | --- |")
        for (wire, clients), r in sorted(lora.items()):
            print("| %s | %d | %.2f | %.1f | %.3f | %.0f | %.0f | %.0f | %.0f | %.3f | %.0f | "
                  "%.2f | %.3f | %.0f + %.0f | %.2f | %s |" % (
                      wire, clients, r["steps_per_s"], r["elem_per_s"] / 1e6, r["wire_Bps"] / 1e9,
                      r["p50_ms"], r["p99_ms"], r["server_cpu_ms_per_step"],
                      r["client_cpu_ms_per_step"], r.get("echo_Bps", 0) / 1e9,
                      r.get("echo_server_cpu_ms_per_step", 0),
                      r["wire_Bps"] / r["echo_Bps"] if r.get("echo_Bps") else 0,
                      r.get("raw_echo_Bps", 0) / 1e9,
                      r.get("raw_echo_server_cpu_ms_per_step", 0),
                      r.get("raw_echo_client_cpu_ms_per_step", 0),
                      r["wire_Bps"] / r["raw_echo_Bps"] if r.get("raw_echo_Bps") else 0,
                      spread(r["elem_per_s_reps"])))
        print()
        floors = [(k, r) for k, r in sorted(lora.items()) if r.get("raw_adamw_Bps")]
        if floors:
            print("The least work an AdamW service over gRPC does, same run "
                  "(`bench/raw_adamw.cc`): the raw echo plus the update on the server and "
                  "the params moved into the caller's buffer (and, for bf16 from float "
                  "buffers, the gradient narrowed) on the client; nothing else. Guarded, "
                  "it adds optstate's guarantees the cheapest way: the whole step's gradient "
                  "checked before any is sent, each chunk copied into its request (the "
                  "caller's memory never lent to gRPC), each message checked on the server "
                  "before any of it is applied.\n")
            print("| wire | clients | minimal GB/s | its CPU ms/step (server + client) | "
                  "optstate / minimal | guarded GB/s | its CPU ms/step (server + client) | "
                  "optstate / guarded | spread minimal | spread guarded |")
            print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
            for (wire, clients), r in floors:
                print("| %s | %d | %.3f | %.0f + %.0f | %.2f | %.3f | %.0f + %.0f | %.2f | %s "
                      "| %s |" % (
                          wire, clients, r["raw_adamw_Bps"] / 1e9,
                          r["raw_adamw_server_cpu_ms_per_step"],
                          r["raw_adamw_client_cpu_ms_per_step"],
                          r["wire_Bps"] / r["raw_adamw_Bps"],
                          r["raw_adamw_guarded_Bps"] / 1e9,
                          r["raw_adamw_guarded_server_cpu_ms_per_step"],
                          r["raw_adamw_guarded_client_cpu_ms_per_step"],
                          r["wire_Bps"] / r["raw_adamw_guarded_Bps"],
                          spread(r["raw_adamw_elem_per_s_reps"]),
                          spread(r["raw_adamw_guarded_elem_per_s_reps"])))
            print()
    if tcp:
        t = tcp[0]
        print("Raw TCP loopback, same run, %d-byte writes: one stream one way %.2f GB/s "
              "(spread %s MB/s); the Step pattern (send chunks, echo thread sends each back) "
              "%.2f GB/s both directions together (spread %s MB/s).\n" % (
                  t["chunk_bytes"], t["one_way_Bps"] / 1e9, spread(t["one_way_reps"]),
                  t["echo_Bps"] / 1e9, spread(t["echo_reps"])))
        print("| | wire GB/s | / raw TCP (Step pattern) | / raw TCP (one way) |")
        print("| --- | ---: | ---: | ---: |")
        for (wire, clients), r in sorted(lora.items()):
            print("| optstate %s x%d | %.3f | %.2f | %.2f |" % (
                wire, clients, r["wire_Bps"] / 1e9, r["wire_Bps"] / t["echo_Bps"],
                r["wire_Bps"] / t["one_way_Bps"]))
            if r.get("echo_Bps"):
                print("| gRPC echo %s x%d | %.3f | %.2f | %.2f |" % (
                    wire, clients, r["echo_Bps"] / 1e9, r["echo_Bps"] / t["echo_Bps"],
                    r["echo_Bps"] / t["one_way_Bps"]))
            if r.get("raw_echo_Bps"):
                print("| gRPC raw echo (no copies) %s x%d | %.3f | %.2f | %.2f |" % (
                    wire, clients, r["raw_echo_Bps"] / 1e9, r["raw_echo_Bps"] / t["echo_Bps"],
                    r["raw_echo_Bps"] / t["one_way_Bps"]))
            for key, label in (("raw_adamw", "minimal AdamW service"),
                               ("raw_adamw_guarded", "minimal AdamW service, guarded")):
                if r.get(key + "_Bps"):
                    print("| %s %s x%d | %.3f | %.2f | %.2f |" % (
                        label, wire, clients, r[key + "_Bps"] / 1e9,
                        r[key + "_Bps"] / t["echo_Bps"], r[key + "_Bps"] / t["one_way_Bps"]))
        print()
    f1, b1, f8 = lora.get(("fp32", 1)), lora.get(("bf16", 1)), lora.get(("fp32", 8))
    if f1 and f1.get("echo_Bps"):
        v = f1["wire_Bps"] / f1["echo_Bps"]
        targets.append(("e2e lora7b 1 client fp32 >= 0.7 x echo bytes/s", "%.2f" % v,
                        verdict(v, 0.7)))
    if f1 and f1.get("raw_echo_Bps"):
        targets.append(("(optstate / raw echo, fp32 x1: the share of gRPC's own ceiling)",
                        "%.2f" % (f1["wire_Bps"] / f1["raw_echo_Bps"]), "context"))
    n1 = lora.get(("bf16-native", 1))
    if f1 and b1:
        v = b1["elem_per_s"] / f1["elem_per_s"]
        targets.append(("bf16 wire >= 1.6 x fp32 elem/s (1 client; float buffers on the "
                        "client, narrowed and widened there)", "%.2f" % v, verdict(v, 1.6)))
    if f1 and n1:
        v = n1["elem_per_s"] / f1["elem_per_s"]
        targets.append(("bf16 wire >= 1.6 x fp32 elem/s (1 client; bf16 buffers on the "
                        "client: a bf16 model's own tensors, ConstBufferView::Of16Bit)", "%.2f" % v,
                        verdict(v, 1.6)))
    if f1 and b1:
        if f1.get("raw_echo_Bps") and b1.get("raw_echo_Bps"):
            # Raw echo elements/s: wire bytes over 2 x bytes per element.
            rf, rb = f1["raw_echo_Bps"] / 8, b1["raw_echo_Bps"] / 4
            targets.append(("(raw echo bf16 / fp32 elem/s: what gRPC alone allows, before any "
                            "optimizer work)", "%.2f" % (rb / rf), "context"))
    if f1 and tcp:
        v = f1["wire_Bps"] / tcp[0]["echo_Bps"]
        targets.append(("e2e wire (fp32, 1 client) >= 0.4 x raw TCP (Step pattern)",
                        "%.2f (one-way TCP: %.2f)" % (v, f1["wire_Bps"] / tcp[0]["one_way_Bps"]),
                        verdict(v, 0.4)))
        if f1.get("raw_echo_Bps"):
            targets.append(("(gRPC raw echo, no payload copies, fp32 x1 / raw TCP: the most "
                            "any gRPC service reaches)",
                            "%.2f" % (f1["raw_echo_Bps"] / tcp[0]["echo_Bps"]), "context"))
        kernel_1t = best.get(("AdamWKernel_fp32", 16 << 20, 1))
        if f1.get("raw_echo_Bps") and kernel_1t:
            # A gRPC service that applies AdamW on these 2 cores spends at least
            # the raw echo's CPU (transport, no copies) plus the kernel's, per step.
            elements = f1["elements_per_step"]
            echo_ms = (f1["raw_echo_server_cpu_ms_per_step"] +
                       f1["raw_echo_client_cpu_ms_per_step"])
            kernel_ms = elements / kernel_1t * 1e3
            wire_per_step = f1["wire_Bps"] / f1["steps_per_s"]
            ceiling = 2 * 1e3 / (echo_ms + kernel_ms) * wire_per_step / tcp[0]["echo_Bps"]
            targets.append(("(ceiling of a gRPC service that runs the update on these 2 cores: "
                            "2 cores / (raw echo CPU %.0f + kernel CPU %.0f ms per fp32 step, "
                            "1 thread at 16M) / raw TCP)" % (echo_ms, kernel_ms),
                            "%.2f" % ceiling, "context"))
        if f1.get("raw_adamw_Bps"):
            tcp_bps = tcp[0]["echo_Bps"]
            targets.append(("(minimal AdamW service, fp32 x1 / raw TCP: gRPC's raw echo plus "
                            "only the update and the copy of params into the caller's buffer)",
                            "%.2f" % (f1["raw_adamw_Bps"] / tcp_bps), "context"))
            floor_ms = (f1["raw_adamw_server_cpu_ms_per_step"] +
                        f1["raw_adamw_client_cpu_ms_per_step"])
            wire_per_step = f1["wire_Bps"] / f1["steps_per_s"]
            targets.append(("(its CPU bound: 2 cores / (its CPU %.0f ms per fp32 step) / raw "
                            "TCP, reached only if both cores never idle)" % floor_ms,
                            "%.2f" % (2 * 1e3 / floor_ms * wire_per_step / tcp_bps), "context"))
            targets.append(("(minimal AdamW service with optstate's guarantees, fp32 x1 / raw "
                            "TCP)", "%.2f" % (f1["raw_adamw_guarded_Bps"] / tcp_bps), "context"))
            targets.append(("(optstate / minimal AdamW service, fp32 x1; / guarded)",
                            "%.2f; %.2f" % (f1["wire_Bps"] / f1["raw_adamw_Bps"],
                                            f1["wire_Bps"] / f1["raw_adamw_guarded_Bps"]),
                            "context"))
    if f1 and f8:
        v = f8["elem_per_s"] / f1["elem_per_s"]
        targets.append(("8 clients aggregate >= 1 x single client elem/s (fp32)", "%.2f" % v,
                        verdict(v, 1.0)))
    b8 = lora.get(("bf16", 8))
    if b1 and b8:
        targets.append(("(same, bf16)", "%.2f" % (b8["elem_per_s"] / b1["elem_per_s"]),
                        verdict(b8["elem_per_s"] / b1["elem_per_s"], 1.0)))

    dense = {r["elements_per_step"]: r for r in
             load_results(os.path.join(results, "e2e_dense.out")) if r["kind"] == "e2e"}
    if dense:
        print("## Linearity: dense groups, fp32 wire, 1 client\n")
        print("Command: `%s`\n" % cmd(results, "e2e_dense"))
        print("| elements | steps/s | M elem/s | ns per element | p50 ms | server CPU ms/step | "
              "spread |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for n, r in sorted(dense.items()):
            print("| %d | %.2f | %.1f | %.2f | %.0f | %.0f | %s |" % (
                n, r["steps_per_s"], r["elem_per_s"] / 1e6, 1e9 / r["elem_per_s"], r["p50_ms"],
                r["server_cpu_ms_per_step"], spread(r["elem_per_s_reps"])))
        print()
        small, large = dense.get(4194304.0), dense.get(67108864.0)
        if small and large:
            v = small["elem_per_s"] / large["elem_per_s"]
            targets.append(("per-element step time 64M / 4M <= 1.25", "%.2f" % v,
                            verdict(v, 1.25, higher_is_better=False)))

    mem = load_results(os.path.join(results, "memory.out"))
    if mem:
        m = mem[0]
        n = m["elements"]
        print("## Daemon memory\n")
        print("Command: `%s`\n" % cmd(results, "memory"))
        print("| elements | idle RSS MiB | RSS after registering MiB | B/elem (total) | "
              "B/elem over idle | RSS after one step MiB | limit 12.5 B/elem + 64 MiB |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        print("| %d | %.1f | %.1f | %.3f | %.3f | %.1f | %.1f |" % (
            n, m["idle_bytes"] / 2**20, m["registered_bytes"] / 2**20,
            m["registered_bytes"] / n, (m["registered_bytes"] - m["idle_bytes"]) / n,
            m["stepped_bytes"] / 2**20, m["limit_bytes"] / 2**20))
        print()
        worst = max(m["registered_bytes"], m["stepped_bytes"])
        targets.append(("daemon RSS <= 12.5 B/elem + 64 MiB (after register and a step)",
                        "%.1f MiB of %.1f MiB" % (worst / 2**20, m["limit_bytes"] / 2**20),
                        verdict(worst, m["limit_bytes"], higher_is_better=False)))

    print("## Targets\n")
    print("| target | measured | verdict |")
    print("| --- | --- | --- |")
    for t in targets:
        print("| %s | %s | %s |" % t)


if __name__ == "__main__":
    main()
