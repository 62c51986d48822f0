#!/usr/bin/env bash
# Runs inside the clean-install image (Dockerfile.deb): starts optstated from
# the .deb on 127.0.0.1:PORT, waits for optstate-probe to see it serving,
# steps through it with both builds of the consumer, and stops it with
# SIGTERM (exit 0). Usage: deb_smoke.sh PORT
set -euo pipefail
port=$1
echo "deb: $(dpkg-query -W -f='${Package} ${Version}, ' optstated liboptstate-dev)"
echo "deb: optstated depends on: $(dpkg-query -W -f='${Depends}' optstated)"
mkdir -p /tmp/state
/usr/bin/optstated --listen=127.0.0.1:"$port" --state_dir=/tmp/state --threads=2 &
daemon=$!
for _ in $(seq 100); do
  /usr/bin/optstate-probe --addr=127.0.0.1:"$port" --timeout=1s > /dev/null 2>&1 && break
  kill -0 "$daemon" || { echo "deb: optstated exited at start" >&2; exit 1; }
  sleep 0.2
done
/usr/bin/optstate-probe --addr=127.0.0.1:"$port" --service=optstate.v1.OptimizerState
/consumer/build/consumer 127.0.0.1:"$port"
/consumer/build/consumer_pkg_config 127.0.0.1:"$port"
kill -TERM "$daemon"
wait "$daemon"
echo "deb: optstated from the .deb served, stepped and stopped cleanly"
