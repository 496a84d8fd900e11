#!/bin/bash
# Benchmark 4 of issue 5: time to first tensor ready, and wake-up latency of a consumer
# blocked on a chunk (p50/p99).
#
# Time to first tensor: thaw-fetch's own figure (`time_to_first_tensor_s` in its --json
# summary: from the start of the fetch until the first tensor's bytes are in the cache
# and verified), for full fetches of the 2.09 GB model on loopback and over a 1 Gbit/s
# HTB-shaped veth (the topology of fetch_shaped.sh), each repeated.
#
# Wake-up latency: bench/store/readiness_wake_bench.cpp (thaw's futex readiness page vs
# a pipe vs polling a progress word every 100 µs, as a HydraServe-style reader would).
# Built by the CMake target thaw-readiness-wake-bench when bench/ is wired into the
# build; otherwise compiled here with g++ against build/<preset>/…/libthaw_store_readiness.a.
#
# Usage: bench/store/first_tensor.sh [--repeats N] [--wakes N] [--no-shaped]
# shellcheck source=bench/store/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REPEATS=5
WAKES=2000
SHAPED=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --repeats) REPEATS=$2; shift 2 ;;
    --wakes) WAKES=$2; shift 2 ;;
    --no-shaped) SHAPED=0; shift ;;
    *) die "unknown argument $1" ;;
  esac
done

# ---------------------------------------------------------------- wake-up latency
wake_bench_binary() {
  local p
  for p in release default; do
    if [[ -x $REPO_ROOT/build/$p/bench/store/thaw-readiness-wake-bench ]]; then
      printf '%s\n' "$REPO_ROOT/build/$p/bench/store/thaw-readiness-wake-bench"
      return
    fi
  done
  # Not wired into CMake (yet): compile it against the readiness library of a configured
  # build, building that one small target if needed.
  local preset=release lib
  [[ -f $REPO_ROOT/build/release/build.ninja ]] || preset=default
  lib="$REPO_ROOT/build/$preset/daemon/store/cache/libthaw_store_readiness.a"
  (cd "$REPO_ROOT" && cmake --build --preset "$preset" --target thaw_store_readiness -j2 >&2)
  local out="$BENCH_STATE/thaw-readiness-wake-bench"
  mkdir -p "$BENCH_STATE"
  if [[ ! -x $out || $out -ot $BENCH_DIR/readiness_wake_bench.cpp || $out -ot $lib ]]; then
    log "compiling readiness_wake_bench.cpp against $lib"
    g++ -std=c++23 -O2 -I"$REPO_ROOT" "$BENCH_DIR/readiness_wake_bench.cpp" "$lib" -lfmt -o "$out"
  fi
  printf '%s\n' "$out"
}

# ------------------------------------------------------------ time to first tensor
THAW_FETCH_BIN=$(find_thaw_fetch)
ensure_model "$THAW_FETCH_BIN"
log "model: $MODEL_DIR, ${#MODEL_FILES[@]} files, $MODEL_BYTES bytes"
make_cache_root

ttft_runs() {
  local label=$1 netns=$2 registry=$3 results round
  results=$(mktemp "$WORK/ttft.XXXXXX")
  : >"$results"
  for ((round = 1; round <= REPEATS; round++)); do
    warm_page_cache
    RESULTS=$results run_contender thaw "$round" "$netns" "$registry"
  done
  echo "-- $label: $REPEATS full fetches by thaw-fetch"
  $STATS goodput "$results"
}

PORT=$(free_port)
start_nginx loopback "127.0.0.1:$PORT"
note_load
LOOPBACK_OUT=$(ttft_runs "loopback" "" "http://127.0.0.1:$PORT")

SHAPED_OUT=
if ((SHAPED)); then
  REG_NS="${NS_PREFIX}r"
  NODE_NS="${NS_PREFIX}n"
  make_netns "$REG_NS"
  make_netns "$NODE_NS"
  link_ns "$REG_NS" "tb$$r" 10.77.0.1 "$NODE_NS" "tb$$n" 10.77.0.2 1500
  shape_egress "$REG_NS" "tb$$r" 1gbit
  start_nginx shaped 10.77.0.1:8080 "$REG_NS"
  note_load
  SHAPED_OUT=$(ttft_runs "1 Gbit/s HTB-shaped veth" "$NODE_NS" http://10.77.0.1:8080)
fi

WAKE_BIN=$(wake_bench_binary)
note_load
WAKE_OUT=$("$WAKE_BIN" "$WAKES")

echo
echo "== time to first tensor ready ($MODEL_NAME, $MODEL_BYTES bytes) =="
printf '%s\n' "$LOOPBACK_OUT"
[[ -n $SHAPED_OUT ]] && printf '%s\n' "$SHAPED_OUT"
echo
echo "== $WAKE_OUT" | sed '1!s/^/   /'
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
