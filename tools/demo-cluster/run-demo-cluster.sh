#!/bin/bash
# `make demo-cluster` (issue 25): thaw's cluster in a box against the serverless baseline, on
# one trace slice, in one run. Root only (network namespaces, tc).
#
# Two passes, each in a fresh box (tools/demo-cluster/box.sh: N nodes in network namespaces,
# each link HTB-shaped to --rate both ways, an emulated GPU per node, nginx registry, thawd per
# node, thaw-coordinator with --launch-workers, thaw-gateway):
#   thaw      the models deployed with a TTFT SLO; the gateway holds the first requests, asks
#             the coordinator for a cold start; Alg. 1 plans stages over the nodes, each node
#             streams its stage and starts the engine at once under the shim
#   baseline  the same files as NAME-baseline, no SLO: one worker per cold start, which waits
#             until thawd has downloaded the whole model and starts without the shim
# Both replay the same slice of an Azure LLM inference trace (tools/demo-cluster/
# trace_client.py says how time and sizes are scaled) against three synthetic models of
# different sizes through the gateway. Writes OUT/summary.json, OUT/summary.md (printed) and
# OUT/timeline.svg (every worker's phases).
#
# usage: run-demo-cluster.sh [--build DIR] [--out DIR] [--nodes N] [--rate 1gbit]
#                            [--trace CSV] [--start-row R] [--count K] [--time-scale S]
#                            [--quick] [--only thaw|baseline]
set -Eeuo pipefail
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/../.." && pwd)
# shellcheck source=tools/demo-cluster/box.sh
source "$SCRIPT_DIR/box.sh"

BUILD=$REPO/build/default OUT='' NODES=4 RATE=1gbit
TRACE=$REPO/../shared/data/traces/AzureLLMInferenceTrace_conv.csv
START_ROW=0 COUNT=24 TIME_SCALE=1 QUICK=0 ONLY=''
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --trace) TRACE=$2; shift 2 ;;
    --start-row) START_ROW=$2; shift 2 ;;
    --count) COUNT=$2; shift 2 ;;
    --time-scale) TIME_SCALE=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --only) ONLY=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -E/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (--help)" ;;
  esac
done
[[ $NODES =~ ^[1-9][0-9]?$ ]] || die "--nodes: 1 to 99"
rate_bps "$RATE" >/dev/null
[[ -f $TRACE ]] || die "no trace at $TRACE (give --trace AzureLLMInferenceTrace_*.csv)"
[[ -z $ONLY || $ONLY == @(thaw|baseline) ]] || die "--only thaw or baseline"
BUILD=$(cd "$BUILD" && pwd)
OUT=${OUT:-$BUILD/demo-cluster}
box_check_host 1
box_reap_leftovers
box_binaries "$BUILD"

# Three models of different sizes (f16; the emulator runs their kernels on the CPU, so they
# are small: tens to a few hundred MB). Generated once, reused.
ROOT=$BUILD/cluster-box/models
mkdir -p "$ROOT"
MODELS=(c-small c-medium c-large)
SHAPES=("--layers 4 --embd 512 --heads 8" "--layers 6 --embd 768 --heads 12" "--layers 8 --embd 1024 --heads 16")
if ((QUICK)); then
  MODELS=(c-small c-medium)
  COUNT=$((COUNT < 8 ? COUNT : 8))
fi
for i in "${!MODELS[@]}"; do
  m=${MODELS[i]}
  # shellcheck disable=SC2086  # the shape is a list of flags
  box_publish_model "$ROOT" "$m" ${SHAPES[i]} --vocab 8192 --positions 256 --dtype f16
  # The baseline's copy: the same files under another name, so its cache starts empty.
  [[ -d $ROOT/$m-baseline ]] || cp -al "$ROOT/$m" "$ROOT/$m-baseline"
done
MODEL_CSV=$(IFS=,; echo "${MODELS[*]}")

rm -rf "$OUT"
mkdir -p "$OUT"
CLIENT="--trace $TRACE --start-row $START_ROW --count $COUNT --time-scale $TIME_SCALE \
--prompt-scale 32 --output-scale 16 --max-prompt 40 --max-output 8 --vocab 8192 --timeout 150"
export BOX_ENGINE_ARGS="--max-num-seqs 4 --max-model-len 64 --max-num-batched-tokens 256 --num-gpu-blocks-override 64 --enforce-eager"
export BOX_EMU_MEMORY=3G BOX_CACHE_BUDGET=4GiB
NOTES=("$NODES nodes, links HTB-shaped to $RATE each way; emulated GPUs (thaw's CUDA driver emulator, kernels run on the CPU)"
  "trace: $(basename "$TRACE") rows $START_ROW..$((START_ROW + COUNT - 1)), time / $TIME_SCALE, prompt tokens / 32 (<= 40), output tokens / 16 (<= 8); models ${MODEL_CSV} round-robin by row"
  "engines: refengine serve $BOX_ENGINE_ARGS")
status=0
for mode in thaw baseline; do
  [[ -z $ONLY || $ONLY == "$mode" ]] || continue
  log "== $mode pass =="
  if ! bash "$SCRIPT_DIR/phase.sh" --mode "$mode" --build "$BUILD" --registry-root "$ROOT" \
    --models "$MODEL_CSV" --out "$OUT/$mode" --nodes "$NODES" --rate "$RATE" --client "$CLIENT"; then
    log "the $mode pass failed (its logs: $OUT/$mode/logs); the report shows what it measured"
    NOTES+=("the $mode pass FAILED before it finished: see $OUT/$mode/logs")
    status=1
  fi
done
# What this run does not show yet, said where the numbers are.
NOTES+=("not measured here: the coordinator consolidates pipelines into full-memory workers as the trace goes (they appear in the timeline), but tokens/s before/after consolidation is bench/cluster/consolidation.sh's job")
note_args=()
for n in "${NOTES[@]}"; do note_args+=(--note "$n"); done
/usr/bin/python3 "$SCRIPT_DIR/report.py" "$OUT" "${note_args[@]}"
echo "summary: $OUT/summary.md, $OUT/summary.json; timeline picture: $OUT/timeline.svg"
exit "$status"
