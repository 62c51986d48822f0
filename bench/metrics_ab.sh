#!/usr/bin/env bash
# The metrics' cost, same run: optstate-bench (lora7b, fp32, wire and shared
# memory) against a daemon with --metrics_listen off, then on with /metrics
# scraped every second (harder than Prometheus' default 15 s), interleaved
# for ROUNDS rounds; prints each side's figures and the on / off median
# ratios. Usage: bench/metrics_ab.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
build=${1:-build}
rounds=${2:-7}
bench="$build/bench/optstate-bench"
[ -x "$bench" ] || { echo "metrics_ab: build $bench first (make build)" >&2; exit 1; }
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
out=$(mktemp -d /tmp/optstate-metrics-ab.XXXXXX)
trap 'rm -rf "$out"' EXIT
run() {  # SIDE ROUND [daemon args...]
  local side=$1 round=$2
  shift 2
  "$bench" --shape=lora7b --wire=fp32 --clients=1 --data_plane=wire,shared_memory --echo=false \
    --tcp=false --raw_adamw=false --torch_python= --reps=1 --seconds=2 "$@" \
    > "$out/$side.$round.txt"
}
scrape_loop() {
  while :; do curl -s -o /dev/null "http://127.0.0.1:$port/metrics" || true; sleep 1; done
}
for round in $(seq "$rounds"); do
  run off "$round"
  scrape_loop &
  scraper=$!
  run on "$round" "--daemon_args=--metrics_listen=127.0.0.1:$port"
  kill "$scraper"
  wait "$scraper" 2>/dev/null || true
  echo "round $round of $rounds done" >&2
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
figures = {}  # (side, data plane) -> [M elem/s per round]
cpu = {}  # (side, data plane) -> [the daemon's CPU ms per step, per round]
for side in ("off", "on"):
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{side}.{r}.txt"):
            if not line.startswith("RESULT "):
                continue
            result = json.loads(line[len("RESULT "):])
            if result.get("kind") == "e2e":
                figures.setdefault((side, result["data_plane"]), []).append(
                    result["elem_per_s"] / 1e6)
                cpu.setdefault((side, result["data_plane"]), []).append(
                    result["server_cpu_ms_per_step"])
print("| lora7b fp32, 1 client, M elem/s | metrics off | metrics on, scraped every 1 s | on / off, medians |")
print("| --- | --- | --- | ---: |")
for plane in ("wire", "shared_memory"):
    off, on = figures.get(("off", plane), []), figures.get(("on", plane), [])
    if not off or not on:
        sys.exit(f"no figures for {plane}; see the bench output in {out}")
    ratio = statistics.median(on) / statistics.median(off)
    print(f"| {plane} | {' '.join(f'{x:.1f}' for x in off)} | {' '.join(f'{x:.1f}' for x in on)} | {ratio:.3f} |")
    paired = statistics.median(b / a for a, b in zip(off, on))
    print(f"| {plane}, per-round on / off, median | | | {paired:.3f} |")
print()
print("| lora7b fp32, daemon CPU ms per step | metrics off, median | metrics on, median | on / off |")
print("| --- | ---: | ---: | ---: |")
for plane in ("wire", "shared_memory"):
    off, on = statistics.median(cpu[("off", plane)]), statistics.median(cpu[("on", plane)])
    print(f"| {plane} | {off:.1f} | {on:.1f} | {on / off:.3f} |")
PY
