#!/usr/bin/env bash
# Installs the Debian packages optstate needs to build and test; installs only
# what is missing, so it is cheap to run before every build.
set -euo pipefail

packages=(
  cmake g++ make pkg-config python3 python3-venv
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev grpc-proto prometheus-cpp-dev
)
# `install-deps.sh fuzz`: also clang and its libFuzzer runtime (make fuzz).
if [ "${1:-}" = "fuzz" ]; then
  packages+=(clang libclang-rt-dev)
fi
# `install-deps.sh test`: also a Prometheus server, which a test runs to
# scrape the daemon (tests/metrics; make test), iproute2 (ip netns, veth
# and tc tbf: the stand-in hosts of tests/python/test_scale_out.py) and
# openssl (the certificates the TLS tests make).
if [ "${1:-}" = "test" ]; then
  packages+=(prometheus iproute2 openssl)
fi
# `install-deps.sh containers`: also Debian's Docker engine (docker.io, 20.10),
# docker-compose (1.29; the compose v2 plugin is not packaged for Debian 12)
# and debootstrap (the local debian:12 base image: no image registry is
# reachable), for make container-test. --no-install-recommends (below): no
# containerd-managed services or apparmor profiles beyond what the engine needs.
if [ "${1:-}" = "containers" ]; then
  packages+=(docker.io docker-compose debootstrap)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
