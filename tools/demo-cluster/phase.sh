#!/bin/bash
# One pass of the cluster demo (run-demo-cluster.sh runs two: thaw, then the baseline, each in
# a fresh box so neither sees the other's caches, workers or CPU load).
#
#   phase.sh --mode thaw|baseline --build DIR --registry-root DIR --models a,b,c --out DIR
#            [--nodes N] [--rate 1gbit] [--client "trace_client.py flags"]
#
# Brings a box up (box.sh), deploys the models (baseline: the same files under NAME-baseline,
# no TTFT SLO, so each cold start is one worker that downloads the whole model, then starts
# without the shim — serverless vLLM), replays the trace through the gateway, then sends two
# warm requests per model (1 and 8 tokens: the warm TTFT and TPOT the SLO is set from) and
# keeps in OUT: requests.jsonl, warm.jsonl, state.json (the coordinator's plans), workers/
# (every worker's timeline, marks and log), logs/.
set -Eeuo pipefail
# shellcheck source=tools/demo-cluster/box.sh
source "$(dirname "${BASH_SOURCE[0]}")/box.sh"
trap 'log "error: line $LINENO: \"$BASH_COMMAND\" exited $?"' ERR

MODE='' BUILD='' ROOT='' MODELS='' OUT='' NODES=4 RATE=1gbit CLIENT_FLAGS=''
while [[ $# -gt 0 ]]; do
  case $1 in
    --mode) MODE=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --registry-root) ROOT=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --client) CLIENT_FLAGS=$2; shift 2 ;;
    *) die "phase.sh: unknown argument $1" ;;
  esac
done
[[ $MODE == @(thaw|baseline) && -n $BUILD && -n $ROOT && -n $MODELS && -n $OUT ]] ||
  die "usage: phase.sh --mode thaw|baseline --build DIR --registry-root DIR --models a,b --out DIR"
box_check_host 77
box_reap_leftovers
box_binaries "$BUILD"
SUFFIX=
[[ $MODE == baseline ]] && SUFFIX=-baseline
IFS=, read -r -a MODEL_LIST <<<"$MODELS"
mkdir -p "$OUT/workers" "$OUT/logs"
# Whatever happens, the logs and worker timelines are kept (deferred first, so it runs after
# the box is down and before the work directory goes).
defer "collect_workers"
collect_workers() {
  local i
  for ((i = 0; i < NODES; i++)); do
    cp "$BOX_WORK/n$i/thawd.log" "$OUT/logs/thawd-n$i.log" 2>/dev/null || true
    [[ -d $BOX_WORK/n$i/state/workers ]] || continue
    mkdir -p "$OUT/workers/n$i"
    cp "$BOX_WORK/n$i/state/workers/"* "$OUT/workers/n$i/" 2>/dev/null || true
  done
  cp "$BOX_WORK/coordinator/coordinator.log" "$BOX_WORK/gateway/gateway.log" "$OUT/logs/" 2>/dev/null || true
}

box_network "$NODES" "$RATE"
box_registry "$ROOT" "${MODEL_LIST[0]}$SUFFIX/config.json"
# Alg. 1's start-up costs until nodes have measured their own: the emulator's, about (a
# process, its CUDA init and engine init take tenths of a second here, not the defaults' 4 s).
box_coordinator --launch-workers --worker-ports 20000 --worker-port-count 200 --keep-alive 600 \
  --t-cc 0.1 --t-cu 0.1 --t-l 0.3
for ((i = 0; i < NODES; i++)); do box_node "$i"; done
box_wait_nodes "$NODES"
box_gateway --hold-deadline 60s --hold-queue 256 --upstream-timeout 120s

LINK_BPS=$(rate_bps "$RATE")
: >"$OUT/slo.jsonl"
for m in "${MODEL_LIST[@]}"; do
  bytes=$(model_bytes "$ROOT/$m$SUFFIX")
  layers=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["n_layer"])' "$ROOT/$m$SUFFIX/config.json")
  # The model's TTFT SLO: 60 % of one worker's whole download over the node link, plus 0.5 s
  # of start-up: below what one worker can do, so Alg. 1 spreads a model over several nodes
  # where the link is what limits it. Recorded in both modes: the report judges each request's
  # TTFT against it (HydraServe's TTFT SLO attainment), whichever system served it.
  slo=$(awk -v b="$bytes" -v r="$LINK_BPS" 'BEGIN { printf "%.3f", 0.6 * b * 8 / r + 0.5 }')
  printf '{"model": "%s", "ttft_slo_s": %s}\n' "$m" "$slo" >>"$OUT/slo.jsonl"
  if [[ $MODE == thaw ]]; then
    cluster deploy "$m" --size "$bytes" --layers "$layers" --ttft "$slo" >/dev/null
    log "deployed $m: $bytes bytes, $layers layers, TTFT SLO $slo s (Alg. 1's)"
  else
    cluster deploy "$m$SUFFIX" --size "$bytes" --layers "$layers" >/dev/null
    log "deployed $m$SUFFIX: $bytes bytes, $layers layers, no SLO (one worker per cold start)"
  fi
done

log "$MODE: replaying the trace through the gateway"
# shellcheck disable=SC2086  # CLIENT_FLAGS is a list of flags
in_ns "$BOX-ctl" /usr/bin/python3 "$BOX_LIB_DIR/trace_client.py" --gateway "$BOX_GATEWAY" \
  --models "$MODELS" --model-suffix="$SUFFIX" --out "$OUT/requests.jsonl" $CLIENT_FLAGS

# Warm: the same workers, one request at a time.
: >"$OUT/warm.jsonl"
for m in "${MODEL_LIST[@]}"; do
  for n in 1 8; do
    in_ns "$BOX-ctl" /usr/bin/python3 - "$BOX_GATEWAY" "$m$SUFFIX" "$n" "$m" >>"$OUT/warm.jsonl" <<'PY'
import http.client, json, sys, time, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
body = {"model": sys.argv[2], "prompt": [5, 6, 7, 8, 9, 10, 11, 12], "max_tokens": int(sys.argv[3]),
        "ignore_eos": True}
t0 = time.time()
c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
r = c.getresponse()
data = r.read()
print(json.dumps({"model": sys.argv[4], "max_tokens": int(sys.argv[3]), "status": r.status,
                  "e2e_s": time.time() - t0}))
PY
  done
done
cluster state >"$OUT/state.json"
log "$MODE: done ($(grep -c '"status": 200' "$OUT/requests.jsonl" || true) answered)"
