#!/bin/bash
# The box's worker command (coordinator.worker_command of every node): thawd's agent runs it
# for a launch-worker task, in the node's namespace, with LD_PRELOAD set to thaw's shim.
#
#   worker.sh MODEL PORT PP_RANK PP_SIZE PEERS TIMELINE
#
# MODEL ending in "-baseline" is the serverless-vLLM baseline the demo compares with: wait
# until thawd holds the whole model, then start the engine without the shim (download, then
# start). Any other model is thaw's path: the engine starts at once under the shim and reads
# its stage's bytes while thawd streams them. Both append their own phase marks to
# TIMELINE.box (launch, fetched, exec; wall clock) so the report can draw the wait; the engine writes TIMELINE.
# Environment (from the node's thawd): BOX_NODE_CACHE, BOX_NODE_BUS, BOX_THAWCTL,
# BOX_REFENGINE, BOX_ENGINE_ARGS (extra engine flags, space-separated).
set -euo pipefail
model=$1 port=$2 rank=$3 size=$4 peers=$5 timeline=$6
mark() { printf '{"phase":"%s","t":%s}\n' "$1" "$EPOCHREALTIME" >>"$timeline.box"; }
: >"$timeline.box"
mark launch
if [[ $model == *-baseline ]]; then
  # thawd's fetch task for this model may not have begun yet: retry until it is known.
  for ((i = 0; i < 600; i++)); do
    "$BOX_THAWCTL" --bus="$BOX_NODE_BUS" wait "$model" >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$BOX_THAWCTL" --bus="$BOX_NODE_BUS" wait "$model" >/dev/null
  mark fetched
  unset LD_PRELOAD THAW_SOCKET
fi
# The engine's timeline is on CLOCK_MONOTONIC: this mark, just before exec, ties its
# process_start to the wall clock the client's records use.
mark exec
# shellcheck disable=SC2086  # BOX_ENGINE_ARGS is a list of flags
exec "$BOX_REFENGINE" serve --model "$BOX_NODE_CACHE/$model" --host 0.0.0.0 --port "$port" \
  --pp-rank "$rank" --pp-size "$size" --pp-peers "$peers" --timeline "$timeline" \
  ${BOX_ENGINE_ARGS:-}
