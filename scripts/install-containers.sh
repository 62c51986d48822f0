#!/usr/bin/env bash
# Installs what the container test (make container-test, tests/container/)
# needs: Debian's Docker engine (docker.io, 20.10), docker-compose (1.29; the
# compose v2 plugin is not packaged for Debian 12) and debootstrap (the local
# debian:12 base image: no image registry is reachable). Installs only what
# is missing.
set -euo pipefail

packages=(docker.io docker-compose debootstrap)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-containers: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# --no-install-recommends: no containerd-managed services or apparmor
# profiles beyond what the engine needs.
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
