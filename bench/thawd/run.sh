#!/bin/bash
# Issue 7 load bench: a real thawd (release build, on the CUDA driver emulator) on a private
# dbus-daemon, a synthetic GPT-2 fetched from a local registry and prewarmed into a slot,
# then bench/thawd/thawd_load_bench.cpp: 64 shim-socket clients (open_file every 10 ms,
# reconnecting every 100 requests) and 10 D-Bus pollers (GetAll every 50 ms) for 60 s.
# Prints thawd's CPU and each side's request latency; exits 1 on any error.
#
# Usage: bench/thawd/run.sh [--seconds S] [--shim-clients N] [--dbus-clients M] [--json]
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${BUILD:-$REPO/build/release}
ARGS=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds|--shim-clients|--dbus-clients) ARGS+=("$1" "$2"); shift 2 ;;
    --json) ARGS+=(--json); shift ;;
    *) echo "usage: $0 [--seconds S] [--shim-clients N] [--dbus-clients M] [--json]" >&2; exit 2 ;;
  esac
done

[[ -f $BUILD/CMakeCache.txt ]] || cmake --preset release >/dev/null
cmake --build "$BUILD" --target thawd thawctl thawd-load-bench thaw-genmodel thaw-fetch thaw_emu >/dev/null

WORK=$(mktemp -d /tmp/thawd-load-bench.XXXXXX)
cleanup() {
  [[ -n ${THAWD:-} ]] && kill "$THAWD" 2>/dev/null && wait "$THAWD" 2>/dev/null
  [[ -n ${DBUS:-} ]] && kill "$DBUS" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BUILD/tools/genmodel/thaw-genmodel" --size custom --layers 8 --embd 256 --heads 4 --vocab 1000 \
  --shard-size 2MB --quiet --out "$WORK/registry/gpt-syn"
"$BUILD/tools/thaw-fetch/thaw-fetch" publish "$WORK/registry/gpt-syn" --chunk-size 64KiB >/dev/null 2>&1

cat >"$WORK/bus.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>custom</type><listen>unix:path=$WORK/bus</listen><auth>EXTERNAL</auth>
<policy context="default"><allow user="*"/><allow own="*"/><allow send_destination="*"/>
<allow receive_sender="*"/></policy></busconfig>
CONF
dbus-daemon --nofork --nopidfile --config-file="$WORK/bus.conf" 2>/dev/null &
DBUS=$!
for _ in $(seq 100); do [[ -S $WORK/bus ]] && break; sleep 0.05; done
BUS="unix:path=$WORK/bus"

cat >"$WORK/thawd.toml" <<CONF
[store]
cache_dir = "$WORK/cache"
cache_budget = "1GiB"
registry = "$WORK/registry"
[gpu]
pool_share = 0.5
[shim]
socket = "$WORK/thawd.sock"
[dbus]
bus = "$BUS"
CONF
THAW_LIBCUDA=$BUILD/emu/libcuda.so.1 THAW_EMU_DEVICE_MEMORY=1G THAW_EMU_STATE_DIR=$WORK/emu \
  "$BUILD/daemon/cli/thawd" --config "$WORK/thawd.toml" 2>"$WORK/thawd.log" &
THAWD=$!
for _ in $(seq 200); do [[ -S $WORK/thawd.sock ]] && busctl --address="$BUS" status org.thaw.Node1 >/dev/null 2>&1 && break; sleep 0.05; done

THAWCTL=("$BUILD/tools/thawctl/thawctl" --bus="$BUS")
"${THAWCTL[@]}" fetch gpt-syn 2>/dev/null
"${THAWCTL[@]}" prewarm gpt-syn >/dev/null 2>&1
SHARD=$(cd "$WORK/registry/gpt-syn" && ls model-*.safetensors | head -1)
echo "thawd pid $THAWD; $(nproc) cores; model gpt-syn cached and prewarmed" >&2
"$BUILD/bench/thawd/thawd-load-bench" --socket "$WORK/thawd.sock" --bus "$BUS" --thawd-pid "$THAWD" \
  --model gpt-syn --model-path /org/thaw/Node1/model/gpt_2dsyn --file config.json --file "$SHARD" \
  "${ARGS[@]}"
