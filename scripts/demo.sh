#!/usr/bin/env bash
# Starts optstated on a free port, trains the linear-regression example
# through it, and stops the daemon. Usage: scripts/demo.sh [build-dir]
set -euo pipefail
build=${1:-build}
log=$(mktemp)
"$build/server/optstated" --listen=127.0.0.1:0 >"$log" 2>&1 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 100); do
  port=$(sed -n 's/^optstated listening on port \([0-9]*\)$/\1/p' "$log")
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "${port:-}" ] || { cat "$log"; echo "demo: optstated did not start" >&2; exit 1; }
echo "demo: optstated on 127.0.0.1:$port"
"$build/examples/train_linear_regression" --target="127.0.0.1:$port"
