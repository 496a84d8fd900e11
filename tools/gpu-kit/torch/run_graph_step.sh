#!/bin/bash
# The gpu-kit's CUDA-graph restore step (issue 24, step f), run on the node the demo brings up:
# torch_graph.py (a PyTorch program that captures a GPT-2 decode step with torch.cuda.CUDAGraph
# and replays it; it knows nothing of thaw) runs twice, each in a fresh process under
# LD_PRELOAD=libthaw-preload.so with the same command line and THAW_ENGINE_ID:
#
#   first    the shim records the run's layout and the graph it captures, and stores them in
#            thawd at exit ("graphs" artifact: `thawctl --json artifacts` is kept)
#   second   the same program: the shim hands the recorded graph back at cuStreamEndCapture /
#            cuGraphInstantiate; its exit line "thaw: graph restore summary: captures=M
#            transparent=N fallbacks=K" says what happened
#
# graph_verdict.py decides: both runs completed, bit-identical tokens and logits, a readable
# graphs artifact after the first run, transparent >= 1 and no fallback in the second.
#
# Environment: KIT, THAW_SOCKET, THAWCTL, MODEL_DIR (as run_torch_step.sh takes them), OUT (where
# graphs.json, the verdict, goes; each run's files go to OUT/graphs/). Tunables: PYTHON (python3),
# GRAPH_PROMPT_IDS (464,2068,7586,21831), GRAPH_STEPS (8), GRAPH_RUN_TIMEOUT (seconds per run,
# 120). Exit status: 0 when the verdict was written (whatever it says), 2 on a bad environment.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
log() { echo "[$(date +%H:%M:%S)] graphs: $*" >&2; }
bad_env() { log "error: $*"; exit 2; }
for v in KIT THAW_SOCKET THAWCTL MODEL_DIR OUT; do
  [[ -n ${!v:-} ]] || bad_env "$v is not set (see the head of $0)"
done
PRELOAD=$KIT/lib/libthaw-preload.so
[[ -f $PRELOAD ]] || bad_env "no $PRELOAD"
[[ -S $THAW_SOCKET ]] || bad_env "THAW_SOCKET=$THAW_SOCKET is not a socket (is thawd running?)"
[[ -f $MODEL_DIR/config.json ]] || bad_env "MODEL_DIR=$MODEL_DIR has no config.json"
read -r -a THAWCTL_CMD <<<"$THAWCTL"
# The interpreter itself, not a wrapper: the shim keys records by the engine's executable.
exe=$("$PYTHON" -c 'import sys; print(sys.executable)' 2>/dev/null)
[[ -n $exe && -x $exe ]] && PYTHON=$exe
WORK=$OUT/graphs
rm -rf "$WORK"
mkdir -p "$WORK" || bad_env "cannot create $WORK"
CURRENT=$WORK/current.json  # one --json path for both runs: one command line, one record
RUN_TIMEOUT=${GRAPH_RUN_TIMEOUT:-120}
[[ $RUN_TIMEOUT =~ ^[0-9]+$ ]] && ((RUN_TIMEOUT >= 10)) ||
  bad_env "GRAPH_RUN_TIMEOUT=$RUN_TIMEOUT: give a number of seconds, at least 10"
args=(--model "$MODEL_DIR" --prompt-ids "${GRAPH_PROMPT_IDS:-464,2068,7586,21831}"
  --steps "${GRAPH_STEPS:-8}" --json "$CURRENT" --timeout "$((RUN_TIMEOUT - 3))")  # its own watchdog first: the JSON says where it was

run() {  # run NAME: one run under the shim; NAME.json, .out, .err, .shim.log in WORK
  local rc
  rm -f "$CURRENT"
  log "$1 run: $PYTHON torch_graph.py under the shim"
  timeout -k 5 "$RUN_TIMEOUT" env -u THAW_PRELOAD_ATTACH -u PYTORCH_CUDA_ALLOC_CONF \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
    LD_PRELOAD="$PRELOAD" THAW_SOCKET="$THAW_SOCKET" THAW_PRELOAD_LOG="$WORK/$1.shim.log" \
    THAW_ENGINE_ID=kit-torch-graph "$PYTHON" "$HERE/torch_graph.py" "${args[@]}" \
    >"$WORK/$1.out" 2>"$WORK/$1.err"
  rc=$?
  [[ -f $CURRENT ]] && mv -f "$CURRENT" "$WORK/$1.json"
  log "$1 run exited $rc: $(tail -1 "$WORK/$1.out" 2>/dev/null)"
  # The summary line goes to the log file when there is one, else stderr: look in both.
  cat "$WORK/$1.shim.log" "$WORK/$1.err" >"$WORK/$1.logs" 2>/dev/null
}
run first
timeout 60 "${THAWCTL_CMD[@]}" --json artifacts >"$WORK/artifacts.json" 2>"$WORK/artifacts.err" ||
  echo '[]' >"$WORK/artifacts.json"
run second
"$PYTHON" "$HERE/graph_verdict.py" --first "$WORK/first.json" --second "$WORK/second.json" \
  --first-log "$WORK/first.logs" --second-log "$WORK/second.logs" \
  --artifacts "$WORK/artifacts.json" --out "$OUT/graphs.json" >/dev/null
[[ -s $OUT/graphs.json ]] || bad_env "graph_verdict.py wrote no verdict"
exit 0
