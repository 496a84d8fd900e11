#!/bin/bash
# ctest cluster.box_smoke (root only; exit 77 = skipped, with the reason): a 2-node cluster in
# a box (tools/demo-cluster/box.sh) — nodes in network namespaces behind HTB-shaped veth
# links, nginx registry, thawd per node on the emulator, coordinator launching workers,
# thaw-gateway — cold-starts one model through the gateway as a 2-stage pipeline (a TTFT SLO
# Alg. 1 meets only with two stages: one stage per node's GPU); the first request must be
# answered with the tokens a single engine run of the model gives. Then
# everything is torn down and nothing of the box may be left (namespaces, processes,
# directories).
#
# usage: box_smoke_test.sh BUILD_DIR
# shellcheck source=tools/demo-cluster/box.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/demo-cluster/box.sh"
BUILD=${1:?usage: $0 BUILD_DIR}
BUILD=$(cd "$BUILD" && pwd)

box_check_host 77
box_reap_leftovers
box_binaries "$BUILD"

MODELS="$BUILD/cluster-box/models"
MODEL="box-tiny"
mkdir -p "$MODELS"
box_publish_model "$MODELS" "$MODEL" --layers 4 --embd 256 --heads 4 --vocab 4096 --positions 256 --dtype f16
BYTES=$(model_bytes "$MODELS/$MODEL")

# shellcheck disable=SC2054  # the commas are token ids
PROMPT=11,22,33,44,55
MAX_TOKENS=4
ENGINE_FLAGS="--max-num-seqs 2 --max-model-len 64 --max-num-batched-tokens 64 --num-gpu-blocks-override 32 --enforce-eager"

# The reference answer: one engine, no thaw, no cluster, on the emulator.
EMU_DIR=$(mktemp -d "/dev/shm/$BOX.emu-ref.XXXXXX")
defer "rm -rf '$EMU_DIR'"
# shellcheck disable=SC2086
REF=$(env REFENGINE_LIBCUDA="$LIBCUDA" THAW_EMU_KERNELS="$TWINS" THAW_EMU_DEVICE_MEMORY=1G \
  THAW_EMU_STATE_DIR="$EMU_DIR" "$REFENGINE" generate --model "$MODELS/$MODEL" --tokens "$PROMPT" \
  --max-tokens "$MAX_TOKENS" --ignore-eos --json $ENGINE_FLAGS 2>"$WORK/ref.err" |
  /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["tokens"])') ||
  die "the single-engine reference run failed: $(tail -3 "$WORK/ref.err")"
log "single engine: $REF"

export BOX_ENGINE_ARGS=$ENGINE_FLAGS BOX_EMU_MEMORY=1G BOX_LINK_BYTES=2.5MB
box_network 2 1gbit
box_registry "$MODELS" "$MODEL/config.json"
box_coordinator --launch-workers --worker-ports 9100 --worker-port-count 64 \
  --fixed-startup-costs --t-cc 0.1 --t-cu 0.1 --t-l 0.3
box_node 0
box_node 1
box_wait_nodes 2
box_gateway --hold-deadline 40s
# An SLO between Alg. 1's predictions for one and two stages over the nodes' declared links (0.5 s start-up + M / (k b)). The nodes declare
# 2.5 MB/s (BOX_LINK_BYTES) so that the tiny model's fetch time dominates Alg. 1's sums.
SLO=$(awk -v m="$BYTES" 'BEGIN { printf "%.4f", 0.5 + 1.15 * m / 2.5e6 / 2 }')
cluster deploy "$MODEL" --size "$BYTES" --layers 4 --ttft "$SLO" >/dev/null || die "deploy failed"

ask() {  # ask MODEL WANT_STAGES: one request through the gateway; checks stages and tokens
  local model=$1 want=$2 t0 t1 answer code body got stages
  t0=$(now)
  answer=$(in_ns "$BOX-ctl" curl -sS --max-time 50 -w '\n%{http_code}' "$BOX_GATEWAY/v1/completions" \
    -H 'Content-Type: application/json' \
    -d "{\"model\":\"$model\",\"prompt\":[${PROMPT}],\"max_tokens\":$MAX_TOKENS,\"ignore_eos\":true}") ||
    true
  t1=$(now)
  code=${answer##*$'\n'}
  body=${answer%$'\n'*}
  if [[ $code != 200 ]]; then
    log "gateway answered $code: $body"
    log "coordinator: $(tail -5 "$BOX_WORK/coordinator/coordinator.log")"
    log "gateway: $(tail -5 "$BOX_WORK/gateway/gateway.log")"
    for n in 0 1; do log "n$n thawd: $(tail -3 "$BOX_WORK/n$n/thawd.log")"; done
    tail -n 5 "$BOX_WORK"/n*/state/workers/*.log >&2 2>/dev/null || true
    die "the cold start of $model through the gateway did not answer"
  fi
  got=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["choices"][0]["token_ids"])' "$body")
  stages=$(cluster state | /usr/bin/python3 -c 'import json,sys
for p in json.load(sys.stdin).get("plans", []):
    if p["model"] == sys.argv[1]:
        print(p["stages"], "stage(s) on", ",".join(s["node_id"] for s in p["placement"]))' "$model")
  log "$model: cold start answered in $(printf '%.2f' "$(elapsed "$t0" "$t1")") s by $stages: $got"
  [[ ${stages%% *} == "$want" ]] || die "$model: planned $stages, expected $want stage(s)"
  [[ $got == "$REF" ]] || die "$model: the cluster answered $got, the single engine $REF"
}
ask "$MODEL" 2

# Teardown, then nothing of the box may be left.
box_under_test=$BOX
_run_deferred
LEFT=$(box_leftovers "$box_under_test")
if [[ -n $LEFT ]]; then
  log "left behind after teardown:"
  printf '%s\n' "$LEFT" >&2
  exit 1
fi
log "torn down: no namespace, process or directory of $box_under_test left"
