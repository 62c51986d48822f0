#!/usr/bin/env bash
# The install as a user meets it:
# 1. cmake --install of this build into a fresh prefix puts optstated,
#    optstate-probe, the client's static libraries and headers, the CMake
#    package and the pkg-config file in place, and nothing of the tests or
#    examples;
# 2. tests/install/consumer, a project outside the tree, builds against that
#    prefix with find_package(optstate CONFIG), and its source with
#    `pkg-config --cflags --libs optstate`;
# 3. the installed optstated starts, the installed optstate-probe sees it
#    serving, and both consumers step through it (AdamW checked in double);
# 4. the consumer configured with add_subdirectory of the source tree, which
#    defines the client's targets only (the daemon, probe and tests absent),
#    builds and steps too.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR
# CXX, CXXFLAGS and LDFLAGS (ctest sets them to the build's own) compile and
# link the consumers, so a sanitizer build's libraries link.
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d /tmp/optstate-install-test.XXXXXX)
daemon=""
cleanup() {
  if [ -n "$daemon" ]; then kill -TERM "$daemon" 2>/dev/null; wait "$daemon" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "install test FAILED: $*" >&2; exit 1; }
jobs=${JOBS:-2}
cxx=${CXX:-g++}
# CMake takes CXX, CXXFLAGS and LDFLAGS from the environment on a first
# configure; the pkg-config build passes them itself.
export CXX CXXFLAGS LDFLAGS

# 1.
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
(cd "$prefix" && find . -type f | sort) > "$work/files"
echo "installed:"; sed 's/^/  /' "$work/files"
config=$(find "$prefix" -name optstateConfig.cmake)
pc=$(find "$prefix" -name optstate.pc)
for f in bin/optstated bin/optstate-probe include/optstate/client.h include/optstate/dtype.h; do
  [ -f "$prefix/$f" ] || fail "$f is not installed"
done
[ -n "$config" ] && [ -n "$pc" ] || fail "no optstateConfig.cmake or optstate.pc installed"
for lib in optstate_client optstate_proto optstate_region_protocol optstate_common; do
  [ -n "$(find "$prefix" -name "lib$lib.a")" ] || fail "lib$lib.a is not installed"
done
unexpected=$(grep -v -E '^\./(bin/(optstated|optstate-probe)|include/optstate/[a-z_0-9]+\.h|lib[^/]*/(liboptstate_[a-z_]+\.a|cmake/optstate/[A-Za-z-]+\.cmake|pkgconfig/optstate\.pc))$' \
  "$work/files" || true)
[ -z "$unexpected" ] || fail "installed beyond the daemon, probe and client: $unexpected"

# 2.
consumer=$src/tests/install/consumer
cmake -S "$consumer" -B "$work/find" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  > "$work/find.log" 2>&1 || { cat "$work/find.log"; fail "find_package(optstate) configure"; }
cmake --build "$work/find" -j "$jobs" > "$work/find-build.log" 2>&1 \
  || { cat "$work/find-build.log"; fail "build against the installed CMake package"; }
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs optstate) \
  || fail "pkg-config does not resolve optstate.pc"
# shellcheck disable=SC2086  # the flags are words
"$cxx" -std=c++17 -O2 ${CXXFLAGS:-} -o "$work/consumer_pkg_config" "$consumer/consumer.cc" $flags ${LDFLAGS:-} \
  || fail "build with pkg-config --cflags --libs optstate ($flags)"

# 3.
# The shell opens a background command's redirection in the child, after `&`
# has returned, so the log is created here before the loop reads it.
: > "$work/daemon.log"
"$prefix/bin/optstated" --listen=127.0.0.1:0 --threads=2 --log_level=warning > "$work/daemon.log" 2>&1 &
daemon=$!
port=""
for _ in $(seq 200); do
  port=$(sed -n 's/^optstated listening on port \([0-9]*\)$/\1/p' "$work/daemon.log")
  [ -n "$port" ] && break
  kill -0 "$daemon" 2>/dev/null || break
  sleep 0.1
done
[ -n "$port" ] || { cat "$work/daemon.log"; fail "the installed optstated did not start"; }
"$prefix/bin/optstate-probe" --addr=127.0.0.1:"$port" --service=optstate.v1.OptimizerState \
  || fail "the installed optstate-probe does not see the daemon serving"
if "$prefix/bin/optstate-probe" --addr=127.0.0.1:"$port" --service=no.such.Service 2> /dev/null; then
  fail "optstate-probe exits 0 for a service that is not served"
fi
"$work/find/consumer" 127.0.0.1:"$port" || fail "the CMake-built consumer"
"$work/consumer_pkg_config" 127.0.0.1:"$port" || fail "the pkg-config-built consumer"

# 4.
cmake -S "$consumer" -B "$work/sub" -DOPTSTATE_SOURCE_DIR="$src" -DCMAKE_BUILD_TYPE=Release \
  > "$work/sub.log" 2>&1 || { cat "$work/sub.log"; fail "add_subdirectory(optstate) configure"; }
cmake --build "$work/sub" -j "$jobs" --target consumer > "$work/sub-build.log" 2>&1 \
  || { cat "$work/sub-build.log"; fail "build with add_subdirectory(optstate)"; }
"$work/sub/consumer" 127.0.0.1:"$port" || fail "the add_subdirectory-built consumer"

kill -TERM "$daemon"
wait "$daemon" || fail "the installed optstated did not exit 0 on SIGTERM"
daemon=""
echo "install test passed"
