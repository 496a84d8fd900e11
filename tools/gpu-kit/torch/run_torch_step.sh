#!/bin/bash
# The gpu-kit's PyTorch step (issue 21, step e): an unmodified PyTorch + transformers program
# (torch_engine.py, which knows nothing of thaw) loads a GPT-2-layout model from thawd's cache and
# generates greedily, without thaw and under LD_PRELOAD=libthaw-preload.so, and every run's tokens
# and time from process start to first token are compared with the run without thaw:
#
#   baseline_to_cuda     no shim: from_pretrained(dir) then .to("cuda")           (the reference)
#   attach_copy          shim, attached to a slot `thawctl prewarm` made (packed: copy mode)
#   record_to_cuda       shim, not attached — only when the copy-mode run left no engine layout
#   attach_zero_copy     shim, attached to a slot thawd prewarmed in the engine layout the
#                        runs before recorded (zero-copy: the shim log must say "zero-copy on")
#   shim_to_cuda         shim, not attached (its layout is compared with the record)
#   shim_graph           shim, plus a torch.cuda.CUDAGraph capture and replay of a decode step
#   shim_expandable      shim, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
#   baseline_device_map  no shim: from_pretrained(dir, device_map="cuda")
#   shim_device_map      shim, device_map="cuda"
#   baseline_expandable  no shim, expandable_segments:True (shim_expandable's time reference)
#
# They run in this order (what matters most first) so that a short budget still gets the main
# answers; each has its own timeout. The shim runs share one command line and THAW_ENGINE_ID
# where a layout record must carry over (copy → zero-copy → plain), and use another ID where the
# allocation sequence differs (expandable segments, device_map).
#
# Environment (all required but the tunables):
#   KIT          the kit directory: KIT/lib/libthaw-preload.so (KIT/bin/thawctl is what THAWCTL runs)
#   THAW_SOCKET  thawd's shim socket
#   THAWCTL      the command that reaches thawd, with its arguments, e.g.
#                "$KIT/bin/thawctl --bus=unix:path=/tmp/x/bus" (split on spaces)
#   MODEL_NAME   the model's name in thawd (thawctl prewarm MODEL_NAME)
#   MODEL_DIR    the model's directory in thawd's cache (what the engine loads)
#   OUT          where torch.json goes; logs and each run's files go to OUT/torch/
# Tunables: PYTHON (python3), TORCH_PROMPT_IDS (464,2068,7586,21831), TORCH_MAX_NEW_TOKENS (16),
#   TORCH_RUN_TIMEOUT (seconds per run, 180), TORCH_BUDGET_S (seconds for everything; 0: no
#   limit — runs that would start with under 25 s left are skipped as "out of budget"),
#   TORCH_RUNS (comma-separated names: only these; default all), TORCH_DTYPE (auto).
#
# Output: OUT/torch.json, a JSON list of {name, passed, skipped_reason, tokens_equal_baseline,
# first_token_s, baseline_first_token_s, shim_log_summary, ...} (torch_report.py says every
# field; passed is null for a skipped run), rewritten after every run so a step killed for time
# still leaves what it found. Exit status: 0 when it ran (whatever the runs found; also when
# torch with CUDA is not here: one skipped entry says why), 2 on a bad environment (one failed
# entry says what).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ENGINE=$HERE/torch_engine.py
REPORT=$HERE/torch_report.py
PYTHON=${PYTHON:-python3}
log() { echo "[$(date +%H:%M:%S)] torch: $*" >&2; }

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
if [[ $# -gt 0 ]]; then
  echo "run_torch_step.sh takes no arguments (its settings are environment variables; see --help)" >&2
  exit 2
fi
if [[ -z ${OUT:-} ]]; then
  echo "run_torch_step.sh: OUT (where torch.json goes) is not set; see --help" >&2
  exit 2
fi
mkdir -p "$OUT" || { echo "run_torch_step.sh: cannot create OUT=$OUT" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)
JSON=$OUT/torch.json

json_str() {  # json_str TEXT: TEXT as a JSON string
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/ }
  s=${s//$'\r'/}
  s=${s//$'\n'/\\n}
  printf '"%s"' "$s"
}
# single_entry PASSED(null|false) REASON: torch.json with one entry (skipped, or a bad setup).
single_entry() {
  local skipped=null error=null
  if [[ $1 == null ]]; then skipped=$(json_str "$2"); else error=$(json_str "$2"); fi
  printf '[{"name":"torch","passed":%s,"skipped_reason":%s,"error":%s,"tokens_equal_baseline":null,"first_token_s":null,"baseline_first_token_s":null,"shim_log_summary":null}]\n' \
    "$1" "$skipped" "$error" >"$JSON"
}

# ------------------------------------------------------------------ torch and a GPU, or skip
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  single_entry null "no $PYTHON on this machine (PyTorch is needed for this step)"
  log "skipped: no $PYTHON"
  exit 0
fi
# The check the kit's README promises: python3 -c 'import torch; assert torch.cuda.is_available()'
# (then transformers and safetensors), in one interpreter to spare the step's time.
PROBE='import sys
try:
    import torch
except Exception as e:
    print(f"SKIP import torch failed: {type(e).__name__}: {e}")
    sys.exit(0)
if not torch.cuda.is_available():
    print(f"SKIP torch {torch.__version__} (CUDA {torch.version.cuda}): torch.cuda.is_available() is False")
    sys.exit(0)
try:
    import safetensors, transformers
except Exception as e:
    print(f"SKIP torch with CUDA is here, but not transformers and safetensors: {type(e).__name__}: {e}")
    sys.exit(0)
print("EXE", sys.executable)
print(f"OK torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__},",
      torch.cuda.get_device_name(0))'
probe=$(timeout 120 "$PYTHON" -c "$PROBE" 2>&1)
rc=$?
verdict=$(printf '%s\n' "$probe" | grep -E '^(OK|SKIP) ' | tail -1)
if [[ $verdict == SKIP* ]]; then
  single_entry null "${verdict#SKIP }"
  log "skipped: ${verdict#SKIP }"
  exit 0
elif [[ $verdict != OK* ]]; then
  why=$(printf '%s\n' "$probe" | grep -v '^[[:space:]]*$' | tail -1)
  single_entry null "$PYTHON -c 'import torch; assert torch.cuda.is_available()' failed (exit $rc): ${why:-no output}"
  log "skipped: the torch probe exited $rc: ${why:-no output}"
  exit 0
fi
log "${verdict#OK }"
# The interpreter itself, not a wrapper script (pyenv's shims are bash): the shim is loaded
# into the engine only, and layout records are keyed by the engine's executable.
exe=$(printf '%s\n' "$probe" | sed -n 's/^EXE //p' | tail -1)
[[ -n $exe && -x $exe ]] && PYTHON=$exe

# ---------------------------------------------------------------------------- environment
bad_env() { single_entry false "bad environment: $*"; log "error: $*"; exit 2; }
for v in KIT THAW_SOCKET THAWCTL MODEL_NAME MODEL_DIR; do
  [[ -n ${!v:-} ]] || bad_env "$v is not set (run_torch_step.sh --help lists what it needs)"
done
PRELOAD=$KIT/lib/libthaw-preload.so
[[ -f $PRELOAD ]] || bad_env "no $PRELOAD"
[[ -S $THAW_SOCKET ]] || bad_env "THAW_SOCKET=$THAW_SOCKET is not a socket (is thawd running?)"
[[ -f $MODEL_DIR/config.json ]] || bad_env "MODEL_DIR=$MODEL_DIR has no config.json"
read -r -a THAWCTL_CMD <<<"$THAWCTL"
thawctl() { timeout 300 "${THAWCTL_CMD[@]}" "$@"; }
thawctl status >/dev/null 2>"$OUT/torch-thawctl.err" ||
  bad_env "'$THAWCTL status' failed: $(tail -2 "$OUT/torch-thawctl.err" | tr '\n' ' ')"
rm -f "$OUT/torch-thawctl.err"
PROMPT_IDS=${TORCH_PROMPT_IDS:-464,2068,7586,21831}
MAX_NEW=${TORCH_MAX_NEW_TOKENS:-16}
RUN_TIMEOUT=${TORCH_RUN_TIMEOUT:-180}
BUDGET=${TORCH_BUDGET_S:-0}
DTYPE=${TORCH_DTYPE:-auto}
MIN_RUN_S=25
[[ $PROMPT_IDS =~ ^[0-9]+(,[0-9]+)*$ ]] || bad_env "TORCH_PROMPT_IDS=$PROMPT_IDS is not a list like 464,2068"
[[ $MAX_NEW =~ ^[1-9][0-9]*$ ]] || bad_env "TORCH_MAX_NEW_TOKENS=$MAX_NEW is not a positive number"
[[ $RUN_TIMEOUT =~ ^[1-9][0-9]*$ && $RUN_TIMEOUT -ge 30 ]] || bad_env "TORCH_RUN_TIMEOUT=$RUN_TIMEOUT: give at least 30 s"
[[ $BUDGET =~ ^[0-9]+$ ]] || bad_env "TORCH_BUDGET_S=$BUDGET is not a number of seconds"
fits=$("$PYTHON" -c 'import json, sys
c = json.load(open(sys.argv[1]))
ids = [int(t) for t in sys.argv[2].split(",")]
v, n = c.get("vocab_size"), c.get("n_positions", c.get("max_position_embeddings"))
if isinstance(v, int) and max(ids) >= v:
    print(f"token id {max(ids)} of TORCH_PROMPT_IDS is not below the model'"'"'s vocab_size {v}")
elif isinstance(n, int) and len(ids) + int(sys.argv[3]) > n:
    print(f"prompt + TORCH_MAX_NEW_TOKENS exceed the model'"'"'s {n} positions")' \
  "$MODEL_DIR/config.json" "$PROMPT_IDS" "$MAX_NEW" 2>&1)
[[ -z $fits ]] || bad_env "$fits"

WORK=$OUT/torch
rm -rf "$WORK"
mkdir -p "$WORK" || bad_env "cannot create $WORK"
CURRENT=$WORK/current.json  # every run's --json: the shim keys layout records by command line

# ------------------------------------------------------------------------------- the plan
# name | kind | description | reference runs (first that succeeded) | requirements
PLAN=(
  "baseline_to_cuda|baseline|without thaw: from_pretrained(dir), .to(\"cuda\")||"
  "attach_copy|shim|under the shim, attached to a prewarmed packed slot (copy mode)|baseline_to_cuda|shim,attach,copy"
  "record_to_cuda|shim|under the shim, not attached: records the layout for zero-copy (only when the copy-mode run left none)|baseline_to_cuda|shim"
  "attach_zero_copy|shim|under the shim, attached to a slot in the engine layout (zero-copy)|baseline_to_cuda|shim,attach,zero_copy"
  "shim_to_cuda|shim|under the shim, not attached; layout compared with the record|baseline_to_cuda|shim"
  "shim_graph|shim|under the shim, plus a torch.cuda.CUDAGraph capture and replay of a decode step|baseline_to_cuda|shim,graph"
  "shim_expandable|shim|under the shim, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True|baseline_expandable,baseline_to_cuda|shim"
  "baseline_device_map|baseline|without thaw: from_pretrained(dir, device_map=\"cuda\")|baseline_to_cuda|"
  "shim_device_map|shim|under the shim, from_pretrained(dir, device_map=\"cuda\")|baseline_device_map,baseline_to_cuda|shim"
  "baseline_expandable|baseline|without thaw, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True|baseline_to_cuda|"
)
: >"$WORK/plan.tsv"
: >"$WORK/status.tsv"
: >"$WORK/notes.tsv"
for p in "${PLAN[@]}"; do
  IFS='|' read -r name kind desc refs req <<<"$p"
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$kind" "$desc" "$refs" "$req" >>"$WORK/plan.tsv"
done
if [[ -n ${TORCH_RUNS:-} ]]; then
  for r in ${TORCH_RUNS//,/ }; do
    grep -q "^$r	" "$WORK/plan.tsv" || bad_env "TORCH_RUNS names an unknown run '$r' (see --help)"
  done
fi

status() { printf '%s\t%s\t%s\n' "$1" "$2" "${3//$'\n'/ }" >>"$WORK/status.tsv"; }
note() { printf '%s\t%s\t%s\n' "$1" "$2" "${3//$'\n'/ }" >>"$WORK/notes.tsv"; }
report() { "$PYTHON" "$REPORT" --work "$WORK" --out "$JSON" || log "warning: torch_report.py failed"; }
selected() {
  [[ -z ${TORCH_RUNS:-} || ,$TORCH_RUNS, == *,$1,* ]] && return 0
  # The recording run exists for the zero-copy run.
  [[ $1 == record_to_cuda && ,$TORCH_RUNS, == *,attach_zero_copy,* ]]
}
report

# ------------------------------------------------------------------------------- the runs
have_time() { ((BUDGET == 0 || BUDGET - SECONDS - 5 >= MIN_RUN_S)); }
# run_engine NAME SHIM(0|1) ATTACH(0|1) ENGINE_ID MODE GRAPH(0|1) ALLOC_CONF: one engine run
# to its exit; NAME.json (the engine's result), .out, .err, .shim.log in WORK.
run_engine() {
  local name=$1 shim=$2 attach=$3 id=$4 mode=$5 graph=$6 alloc=$7 limit=$RUN_TIMEOUT left t0 rc
  if ! selected "$name"; then
    status "$name" skip "not selected (TORCH_RUNS=$TORCH_RUNS)"
    return 1
  fi
  if ! have_time; then
    status "$name" skip "out of budget: $((BUDGET - SECONDS)) s of TORCH_BUDGET_S=$BUDGET left"
    report
    return 1
  fi
  left=$((BUDGET - SECONDS - 5))
  ((BUDGET > 0 && left < limit)) && limit=$left
  # One command line for every run of a mode (no per-run values): thawd keys layout records
  # by it, and the zero-copy run must find the record the copy-mode run left.
  local args=(--model "$MODEL_DIR" --mode "$mode" --prompt-ids "$PROMPT_IDS"
    --max-new-tokens "$MAX_NEW" --dtype "$DTYPE" --json "$CURRENT" --timeout "$((RUN_TIMEOUT - 10))")
  ((graph)) && args+=(--graph)
  # The same environment with and without thaw, but for thaw's own variables.
  local envs=(HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1)
  [[ -n $alloc ]] && envs+=(PYTORCH_CUDA_ALLOC_CONF="$alloc")
  if ((shim)); then
    envs+=(LD_PRELOAD="$PRELOAD" THAW_SOCKET="$THAW_SOCKET" THAW_PRELOAD_LOG="$WORK/$name.shim.log"
      THAW_PRELOAD_ATTACH="$attach" THAW_ENGINE_ID="$id")
  fi
  rm -f "$CURRENT" "$WORK/$name.shim.log"
  log "$name: ${PLAN_DESC[$name]} (timeout ${limit} s)"
  t0=$(date +%s.%N)
  timeout -k 5 "$limit" env -u LD_PRELOAD -u PYTORCH_CUDA_ALLOC_CONF -u THAW_PRELOAD_ATTACH \
    -u THAW_PRELOAD_LOG -u THAW_ENGINE_ID -u THAW_PRELOAD_DISABLE -u THAW_PRELOAD_LEASE \
    "${envs[@]}" TORCH_ENGINE_START="$t0" "$PYTHON" "$ENGINE" "${args[@]}" \
    >"$WORK/$name.out" 2>"$WORK/$name.err"
  rc=$?
  [[ -f $CURRENT ]] && mv -f "$CURRENT" "$WORK/$name.json"
  if ((rc == 0)); then
    status "$name" 0 ""
  elif ((rc == 124 || rc == 137)) && [[ ! -f $WORK/$name.json ]]; then
    status "$name" "$rc" "killed after ${limit} s (the run's timeout; the engine's stacks are in $name.err)"
    log "$name: killed after ${limit} s"
  else
    status "$name" "$rc" "$(tail -1 "$WORK/$name.err" 2>/dev/null)"
    log "$name: exited $rc: $(tail -1 "$WORK/$name.err" 2>/dev/null)"
  fi
  report
  return $rc
}
declare -A PLAN_DESC=()
for p in "${PLAN[@]}"; do
  IFS='|' read -r name _ desc _ <<<"$p"
  PLAN_DESC[$name]=$desc
done

# ---------------------------------------------------------------------------- slot helpers
slots_json() { thawctl --json slots 2>/dev/null || echo '[]'; }
slot_field() {  # slot_field ID FIELD: that slot's FIELD ("none": no such slot)
  slots_json | "$PYTHON" -c 'import json,sys
s=[x for x in json.load(sys.stdin) if x.get("id")==sys.argv[1]]
print(s[0].get(sys.argv[2], "") if s else "none")' "$1" "$2"
}
model_slot_ids() {
  slots_json | "$PYTHON" -c 'import json,sys
print(" ".join(x["id"] for x in json.load(sys.stdin) if x.get("model")==sys.argv[1]))' "$MODEL_NAME"
}
evict_model_slots() {
  local id
  for id in $(model_slot_ids); do thawctl evict "$id" >/dev/null 2>&1 || true; done
}
# settle_slot ID: until it is prewarmed, empty, failed or gone (an engine that exited hands
# its slot back once thawd has checked it; at most 30 s).
settle_slot() {
  local state
  for _ in $(seq 150); do
    state=$(slot_field "$1" state)
    [[ $state == @(prewarmed|empty|failed|none) ]] && return 0
    sleep 0.2
  done
}
# prewarm_slot: evicts the model's slots and prewarms it again; sets SLOT_ID, SLOT_LAYOUT,
# PREWARM_S, or PREWARM_ERROR and returns 1.
prewarm_slot() {
  local tries=0 out t0
  t0=$(date +%s.%N)
  for ((;;)); do
    evict_model_slots
    if out=$(thawctl --json prewarm "$MODEL_NAME" 2>"$WORK/prewarm.err"); then break; fi
    # The pool gets back the pages an engine had some time after the engine exits.
    if grep -q 'page pool: .* 0 free' "$WORK/prewarm.err" && ((++tries < 100)); then
      sleep 0.2
      continue
    fi
    PREWARM_ERROR="thawctl prewarm $MODEL_NAME failed: $(tail -2 "$WORK/prewarm.err" | tr '\n' ' ')"
    return 1
  done
  PREWARM_S=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
  read -r SLOT_ID SLOT_LAYOUT SLOT_STATE < <(printf '%s\n' "$out" | tail -1 | "$PYTHON" -c 'import json,sys
s=json.load(sys.stdin); print(s.get("id") or "?", s.get("layout") or "?", s.get("state") or "?")' 2>/dev/null ||
    echo "? ? ?")
  if [[ $SLOT_STATE != prewarmed ]]; then
    PREWARM_ERROR="thawctl prewarm $MODEL_NAME left slot $SLOT_ID $SLOT_STATE, not prewarmed"
    return 1
  fi
  log "prewarmed $MODEL_NAME into $SLOT_ID ($SLOT_LAYOUT layout) in $PREWARM_S s"
}
# shellcheck disable=SC2317  # the EXIT trap runs it
cleanup() { evict_model_slots; }
trap cleanup EXIT

# ------------------------------------------------------------------------------ the order
log "model $MODEL_NAME at $MODEL_DIR; prompt $PROMPT_IDS, $MAX_NEW new tokens; results in $JSON"
if ! thawctl wait "$MODEL_NAME" --timeout 300 >/dev/null 2>"$WORK/wait.err"; then
  log "warning: thawctl wait $MODEL_NAME: $(tail -1 "$WORK/wait.err") (going on: the files are in $MODEL_DIR)"
fi
evict_model_slots  # no slot of the model while the baseline runs

run_engine baseline_to_cuda 0 0 "" to_cuda 0 ""

# Copy mode: a packed slot (a fresh thawd has no layout record of this model yet).
if selected attach_copy && have_time; then
  if prewarm_slot; then
    note attach_copy slot "$SLOT_ID"
    note attach_copy slot_layout "$SLOT_LAYOUT"
    note attach_copy prewarm_s "$PREWARM_S"
    [[ $SLOT_LAYOUT == packed ]] || note attach_copy warning "thawd prewarmed in the $SLOT_LAYOUT layout (a layout record of $MODEL_NAME existed before this step): this run is not plain copy mode"
    run_engine attach_copy 1 1 torch-to_cuda to_cuda 0 ""
    settle_slot "$SLOT_ID"
  else
    status attach_copy 1 "$PREWARM_ERROR"
    log "attach_copy: $PREWARM_ERROR"
  fi
else
  run_engine attach_copy 1 1 torch-to_cuda to_cuda 0 ""  # says why it does not run
fi

# Zero-copy: the copy-mode run recorded this configuration's layout (same command line and
# THAW_ENGINE_ID); thawd prewarms the newest record's engine layout. A copy-mode engine gives
# the slot's pages back as it copies them out, so its slot is evicted and prewarmed again.
if selected attach_zero_copy && have_time; then
  zc_ok=1
  if [[ -n ${SLOT_ID:-} && $(slot_field "$SLOT_ID" state) == prewarmed && $(slot_field "$SLOT_ID" layout) == engine ]]; then
    SLOT_LAYOUT=engine PREWARM_S="0 (the slot the copy-mode run handed back)"
  else
    prewarm_slot || zc_ok=0
  fi
  if ((!zc_ok)); then
    status record_to_cuda skip "not run: $PREWARM_ERROR"
  elif [[ $SLOT_LAYOUT != engine ]]; then
    log "no engine layout after the copy-mode run: one recorded run under the shim first"
    run_engine record_to_cuda 1 0 torch-to_cuda to_cuda 0 ""
    prewarm_slot || zc_ok=0
  else
    status record_to_cuda skip "not needed: the copy-mode run recorded the layout"
  fi
  if ((zc_ok)); then
    note attach_zero_copy slot "$SLOT_ID"
    note attach_zero_copy slot_layout "$SLOT_LAYOUT"
    note attach_zero_copy prewarm_s "$PREWARM_S"
    [[ $SLOT_LAYOUT == engine ]] || note attach_zero_copy warning "the slot is in the $SLOT_LAYOUT layout, not the engine's"
    run_engine attach_zero_copy 1 1 torch-to_cuda to_cuda 0 ""
    settle_slot "$SLOT_ID"
  else
    status attach_zero_copy 1 "$PREWARM_ERROR"
    log "attach_zero_copy: $PREWARM_ERROR"
  fi
else
  status record_to_cuda skip "not needed (attach_zero_copy does not run)"
  run_engine attach_zero_copy 1 1 torch-to_cuda to_cuda 0 ""  # says why it does not run
fi

run_engine shim_to_cuda 1 0 torch-to_cuda to_cuda 0 ""
run_engine shim_graph 1 0 torch-to_cuda to_cuda 1 ""
run_engine shim_expandable 1 0 torch-to_cuda-expandable to_cuda 0 expandable_segments:True
run_engine baseline_device_map 0 0 "" device_map 0 ""
run_engine shim_device_map 1 0 torch-device_map device_map 0 ""
run_engine baseline_expandable 0 0 "" to_cuda 0 expandable_segments:True

"$PYTHON" "$REPORT" --work "$WORK" --out "$JSON" --print-summary || log "warning: torch_report.py failed"
exit 0
