#!/usr/bin/env bash
# make container-test: the deployment run for real on this host.
# 1. A Docker engine: the one running, else one started here (no bridge, no
#    iptables) and stopped at the end by its PID. No engine: the test fails.
# 2. The base images debian:12 and debian:12-slim, made with debootstrap when
#    missing (no image registry is reachable).
# 3. The .deb packages (make package) installed with apt into a clean
#    debian:12 image, which brings only their declared dependencies: the
#    daemon starts from them and answers its probe, and a program built
#    against the installed client (CMake and pkg-config) steps through it.
# 4. The image (Dockerfile) and its trainer target, built.
#    The Kubernetes manifest's container run by Docker as the pod would run
#    it (command, flag file, user, read-only root, probes), no cluster.
# 5. The compose files validated (docker-compose config): the gpu and
#    metrics profiles and deploy/docker-compose.shared-memory.yml are not run
#    (no GPU; no registry for prom/prometheus, whose scrape config
#    tests/python/test_metrics.py runs with Debian's Prometheus; the
#    shared-memory trainer is the user's image). docker-compose up
#    (deploy/docker-compose.yml, host-network override): the trainer waits
#    for optstated to be healthy and trains to a falling loss; its final
#    parameters are noted.
# 6. The trainer again: optstated's process is killed with SIGKILL mid-run,
#    Docker restarts it (restart: unless-stopped), it restores its newest
#    checkpoint, the trainer goes back to its own checkpoint of that step and
#    finishes with the parameters of the uninterrupted run. Once more with
#    docker restart (SIGTERM: a final checkpoint, restored at start).
# 7. docker-compose stop: optstated exits 0 within its grace period, with a
#    final checkpoint written.
# Then docker-compose down -v; also on failure. Every container runs on the
# host's network and the test's traffic stays on 127.0.0.1.
# Usage: tests/container/run.sh BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$(cd "${1:-build}" && pwd)
docker=/usr/bin/docker  # Debian's docker.io client, the engine's own version.
# The compose file as users run it, with the test's host-network override;
# resolved in step 5 into the file the test runs.
compose_files=(-f deploy/docker-compose.yml -f tests/container/docker-compose.host-network.yml)
# The images stay after the test, as build cache: a rerun builds in seconds
# (`docker image rm` them to free the disk).
tag=container-test
export OPTSTATE_TAG=$tag
start=$SECONDS

say() { echo "=== container-test [$((SECONDS - start)) s]: $*"; }
fail() { echo "=== container-test FAILED: $*" >&2; exit 1; }

work=$(mktemp -d /tmp/optstate-container-test.XXXXXX)
dockerd_pid=""
compose_up=0
cleanup() {
  local rc=$?
  set +e
  if [ "$compose_up" = 1 ] && [ -n "${compose[*]:-}" ]; then
    if [ "$rc" != 0 ]; then
      say "logs of the failed run"
      "${compose[@]}" logs --no-color --tail=80
    fi
    "${compose[@]}" down -v --remove-orphans > "$work/down.log" 2>&1 || cat "$work/down.log"
  fi
  "$docker" rm -f -v "optstate-ct-deb-$$" "optstate-ct-k8s-$$" > /dev/null 2>&1
  if [ -n "$dockerd_pid" ]; then
    say "stopping the Docker engine this test started (pid $dockerd_pid)"
    kill -TERM "$dockerd_pid" 2>/dev/null
    for _ in $(seq 60); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$dockerd_pid" 2>/dev/null && { echo "dockerd did not stop; killing it"; kill -KILL "$dockerd_pid"; }
  fi
  rm -rf "$work"
  [ "$rc" = 0 ] && say "passed in $((SECONDS - start)) s"
  exit "$rc"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# ---- 1. The engine.
[ -x "$docker" ] || fail "$docker is missing: make container-deps installs docker.io"
command -v docker-compose > /dev/null || fail "docker-compose is missing: make container-deps installs it"
if "$docker" info > /dev/null 2>&1; then
  say "using the Docker engine already running"
else
  say "starting a Docker engine (no bridge, no iptables)"
  dockerd --bridge=none --iptables=false --ip6tables=false > "$work/dockerd.log" 2>&1 &
  dockerd_pid=$!
  for _ in $(seq 120); do
    "$docker" info > /dev/null 2>&1 && break
    kill -0 "$dockerd_pid" 2>/dev/null || break
    sleep 0.5
  done
  if ! "$docker" info > /dev/null 2>&1; then
    tail -30 "$work/dockerd.log"
    fail "the Docker engine did not start (log above)"
  fi
fi
bridges_before=$("$docker" network ls --filter driver=bridge -q | sort)

# ---- 2. Base images.
if ! "$docker" image inspect debian:12 > /dev/null 2>&1; then
  say "making debian:12 with debootstrap (minbase bookworm)"
  debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian \
    > "$work/debootstrap.log" 2>&1 || { tail -30 "$work/debootstrap.log"; fail "debootstrap failed"; }
  rm -f "$work"/rootfs/var/cache/apt/archives/*.deb
  tar -C "$work/rootfs" -c . | "$docker" import - debian:12 > /dev/null
  rm -rf "$work/rootfs"
fi
"$docker" image inspect debian:12-slim > /dev/null 2>&1 || "$docker" tag debian:12 debian:12-slim

# ---- 3. The .deb packages in a clean debian:12.
debs=("$build"/optstated_*.deb "$build"/liboptstate-dev_*.deb)
for deb in "${debs[@]}"; do [ -f "$deb" ] || fail "$deb is missing: make package writes it"; done
mkdir "$work/deb"
cp "${debs[@]}" "$work/deb/"
cp -r tests/install/consumer "$work/deb/consumer"
cp tests/container/Dockerfile.deb "$work/deb/Dockerfile"
cp tests/container/deb_smoke.sh "$work/deb/"
say "installing $(cd "$work/deb" && echo *.deb) into a clean debian:12 (apt brings the declared dependencies)"
"$docker" build --network host -t "optstate-ct/deb-install:$tag" "$work/deb"
say "starting optstated from the .deb and stepping through it"
"$docker" run --rm --network host --name "optstate-ct-deb-$$" "optstate-ct/deb-install:$tag" \
  bash /deb_smoke.sh "$(free_port)"

# ---- 4. The images.
say "building the image (Dockerfile: install-deps.sh, make install-daemon)"
"$docker" build --network host -t "optstate/optstated:$tag" -f Dockerfile .
"$docker" build --network host --target trainer -t "optstate/example-trainer:$tag" -f Dockerfile . \
  > "$work/trainer-build.log" 2>&1 || { cat "$work/trainer-build.log"; fail "trainer image build"; }
"$docker" image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep ":$tag " || true
[ "$("$docker" image inspect -f '{{.Config.User}}' "optstate/optstated:$tag")" = optstate ] \
  || fail "the image does not run as the optstate user"

# ---- 4b. The Kubernetes pod's container (deploy/kubernetes/optstated.yaml)
# as the manifest says: its command and the ConfigMap's flag file, its user,
# a read-only root, no capabilities, a volume for --state_dir; each of its
# probes' commands must pass, and SIGTERM must stop it with exit 0. No
# cluster runs here: this is the part Docker can run. Its own network
# namespace (--network none): it listens on 0.0.0.0 inside it only.
say "running the Kubernetes manifest's container as the pod would (no cluster)"
mkdir "$work/k8s-flags"
python3 - deploy/kubernetes/optstated.yaml "$work/k8s-flags" "$work" <<'PY'
# The ConfigMap's files, and the container's settings one word a line.
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
config_map = next(d for d in docs if d["kind"] == "ConfigMap")
pod = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]
container = pod["containers"][0]
for key, text in config_map["data"].items():
    open(f"{sys.argv[2]}/{key}", "w").write(text)
context = pod["securityContext"]
words = {
    "user": [f"{context['runAsUser']}:{context['runAsGroup']}"],
    "read_only": ["--read-only"] if container["securityContext"]["readOnlyRootFilesystem"] else [],
    "command": container["command"],
    **{probe: container[probe]["exec"]["command"]
       for probe in ("startupProbe", "readinessProbe", "livenessProbe")},
}
for name, values in words.items():
    open(f"{sys.argv[3]}/k8s-{name}", "w").write("".join(v + "\n" for v in values))
PY
mapfile -t user < "$work/k8s-user"
mapfile -t read_only < "$work/k8s-read_only"
mapfile -t command < "$work/k8s-command"
"$docker" run -d --name "optstate-ct-k8s-$$" --network none --user "${user[0]}" "${read_only[@]}" \
  --cap-drop ALL --security-opt no-new-privileges -v "$work/k8s-flags:/etc/optstate:ro" \
  --mount "type=volume,dst=/var/lib/optstate" --entrypoint "${command[0]}" \
  "optstate/optstated:$tag" "${command[@]:1}" > /dev/null
for probe in startupProbe readinessProbe livenessProbe; do
  mapfile -t probe_command < "$work/k8s-$probe"
  ok=0
  for _ in $(seq 100); do
    "$docker" exec "optstate-ct-k8s-$$" "${probe_command[@]}" > /dev/null 2>&1 && { ok=1; break; }
    sleep 0.2
  done
  [ "$ok" = 1 ] || { "$docker" logs "optstate-ct-k8s-$$"; fail "the manifest's $probe fails"; }
  echo "k8s $probe: $("$docker" exec "optstate-ct-k8s-$$" "${probe_command[@]}")"
done
"$docker" stop -t 60 "optstate-ct-k8s-$$" > /dev/null
[ "$("$docker" inspect -f '{{.State.ExitCode}}' "optstate-ct-k8s-$$")" = 0 ] \
  || fail "the manifest's container did not exit 0 on SIGTERM"
"$docker" rm -v "optstate-ct-k8s-$$" > /dev/null
say "the manifest's container started from its flag file, passed its probes, stopped with exit 0"

# ---- 5. compose up: an uninterrupted run.
export OPTSTATE_PORT
OPTSTATE_PORT=$(free_port)
docker-compose -f deploy/docker-compose.yml --profile gpu config -q \
  || fail "the compose file with its gpu profile does not validate"
docker-compose -f deploy/docker-compose.yml --profile metrics config -q \
  || fail "the compose file with its metrics profile does not validate"
docker-compose -f deploy/docker-compose.shared-memory.yml config -q \
  || fail "deploy/docker-compose.shared-memory.yml does not validate"
# docker-compose 1.29 refuses published ports on the host's network (and
# cannot unset a list in an override): the resolved file drops them. It
# refuses to go on if any service would be on another network than the
# host's (compose would create a bridge for it).
docker-compose "${compose_files[@]}" config > "$work/compose.yml"
python3 - "$work/compose.yml" <<'PY' || fail "the compose files would create a network"
import sys, yaml
path = sys.argv[1]
doc = yaml.safe_load(open(path))
for name, service in doc["services"].items():
    if service.get("network_mode") != "host" or "networks" in service:
        sys.exit(f"service {name} is not on the host's network only")
    service.pop("ports", None)
if doc.get("networks"):
    sys.exit("the compose files declare networks")
yaml.safe_dump(doc, open(path, "w"), sort_keys=False)
PY
compose=(docker-compose --project-name "optstate-ct-$$" -f "$work/compose.yml")
say "docker-compose up (host network, optstated on 127.0.0.1:$OPTSTATE_PORT)"
compose_up=1
"${compose[@]}" up -d --no-build
daemon=$("${compose[@]}" ps -q optstated)
trainer=$("${compose[@]}" ps -q trainer)
[ -n "$daemon" ] && [ -n "$trainer" ] || fail "compose did not create both containers"
bridges_after=$("$docker" network ls --filter driver=bridge -q | sort)
[ "$bridges_before" = "$bridges_after" ] || fail "a bridge network was created; every service must use the host's"
[ "$("$docker" inspect -f '{{.Config.User}}' "$daemon")" = optstate ] || fail "optstated runs as root"
code=$("$docker" wait "$trainer")
"$docker" logs "$trainer" > "$work/trainer-uninterrupted.log" 2>&1
sed 's/^/trainer (uninterrupted): /' "$work/trainer-uninterrupted.log"
[ "$code" = 0 ] || fail "the trainer exited $code"
final_a=$(sed -n 's/^final parameters: //p' "$work/trainer-uninterrupted.log")
[ -n "$final_a" ] || fail "the trainer printed no final parameters"
grep -q "^loss .* -> .* lower)$" "$work/trainer-uninterrupted.log" \
  || fail "no falling loss in the trainer's log"

# ---- 6. The same run twice more: optstated killed with SIGKILL mid-run
# (a crash: the restore of its checkpoint and the trainer's own checkpoint
# meet), then restarted with SIGTERM mid-run (as an upgrade does: the final
# checkpoint of the stop is restored and the trainer's step finishes).
interrupted_run() {
  local how=$1 restored_before restarts pid code final log=$work/trainer-$1.log attach
  # At step 550: 50 steps past the checkpoint of step 500 and 50 before the
  # next, so the daemon comes back at 500 while the trainer is further on.
  # The trainer's output is followed as it comes (docker start -a into a
  # file), and the daemon's PID read beforehand, so the kill is not late.
  say "the trainer again; optstated will be ${how} at the trainer's step 550"
  "${compose[@]}" up --no-build --no-deps --no-start --force-recreate trainer
  trainer=$("${compose[@]}" ps -q trainer)
  "$docker" logs "$daemon" > "$work/daemon.log" 2>&1
  restored_before=$(grep -c "restored checkpoint" "$work/daemon.log" || true)
  restarts=$("$docker" inspect -f '{{.RestartCount}}' "$daemon")
  pid=$("$docker" inspect -f '{{.State.Pid}}' "$daemon")
  : > "$log"  # created before the loop reads it; `&` opens it in the child
  "$docker" start -a "$trainer" > "$log" 2>&1 &
  attach=$!
  for _ in $(seq 12000); do
    grep -q "^step  550 " "$log" && break
    kill -0 "$attach" 2>/dev/null || break
    sleep 0.01
  done
  grep -q "^step  550 " "$log" || { cat "$log"; fail "the trainer did not reach step 550"; }
  if [ "$how" = killed ]; then
    kill -KILL "$pid"
    say "killed optstated (pid $pid on the host) with SIGKILL"
    for _ in $(seq 600); do
      [ "$("$docker" inspect -f '{{.RestartCount}}' "$daemon")" -gt "$restarts" ] && break
      sleep 0.1
    done
    [ "$("$docker" inspect -f '{{.RestartCount}}' "$daemon")" -gt "$restarts" ] \
      || fail "Docker did not restart optstated after the kill"
    say "Docker restarted optstated (restart policy; restart count $restarts -> $("$docker" inspect -f '{{.RestartCount}}' "$daemon"))"
  else
    "$docker" restart -t 120 "$daemon" > /dev/null
    say "docker restart optstated: SIGTERM (final checkpoint), then started again"
  fi
  for _ in $(seq 600); do
    [ "$("$docker" inspect -f '{{.State.Health.Status}}' "$daemon")" = healthy ] && break
    sleep 0.1
  done
  [ "$("$docker" inspect -f '{{.State.Health.Status}}' "$daemon")" = healthy ] \
    || fail "optstated did not come back healthy"
  "$docker" logs "$daemon" > "$work/daemon.log" 2>&1
  [ "$(grep -c "restored checkpoint" "$work/daemon.log")" -gt "$restored_before" ] \
    || fail "optstated restored no checkpoint when it came back"
  grep "restored checkpoint" "$work/daemon.log" | tail -1 | sed 's/^/optstated: /'
  code=0
  wait "$attach" || code=$?
  sed "s/^/trainer (optstated $how): /" "$log"
  [ "$code" = 0 ] || fail "the trainer exited $code after optstated came back"
  if [ "$how" = killed ]; then
    # The daemon restored step 500 (or 600): the trainer must have gone back
    # to its own checkpoint of that step.
    grep -q "^resume: optstated restored step" "$log" \
      || fail "the trainer did not go back to its own checkpoint"
  elif ! grep -q "^resume: " "$log"; then
    say "the client's retries reached the restarted daemon: the step finished without a resume"
  fi
  final=$(sed -n 's/^final parameters: //p' "$log")
  echo "final parameters, uninterrupted:  $final_a"
  echo "final parameters, optstated $how: $final"
  [ "$final_a" = "$final" ] || fail "the final parameters differ from the uninterrupted run's"
  say "equal final parameters"
}
interrupted_run killed
interrupted_run restarted

# ---- 7. A clean stop within the grace period, with a final checkpoint.
say "docker-compose stop optstated (SIGTERM)"
stop_start=$SECONDS
"${compose[@]}" stop optstated
stopped_in=$((SECONDS - stop_start))
code=$("$docker" inspect -f '{{.State.ExitCode}}' "$daemon")
"$docker" logs "$daemon" > "$work/daemon.log" 2>&1
tail -4 "$work/daemon.log" | sed 's/^/optstated: /'
[ "$code" = 0 ] || fail "optstated exited $code on SIGTERM"
grep -q "checkpoint .* durable" <(tail -6 "$work/daemon.log") \
  || fail "no final checkpoint at the stop"
say "optstated stopped in ${stopped_in} s, exit 0, final checkpoint written"
