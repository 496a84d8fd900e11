#!/bin/bash
# ctest cluster.worker_exit (root only; 77 = skipped): a stage's worker that exits during the
# cold start (issue 25, "bad input and faults"). Every worker's command exits at once: the
# coordinator launches the pipeline once more, then fails the cold start, and the gateway
# answers the held request 503 (cold_start_refused, with Retry-After and the coordinator's
# reason) at once, not at its 45 s hold deadline.
#
# usage: worker_exit_test.sh BUILD_DIR
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

export BOX_WORKER_COMMAND='["/bin/sh", "-c", "exit 3"]' BOX_EMU_MEMORY=1G BOX_LINK_BYTES=25MB
box_network 2 200mbit
box_registry "$MODELS" "$MODEL/config.json"
box_coordinator --launch-workers --worker-ports 9100 --worker-port-count 64 \
  --fixed-startup-costs --t-cc 0.1 --t-cu 0.1 --t-l 0.3
box_node 0
box_node 1
box_wait_nodes 2
box_gateway --hold-deadline 45s
# A TTFT SLO a 2-stage plan meets on these links (Alg. 1 then picks a pipeline).
cluster deploy "$MODEL" --size "$BYTES" --layers 4 --ttft 2 >/dev/null

t0=$EPOCHREALTIME
out=$(in_ns "$BOX-ctl" curl -sS --max-time 60 -D "$WORK/headers" -w '\n%{http_code}' \
  "$BOX_GATEWAY/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"model\":\"$MODEL\",\"prompt\":[1,2,3],\"max_tokens\":4}") || true
took=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
code=${out##*$'\n'}
body=${out%$'\n'*}
log "the gateway answered $code after $took s: $body"
[[ $code == 503 ]] || die "expected 503, got $code"
[[ $body == *cold_start_refused* && $body == *"exited before the pipeline served"* ]] ||
  die "the 503 does not carry the coordinator's reason"
grep -qi '^retry-after:' "$WORK/headers" || die "the 503 has no Retry-After"
awk -v t="$took" 'BEGIN { exit !(t < 20) }' || die "answered after $took s: held, not failed"
LOGF="$BOX_WORK/coordinator/coordinator.log"
grep -q 'launch-worker-g1 failed' "$LOGF" || die "no relaunch (generation 1) was tried: $(tail -5 "$LOGF")"
grep -q 'launch-worker-g2' "$LOGF" && die "launched a third time"
log "relaunched once, then failed: $(grep -c 'launch-worker' "$LOGF") worker exits logged"
