#!/bin/bash
# Benchmark 1 of issue 5: loopback goodput of a full model fetch, thaw-fetch vs
# `aria2c -x8 -s8` vs `curl` (one connection, files in sequence), in one run. thaw-fetch
# verifies every chunk and every file's sha256 (one chained SHA-256 pass); the peers
# verify nothing.
#
# nginx on 127.0.0.1 serves the 2.09 GB synthetic model from the page cache (warmed
# before every round so every contender sees the same server state); each contender
# writes into a fresh directory on tmpfs (/dev/shm), which is emptied after each run.
# Rounds interleave the contenders (rotating the order) so background load hits all of
# them alike. Goodput = model bytes / wall time of the fetching process.
#
# Usage: bench/store/fetch_loopback.sh [--repeats N] [-- extra thaw-fetch fetch args]
# Env: THAW_FETCH=path (default build/release, then build/default)
# shellcheck source=bench/store/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REPEATS=3
while [[ $# -gt 0 ]]; do
  case $1 in
    --repeats) REPEATS=$2; shift 2 ;;
    --) shift; THAW_EXTRA_ARGS=("$@"); break ;;
    *) die "unknown argument $1 (usage: $0 [--repeats N] [-- thaw-fetch args])" ;;
  esac
done

THAW_FETCH_BIN=$(find_thaw_fetch)
ensure_model "$THAW_FETCH_BIN"
log "model: $MODEL_DIR, ${#MODEL_FILES[@]} files, $MODEL_BYTES bytes"
log "thaw-fetch: $THAW_FETCH_BIN ${THAW_EXTRA_ARGS[*]}"

PORT=$(free_port)
start_nginx loopback "127.0.0.1:$PORT"
REGISTRY="http://127.0.0.1:$PORT"
make_cache_root
RESULTS="$WORK/results.tsv"
: >"$RESULTS"

contenders=(thaw aria2c curl)
n=${#contenders[@]}
for ((round = 1; round <= REPEATS; round++)); do
  warm_page_cache
  note_load
  for ((i = 0; i < n; i++)); do
    run_contender "${contenders[(i + round - 1) % n]}" "$round" "" "$REGISTRY"
  done
done

echo
echo "== loopback full fetch: $MODEL_NAME, $MODEL_BYTES bytes in ${#MODEL_FILES[@]} files, nginx 127.0.0.1, cache on tmpfs, $REPEATS rounds =="
$STATS goodput "$RESULTS" --ratio 'thaw/aria2c>=1.0' --ratio 'thaw/curl>=1.5'
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
