#!/bin/bash
# Issue 8 benchmark 2: interposition overhead, the same program without and with
# LD_PRELOAD=libthaw-preload.so on the emulator, each 5 times alternating; medians and ratios.
#   target: an unhooked driver call through the shim costs <= 1.05x the direct call
#   recorded: a hooked query (cuPointerGetAttribute), a hooked H2D copy (64 B, as a token
#             upload; the layout record looks at its source) and the hooked allocation path
#             (cuMemAlloc 2 MiB + cuMemFree: VMM create/map/set-access vs the driver's own)
# Usage: bench/preload/run.sh [CALLS] [ALLOCS]
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${BUILD:-$REPO/build/release}
CALLS=${1:-10000000}
ALLOCS=${2:-2000}
[[ -f $BUILD/CMakeCache.txt ]] || cmake --preset release >/dev/null
cmake --build "$BUILD" --target thaw-interpose-bench thaw-preload thaw_emu >/dev/null
STATE=$(mktemp -d /dev/shm/thaw-interpose-bench.XXXXXX)
trap 'rm -rf "$STATE"' EXIT
run() {
  env BENCH_LIBCUDA="$BUILD/emu/libcuda.so.1" THAW_EMU_STATE_DIR="$STATE" THAW_EMU_DEVICE_MEMORY=8G "$@" \
    "$BUILD/bench/preload/thaw-interpose-bench" "$CALLS" "$ALLOCS"
}
: >"$STATE/plain"; : >"$STATE/shim"
for _ in 1 2 3 4 5; do
  run >>"$STATE/plain"
  run LD_PRELOAD="$BUILD/preload/libthaw-preload.so" >>"$STATE/shim"
done
/usr/bin/python3 - "$STATE/plain" "$STATE/shim" <<'PY'
import json, statistics, sys
def med(path, key):
    return statistics.median(json.loads(l)[key] for l in open(path) if l.strip())
plain, shim = sys.argv[1], sys.argv[2]
for key, what in [("unhooked_ns", "unhooked call (cuCtxGetCurrent)"),
                  ("hooked_query_ns", "hooked query (cuPointerGetAttribute)"),
                  ("h2d_copy_ns", "hooked copy (cuMemcpyHtoD 64 B)"),
                  ("alloc_free_ns", "cuMemAlloc 2 MiB + cuMemFree")]:
    a, b = med(plain, key), med(shim, key)
    print(f"{what:40s} direct {a:12.2f} ns   shim {b:12.2f} ns   ratio {b / a:6.3f}")
PY
