#!/bin/bash
# Benchmark 1 of issue 5, restated by issue 20: loopback goodput and CPU of a full model
# fetch, thaw-fetch vs `curl | sha256sum` (the fair peer: it also verifies) vs
# `curl | openssl dgst -sha256` (the same with OpenSSL's SHA-256, which uses the CPU's SHA
# instructions; coreutils' sha256sum here does not) vs `aria2c -x8 -s8` vs plain `curl`
# (one connection, files in sequence), in one run. thaw-fetch verifies every chunk and
# every file's sha256 (one chained SHA-256 pass); the two curl pipelines stream each file
# through tee into its file and the hash and check the digest against the manifest's;
# aria2c and plain curl verify nothing.
#
# nginx on 127.0.0.1 serves the 2.09 GB synthetic model from the page cache (warmed
# before every round so every contender sees the same server state); each contender
# writes into a fresh directory on tmpfs (/dev/shm), which is emptied after each run.
# Rounds interleave the contenders (rotating the order) so background load hits all of
# them alike. Goodput = model bytes / wall time of the fetching process; CPU s per GB =
# user + system time of the fetching process(es) (/usr/bin/time), not nginx's.
# Targets (issue 20): thaw/curl-sha256 >= 1.0 and thaw/aria2c >= 1.0; thaw/curl-openssl and
# issue 5's thaw/curl >= 1.5 (the unverified curl) are printed for comparison only.
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

contenders=(thaw curl-sha256 curl-openssl aria2c curl)
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
$STATS goodput "$RESULTS" --ratio 'thaw/curl-sha256>=1.0' --ratio 'thaw/aria2c>=1.0' \
  --ratio thaw/curl-openssl --ratio thaw/curl --cpu-ratio thaw/curl-sha256 \
  --cpu-ratio thaw/curl-openssl --cpu-ratio thaw/aria2c --cpu-ratio thaw/curl
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
