#!/bin/bash
# ctest cluster.coordinator_restart (root only; 77 = skipped): the coordinator restarting
# mid-consolidation (issue 25, "bad input and faults"). A 2-node box behind 20 Mbit/s links;
# a PP=2 cold start through the gateway; once the plan is consolidating (the full-memory
# stage's node fetching the rest, PHASE_LOADING), the coordinator is SIGKILLed and started
# again with the same keys and endpoints. The plan must be rebuilt from what the nodes report
# and reach PHASE_CONSOLIDATED, and a request after the restart must be answered through the
# gateway with a single engine's tokens.
#
# usage: coordinator_restart_test.sh BUILD_DIR
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
PROMPT=11,22,33,44,55
ENGINE_FLAGS="--max-num-seqs 2 --max-model-len 64 --max-num-batched-tokens 64 --num-gpu-blocks-override 32 --enforce-eager"
EMU_DIR=$(mktemp -d "/dev/shm/$BOX.emu-ref.XXXXXX")
defer "rm -rf '$EMU_DIR'"
# shellcheck disable=SC2086
REF=$(env REFENGINE_LIBCUDA="$LIBCUDA" THAW_EMU_KERNELS="$TWINS" THAW_EMU_DEVICE_MEMORY=1G \
  THAW_EMU_STATE_DIR="$EMU_DIR" "$REFENGINE" generate --model "$MODELS/$MODEL" --tokens "$PROMPT" \
  --max-tokens 4 --ignore-eos --json $ENGINE_FLAGS 2>"$WORK/ref.err" |
  /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["tokens"])') ||
  die "the single-engine reference run failed: $(tail -3 "$WORK/ref.err")"

export BOX_ENGINE_ARGS=$ENGINE_FLAGS BOX_EMU_MEMORY=1G BOX_LINK_BYTES=2.5MB
# The standalone worker (pp_size 1) starts 0.5 s late: the loading phase otherwise lasts only
# the emulated engine's start, which the polling below missed in 2 of 5 runs.
BOX_WORKER_COMMAND='["/bin/bash", "-c", "if [ \"$4\" = 1 ]; then sleep 0.5; fi; exec /bin/bash '
BOX_WORKER_COMMAND+="$BOX_LIB_DIR/worker.sh"
BOX_WORKER_COMMAND+=' \"$@\"", "worker", "{model}", "{port}", "{pp_rank}", "{pp_size}", "{peers}", "{timeline}"]'
export BOX_WORKER_COMMAND
box_network 2 20mbit
box_registry "$MODELS" "$MODEL/config.json"
box_coordinator --launch-workers --worker-ports 9100 --worker-port-count 64 \
  --fixed-startup-costs --t-cc 0.1 --t-cu 0.1 --t-l 0.3
box_node 0
box_node 1
box_wait_nodes 2
box_gateway --hold-deadline 45s
SLO=$(awk -v m="$BYTES" 'BEGIN { printf "%.4f", 0.5 + 1.15 * m / 2.5e6 / 2 }')
cluster deploy "$MODEL" --size "$BYTES" --layers 4 --ttft "$SLO" >/dev/null

phase() {  # the model's plan: "PHASE stages", or nothing
  cluster state 2>/dev/null | /usr/bin/python3 -c 'import json,sys
for p in json.load(sys.stdin).get("plans", []):
    if p["model"] == sys.argv[1]: print(p.get("phase"), p.get("stages"))' "$MODEL" 2>/dev/null || true
}
ask() {  # ask NAME: one request through the gateway, checked against the single engine
  local out code got
  out=$(in_ns "$BOX-ctl" curl -sS --max-time 60 -w '\n%{http_code}' "$BOX_GATEWAY/v1/completions" \
    -H 'Content-Type: application/json' \
    -d "{\"model\":\"$MODEL\",\"prompt\":[${PROMPT}],\"max_tokens\":4,\"ignore_eos\":true}") || true
  code=${out##*$'\n'}
  [[ $code == 200 ]] || die "$1: the gateway answered $code: ${out%$'\n'*}"
  got=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["choices"][0]["token_ids"])' "${out%$'\n'*}")
  [[ $got == "$REF" ]] || die "$1: answered $got, a single engine $REF"
  log "$1: answered with the single engine's tokens"
}

ask "first request (cold start)"
p=$(phase)
[[ ${p#* } == 2 ]] || die "expected a 2-stage plan, got: $p"
# The loading phase lasts as long as the standalone engine's start: polled without a Python
# start per look (the box's only plan; a phase is the only PHASE_ value in the state).
seen=''
for ((t = 0; t < 1000; t++)); do
  p=$(cluster state 2>/dev/null | grep -o 'PHASE_[A-Z]*' | head -1)
  [[ $p == PHASE_LOADING ]] && { seen=1; break; }
  [[ $p == PHASE_CONSOLIDATED || $p == PHASE_HANDOVER || $p == PHASE_STOPPING ]] && break
  sleep 0.01
done
[[ -n $seen ]] || die "never saw the plan loading (consolidating) before it moved on: $p"
log "plan is $p: SIGKILL the coordinator, start it again"
kill -KILL "$BOX_COORDINATOR_PID"
wait "$BOX_COORDINATOR_PID" 2>/dev/null || true
# Away long enough for the standalone worker to be ready when the nodes re-register: the
# new coordinator then rebuilds the plan in the hand-over (the case that stayed stuck).
sleep 1.5
box_coordinator_start coordinator.restart.log
rebuilt=''
for ((t = 0; t < 100; t++)); do
  p=$(phase)
  [[ -z $rebuilt && -n $p ]] && rebuilt=$p
  [[ $p == PHASE_CONSOLIDATED* ]] && break
  sleep 0.1
done
log "the rebuilt plan was first seen in ${rebuilt:-no phase}"
if [[ $p != PHASE_CONSOLIDATED* ]]; then
  cluster state | /usr/bin/python3 -c 'import json,sys
for p in json.load(sys.stdin).get("plans", []):
    print({k: p.get(k) for k in ("phase", "in_flight", "handover", "phase_error", "rebuilt")})
    for s in p["placement"]:
        print("  ", {k: s.get(k) for k in ("stage", "node_id", "worker_state", "worker_ready", "standalone_state", "standalone_ready", "standalone_route", "route_state")})' >&2
  tail -5 "$BOX_WORK/coordinator/coordinator.restart.log" >&2
  die "after the restart the plan is '$p', not consolidated"
fi
log "after the restart the plan resumed to $p"
log "the restarted coordinator: $(grep -E 'hand-over|subscribed' \
  "$BOX_WORK/coordinator/coordinator.restart.log" | cut -c1-160 | tr '\n' ';')"
ask "request after the restart"
