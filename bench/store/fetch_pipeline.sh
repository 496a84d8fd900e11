#!/bin/bash
# Benchmark 3 of issue 5: pipeline-parallel fetch. One node fetching the whole model over
# its 1 Gbit/s link, vs four nodes, each on its own 1 Gbit/s link, fetching their
# `--stage k/4` concurrently (wall time until the last one finishes). Ratio printed.
#
# Topology (private network namespaces):
#
#   netns <pfx>r (registry, nginx on :8080)
#     veth tb<pid>r<k> 10.78.<k>.1  ====  veth tb<pid>n<k> 10.78.<k>.2  netns <pfx>n<k>
#     for k = 0..3, each registry-side egress shaped like fetch_shaped.sh:
#       qdisc htb 1: default 10 r2q 1000
#       class 1:10 htb rate 1gbit ceil 1gbit burst 64k cburst 64k; leaf pfifo limit 1000
#
# The registry itself is not shaped: its four links give it 4 Gbit/s toward the nodes
# (nginx alone serves > 4 Gbit/s on this machine, see fetch_loopback.sh).
#
# Usage: bench/store/fetch_pipeline.sh [--repeats N] [--rate 1gbit] [--mtu 1500]
#                                      [-- extra thaw-fetch fetch args]
# shellcheck source=bench/store/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REPEATS=3
RATE=1gbit
MTU=1500
NODES=4
while [[ $# -gt 0 ]]; do
  case $1 in
    --repeats) REPEATS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --mtu) MTU=$2; shift 2 ;;
    --) shift; THAW_EXTRA_ARGS=("$@"); break ;;
    *) die "unknown argument $1" ;;
  esac
done

THAW_FETCH_BIN=$(find_thaw_fetch)
ensure_model "$THAW_FETCH_BIN"
log "model: $MODEL_DIR, ${#MODEL_FILES[@]} files, $MODEL_BYTES bytes"

REG_NS="${NS_PREFIX}r"
make_netns "$REG_NS"
for ((k = 0; k < NODES; k++)); do
  make_netns "${NS_PREFIX}n$k"
  link_ns "$REG_NS" "tb$$r$k" "10.78.$k.1" "${NS_PREFIX}n$k" "tb$$n$k" "10.78.$k.2" "$MTU"
  shape_egress "$REG_NS" "tb$$r$k" "$RATE"
done
start_nginx pipeline 0.0.0.0:8080 "$REG_NS"
make_cache_root
RESULTS="$WORK/results.tsv"
STAGES="$WORK/stages.tsv"  # round, stage, thaw JSON
: >"$RESULTS"
: >"$STAGES"

# thaw-fetch's stage numbering (0- or 1-based), from its --help.
if "$THAW_FETCH_BIN" fetch --help 2>&1 | grep -qiE 'stage.*(1-based|1\.\.N|K in 1)'; then
  STAGE_BASE=1
else
  STAGE_BASE=${THAW_STAGE_BASE:-0}
fi

full_fetch() {
  local round=$1 dir="$CACHE_ROOT/full"
  mkdir -p "$dir"
  run_thaw "${NS_PREFIX}n0" "http://10.78.0.1:8080" "$dir"
  log "round $round full model, one node: $T s, $CPU CPU s"
  if [[ $round == 1 ]]; then verify_fetched "$dir" "full fetch"; fi
  rm -rf "$dir"
  printf '%s\t%s\t%s\t%s\t%s\n' "one node, whole model" "$T" "$MODEL_BYTES" "$CPU" \
    "$(compact_json <<<"$THAW_JSON")" >>"$RESULTS"
}

# Four thaw-fetch processes started together; the wall time ends when the last exits. Each
# stage's own time is its self-reported "seconds". STAGE_PIDS (the /usr/bin/time processes,
# each the parent of one fetcher) lets the exit trap stop fetches still running when the
# script is interrupted.
STAGE_PIDS=()
# shellcheck disable=SC2016  # expanded when the exit trap runs
defer 'for p in "${STAGE_PIDS[@]}"; do pkill -TERM -P "$p"; kill -TERM "$p"; done'
staged_fetch() {
  local round=$1 k t0 t1
  STAGE_PIDS=()
  t0=$(now)
  for ((k = 0; k < NODES; k++)); do
    mkdir -p "$CACHE_ROOT/stage$k"
    /usr/bin/time -f '%U %S' -o "$WORK/stage$k.cpu" ip netns exec "${NS_PREFIX}n$k" "$THAW_FETCH_BIN" fetch --registry "http://10.78.$k.1:8080" \
      --model "$MODEL_NAME" --cache "$CACHE_ROOT/stage$k" --json --quiet \
      --stage "$((k + STAGE_BASE))/$NODES" "${THAW_EXTRA_ARGS[@]}" \
      >"$WORK/stage$k.json" 2>"$WORK/stage$k.stderr" &
    STAGE_PIDS+=($!)
  done
  local failed=0
  for k in "${!STAGE_PIDS[@]}"; do wait "${STAGE_PIDS[k]}" || failed=1; done
  t1=$(now)
  STAGE_PIDS=()
  if ((failed)); then
    for ((k = 0; k < NODES; k++)); do log "stage $k: $(tail -3 "$WORK/stage$k.stderr")"; done
    die "a stage fetch failed"
  fi
  T=$(elapsed "$t0" "$t1")
  local each="" cpu=0
  for ((k = 0; k < NODES; k++)); do
    cpu=$(awk -v a="$cpu" -v b="$(cpu_of "$WORK/stage$k.cpu")" 'BEGIN {printf "%.2f", a + b}')
    printf '%s\t%s\t%s\n' "$round" "$k" "$(compact_json <"$WORK/stage$k.json")" >>"$STAGES"
    each+="$(/usr/bin/python3 -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["seconds"])' <"$WORK/stage$k.json") "
    rm -rf "$CACHE_ROOT/stage$k"
  done
  log "round $round four stages, four nodes: $T s, $cpu CPU s (each, self-reported: $each)"
  printf '%s\t%s\t%s\t%s\t%s\n' "four nodes, stage k/4 each" "$T" "$MODEL_BYTES" "$cpu" - >>"$RESULTS"
}

# Peer and capacity check: four curls at once, node k fetching shard k+1 whole (0.23-0.24
# of the model each, less than any thaw stage). Shows what the four links, nginx and this
# machine's CPUs deliver together to a plain client.
curl_quarters() {
  local round=$1 k t0 t1
  local -a pids=()
  t0=$(now)
  for ((k = 0; k < NODES; k++)); do
    /usr/bin/time -f '%U %S' -o "$WORK/curl$k.cpu" ip netns exec "${NS_PREFIX}n$k" curl -sS --fail -o "$CACHE_ROOT/curl$k" \
      "http://10.78.$k.1:8080/$MODEL_NAME/${SHARDS[k]}" 2>"$WORK/curl$k.stderr" &
    pids+=($!)
    STAGE_PIDS+=($!)
  done
  local failed=0
  for k in "${!pids[@]}"; do wait "${pids[k]}" || failed=1; done
  t1=$(now)
  STAGE_PIDS=()
  ((failed == 0)) || die "a curl failed: $(cat "$WORK"/curl?.stderr)"
  T=$(elapsed "$t0" "$t1")
  local cpu=0
  for ((k = 0; k < NODES; k++)); do
    cpu=$(awk -v a="$cpu" -v b="$(cpu_of "$WORK/curl$k.cpu")" 'BEGIN {printf "%.2f", a + b}')
  done
  rm -f "$CACHE_ROOT"/curl?
  log "round $round four curls, one shard each: $T s, $cpu CPU s"
  printf '%s\t%s\t%s\t%s\t%s\n' "four nodes, curl 1 shard each" "$T" "$MODEL_BYTES" "$cpu" - >>"$RESULTS"
}
SHARDS=()
for f in "${MODEL_FILES[@]}"; do [[ $f == model-*.safetensors ]] && SHARDS+=("$f"); done
((${#SHARDS[@]} >= NODES)) || die "the model has fewer than $NODES shards"

for ((round = 1; round <= REPEATS; round++)); do
  warm_page_cache
  note_load
  if ((round % 2)); then full_fetch "$round"; staged_fetch "$round"
  else staged_fetch "$round"; full_fetch "$round"; fi
  curl_quarters "$round"
done

echo
echo "== pipeline fetch: $MODEL_NAME, $MODEL_BYTES bytes; each node on its own $RATE HTB-shaped veth (MTU $MTU), registry 4 x $RATE; $REPEATS rounds =="
echo "per stage (bytes fetched and seconds per round, as reported by thaw-fetch):"
/usr/bin/python3 - "$STAGES" "$MODEL_BYTES" "$WORK/share" <<'EOF'
import json, sys, collections
rows = collections.defaultdict(list)
nbytes = {}
for line in open(sys.argv[1]):
    rnd, k, j = line.rstrip("\n").split("\t", 2)
    j = json.loads(j)
    rows[int(k)].append(float(j["seconds"]))
    nbytes[int(k)] = int(j["bytes"])
total = int(sys.argv[2])
for k in sorted(rows):
    print(f"  stage {k}: {nbytes[k]:>11} bytes ({nbytes[k] / total:.3f} of the model)  "
          f"{' '.join(f'{s:.2f}' for s in rows[k])} s")
open(sys.argv[3], "w").write(f"{max(nbytes.values()) / total:.4f}")
EOF
SHARE=$(cat "$WORK/share")
$STATS pipeline "$RESULTS" --full "one node, whole model" --staged "four nodes, stage k/4 each" \
  --target 0.28 --largest-stage-share "$SHARE"
SHARD_SHARE=$(cd "$MODEL_DIR" && stat -c %s "${SHARDS[@]:0:NODES}" |
  awk -v t="$MODEL_BYTES" '$1 > m {m = $1} END {printf "%.4f", m / t}')
$STATS pipeline "$RESULTS" --full "one node, whole model" --staged "four nodes, curl 1 shard each" \
  --largest-stage-share "$SHARD_SHARE" --peer
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
