#!/bin/bash
# thaw's main job on one node, on the CUDA driver emulator (`make demo`; issue 20).
#
# A private thawd (its own state, cache and socket under a temporary directory, a private
# dbus-daemon, the shipped packaging/thawd.toml with only its paths changed), a synthetic
# GPT-2 model published with `thaw-fetch publish` into a registry served by a loopback nginx,
# and the same unmodified reference engine started four ways, each to its first token:
#
#   (a) cold       thawctl fetch, then the engine from the complete cache, no shim: the
#                  sequential baseline every paper compares with
#   (b) streamed   thawctl fetch of a second copy of the model, and the engine under
#                  LD_PRELOAD=libthaw-preload.so as soon as the files exist: it loads while
#                  thawd fetches
#   (c) copy       thawctl prewarm (packed layout, before the run), engine attached to the slot
#                  (THAW_PRELOAD_ATTACH=1): its weight copies become device-to-device copies
#   (d) zero-copy  thawctl prewarm in the engine layout an earlier run recorded, engine
#                  attached: its weights are the slot's pages, its weight copies move nothing
#
# It prints one table (and --json FILE: the same, machine-readable), `thawctl slots`, one
# busctl read of a slot's properties, and writes a timeline picture (SVG) whose path it
# prints. Nothing needs root. Everything it starts is stopped on exit, error or Ctrl-C.
#
# usage: tools/demo/run-demo.sh [--quick] [--repeat N] [--json FILE] [--svg FILE] [--build DIR]
#                                [--kv auto|N]
#   --quick    a small model (the ctest demo.quick); the default is a gpt2-small-sized model
#   --repeat   run the engine of (a), (c) and (d) N times (default 3; each (c) from a fresh packed slot)
#              and report each phase's median: the emulator's copies are CPU copies, noisy on
#              a busy machine ((a)'s fetch and (b) run once)
#   --build    the build tree (default build/default; `make demo` builds it)
#   --kv       KV cache blocks of every engine run (default 64); "auto": the engine sizes it
#              from cuMemGetInfo (--gpu-memory-utilization 0.9), see "KV cache" below
#
# KV cache: every run uses one fixed number of KV blocks (as bench/preload does), so the four
# runs do the same work after their weights and allocate the same sequence (a layout record
# compares allocations one by one). With thawd's default pool_share 0.9 an engine that is not
# attached to a slot, (a) and (b), is told by the driver that only the other 10 % of the GPU is
# free, which at --gpu-memory-utilization 0.9 leaves it no KV budget at all; `--kv auto` shows
# what the engines do with their own sizing.
# shellcheck source=bench/store/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../bench/store/lib.sh"
trap 'log "error: line $LINENO: \"$BASH_COMMAND\" exited $?"' ERR

QUICK=0
JSON_OUT=
SVG_OUT=
BUILD=$REPO_ROOT/build/default
KV=64
REPEAT=3
usage() { die "usage: $0 [--quick] [--repeat N] [--json FILE] [--svg FILE] [--build DIR] [--kv auto|N]"; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) QUICK=1; shift ;;
    --json) [[ $# -ge 2 ]] || usage; JSON_OUT=$2; shift 2 ;;
    --svg) [[ $# -ge 2 ]] || usage; SVG_OUT=$2; shift 2 ;;
    --build) [[ $# -ge 2 ]] || usage; BUILD=$2; shift 2 ;;
    --kv) [[ $# -ge 2 ]] || usage; KV=$2; shift 2 ;;
    --repeat) [[ $# -ge 2 ]] || usage; REPEAT=$2; shift 2 ;;
    -h | --help) sed -n '2,/^# shellcheck/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) usage ;;
  esac
done
[[ $KV == auto || $KV =~ ^[1-9][0-9]*$ ]] || die "--kv must be auto or a number of blocks"
[[ $REPEAT =~ ^[1-9]$ ]] || die "--repeat must be 1 to 9"
[[ -d $BUILD ]] || die "no build tree at $BUILD: run make build"
BUILD=$(cd "$BUILD" && pwd)
T_DEMO=$(now)

# ------------------------------------------------------------------------ prerequisites
missing_pkg() {  # missing_pkg WHAT PACKAGE
  die "$1 is missing: install Debian's $2 (sudo apt-get install $2, or scripts/install-deps)"
}
[[ -x /usr/sbin/nginx ]] || missing_pkg "nginx (the demo's model registry)" nginx-light
command -v dbus-daemon >/dev/null || missing_pkg "dbus-daemon (thawd's private bus)" dbus-daemon
command -v busctl >/dev/null || missing_pkg "busctl" systemd
command -v curl >/dev/null || missing_pkg "curl" curl
CUDA_ROOT=${CUDA_ROOT:-/usr/local/cuda}
if [[ ! -f $CUDA_ROOT/include/cuda.h ]]; then
  die "$CUDA_ROOT/include/cuda.h not found: the CUDA 13 toolkit (headers and nvcc; no GPU or" \
    "driver needed) is not a Debian package — install it from NVIDIA or set CUDA_ROOT"
fi
THAWD_BIN=$BUILD/daemon/thawd/thawd
THAWCTL_BIN=$BUILD/tools/thawctl/thawctl
THAW_FETCH_BIN=$BUILD/tools/thaw-fetch/thaw-fetch
GENMODEL=$BUILD/tools/genmodel/thaw-genmodel
REFENGINE=$BUILD/tools/refengine/refengine
PRELOAD=$BUILD/preload/libthaw-preload.so
LIBCUDA=$BUILD/emu/libcuda.so.1
TWINS=$BUILD/tools/refengine/librefengine_kernels_twins.so
if [[ ! -x $REFENGINE || ! -f $TWINS ]] && [[ ! -x ${THAW_NVCC:-$CUDA_ROOT/bin/nvcc} ]]; then
  die "the reference engine was not built: its kernels need nvcc (${THAW_NVCC:-$CUDA_ROOT/bin/nvcc}," \
    "the CUDA 13 toolkit's compiler; not a Debian package) — install it, then make build"
fi
for f in "$THAWD_BIN" "$THAWCTL_BIN" "$THAW_FETCH_BIN" "$GENMODEL" "$REFENGINE" "$PRELOAD" \
  "$LIBCUDA" "$TWINS"; do
  [[ -e $f ]] || die "$f is not built: make build (or cmake --build --preset default)"
done

# ------------------------------------------------------------------------------ model
# Big enough that weights matter, small enough for the CPU twins of the kernels. The model is
# generated and published once per build tree (build/<preset>/demo/models) and reused.
if ((QUICK)); then
  MODEL_SHAPE=(--layers 6 --embd 768 --heads 12 --vocab 16384 --positions 256 --dtype f16)
  EMU_MEMORY=2G
else
  MODEL_SHAPE=(--layers 12 --embd 768 --heads 12 --vocab 50257 --positions 1024 --dtype f16)
  EMU_MEMORY=4G
fi
# The emulated GPU's links, scaled to 1/100 of an H100's (PCIe 25 -> 0.25 GB/s, HBM 2000 -> 20
# GB/s; the same 1:80 ratio). At full speed the model would charge a 250 MB upload 10 ms, far
# below what this host's memcpy takes to move it, so every copy would cost host CPU time alone
# and a device-to-device copy (copy mode) would look no cheaper than an upload from the page
# cache (cold). Scaled, the modelled transfer sets the weight phase as on hardware; the
# kernels' CPU twins are slower than an H100 by far more anyway. Ratios transfer, seconds don't.
LINK_PCIE_GBPS=${THAW_DEMO_PCIE_GBPS:-0.25}
LINK_D2D_GBPS=${THAW_DEMO_D2D_GBPS:-20}
SHAPE_TAG=$(printf '%s' "${MODEL_SHAPE[*]}" | tr -d ' -' | tr -c 'a-z0-9\n' '_')
OUT_DIR=$BUILD/demo
REGISTRY_ROOT=$OUT_DIR/models/$SHAPE_TAG
MODEL_NAME=demo-gpt2
STREAM_NAME=demo-gpt2-streamed  # the same files under a second name: (b) fetches it afresh
MODEL_DIR=$REGISTRY_ROOT/$MODEL_NAME
mkdir -p "$OUT_DIR/models"
# The run's logs (thawd, engines, shims, timelines) are kept in $OUT_DIR/logs, also on failure.
LOGS=$OUT_DIR/logs
defer "rm -rf '$LOGS'; mkdir -p '$LOGS'; cp '$WORK'/*.log '$WORK'/*.err '$WORK'/*.out '$WORK'/*.timeline '$WORK'/*.toml '$WORK'/*.tsv '$LOGS'/"
if [[ ! -f $MODEL_DIR/thaw-manifest.json || ! -f $REGISTRY_ROOT/$STREAM_NAME/thaw-manifest.json ]]; then
  log "generating a synthetic GPT-2 (${MODEL_SHAPE[*]}) into $REGISTRY_ROOT"
  rm -rf "$REGISTRY_ROOT"
  # Written aside and renamed into place: a concurrent or interrupted run never sees half.
  NEW_ROOT=$(mktemp -d "$REGISTRY_ROOT.new.XXXXXX")
  defer "rm -rf '$NEW_ROOT'"
  "$GENMODEL" --size custom "${MODEL_SHAPE[@]}" --shard-size 200MB --out "$NEW_ROOT/$MODEL_NAME" \
    --quiet >/dev/null
  "$THAW_FETCH_BIN" publish --chunk-size 1MiB --quiet "$NEW_ROOT/$MODEL_NAME"
  cp -al "$NEW_ROOT/$MODEL_NAME" "$NEW_ROOT/$STREAM_NAME"
  chmod 755 "$NEW_ROOT"
  mv -T "$NEW_ROOT" "$REGISTRY_ROOT" 2>/dev/null || true  # a concurrent run may have won
fi
MODEL_FILES=()
while IFS= read -r f; do MODEL_FILES+=("$f"); done < <(cd "$MODEL_DIR" &&
  find . -maxdepth 1 -type f ! -name thaw-manifest.json -printf '%P\n' | LC_ALL=C sort)
MODEL_BYTES=$(cd "$MODEL_DIR" && stat -c %s "${MODEL_FILES[@]}" | awk '{s += $1} END {print s}')
log "model $MODEL_NAME: $((MODEL_BYTES / 1000000)) MB in ${#MODEL_FILES[@]} files; emulated GPU $EMU_MEMORY"

# ---------------------------------------------------------------------------- registry
PORT=$(free_port)
REGISTRY=http://127.0.0.1:$PORT
export no_proxy=127.0.0.1,localhost NO_PROXY=127.0.0.1,localhost
start_nginx demo "127.0.0.1:$PORT"
log "registry: nginx $! on $REGISTRY (root $REGISTRY_ROOT)"

# ------------------------------------------------------------------------ private bus
# A session-style bus of our own: anyone may talk, only org.thaw.Node1 may be owned.
cat >"$WORK/bus.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>custom</type><listen>unix:path=$WORK/bus</listen><auth>EXTERNAL</auth>
<policy context="default"><allow user="*"/><allow own="org.thaw.Node1"/>
<allow send_destination="*"/><allow receive_sender="*"/></policy></busconfig>
CONF
dbus-daemon --nofork --nopidfile --config-file="$WORK/bus.conf" 2>"$WORK/dbus.log" &
DBUS_PID=$!
defer "kill $DBUS_PID; wait $DBUS_PID"
for _ in $(seq 100); do [[ -S $WORK/bus ]] && break; sleep 0.05; done
[[ -S $WORK/bus ]] || die "dbus-daemon did not start: $(cat "$WORK/dbus.log")"
log "private bus: dbus-daemon $DBUS_PID on $WORK/bus"
BUS="unix:path=$WORK/bus"
THAWCTL=("$THAWCTL_BIN" --bus="$BUS")

# ---------------------------------------------------------------------------- thawd
# The shipped configuration with only its paths changed (and the registry, which it leaves
# empty). Not root: the shim socket's allow_groups must name a group of ours.
CACHE=$(mktemp -d /dev/shm/thaw-demo-cache.XXXXXX)
EMU_STATE=$(mktemp -d /dev/shm/thaw-demo-emu.XXXXXX)
defer "rm -rf '$CACHE' '$EMU_STATE'"
STATE=$WORK/state
SOCKET=$WORK/thawd.sock
sed -e "s|^state_dir = .*|state_dir = \"$STATE\"|" \
  -e "s|^cache_dir = .*|cache_dir = \"$CACHE\"|" \
  -e "s|^registry = .*|registry = \"$REGISTRY\"|" \
  -e "s|^socket = .*|socket = \"$SOCKET\"|" \
  -e "s|^bus = .*|bus = \"$BUS\"|" \
  -e "s|^worker_preload = .*|worker_preload = \"$PRELOAD\"|" \
  "$REPO_ROOT/packaging/thawd.toml" >"$WORK/thawd.toml"
if [[ $(id -u) -ne 0 ]]; then
  GROUP=$(id -gn)
  sed -i "s|^allow_groups = .*|allow_groups = [\"thaw\", \"$GROUP\"]|" "$WORK/thawd.toml"
  log "not root: the shim socket also admits group $GROUP (shim.allow_groups); nothing needs root"
fi
log "thawd.toml: the shipped file with these lines changed:"
diff "$REPO_ROOT/packaging/thawd.toml" "$WORK/thawd.toml" | grep '^>' | sed 's/^>/   /' >&2 || true
EMU_ENV=(THAW_EMU_DEVICE_MEMORY="$EMU_MEMORY" THAW_EMU_STATE_DIR="$EMU_STATE" THAW_EMU_TIMING=1
  THAW_EMU_PCIE_GBPS="$LINK_PCIE_GBPS" THAW_EMU_D2D_GBPS="$LINK_D2D_GBPS")
"$THAWD_BIN" --config "$WORK/thawd.toml" --check-config >/dev/null 2>"$WORK/check.log" ||
  die "thawd rejects the demo's configuration: $(cat "$WORK/check.log")"
env THAW_LIBCUDA="$LIBCUDA" "${EMU_ENV[@]}" "$THAWD_BIN" --config "$WORK/thawd.toml" \
  2>"$WORK/thawd.log" &
THAWD_PID=$!
defer "kill -TERM $THAWD_PID; wait $THAWD_PID"
for _ in $(seq 400); do
  [[ -S $SOCKET ]] && busctl --address="$BUS" status org.thaw.Node1 >/dev/null 2>&1 && break
  kill -0 "$THAWD_PID" 2>/dev/null || die "thawd exited: $(tail -5 "$WORK/thawd.log")"
  sleep 0.05
done
[[ -S $SOCKET ]] || die "thawd did not come up in 20 s: $(tail -5 "$WORK/thawd.log")"
log "thawd $THAWD_PID up: $("${THAWCTL[@]}" --json gpus | /usr/bin/python3 -c 'import json,sys
print("; ".join("GPU %d: pool %.0f MiB of the emulated %s" % (g["index"], g["pool_bytes"] / 2**20, sys.argv[1]) for g in json.load(sys.stdin)))' "$EMU_MEMORY")"

# ---------------------------------------------------------------------------- engines
# Small phases after the weights (the CPU runs every kernel): one sequence, a 4-token prompt,
# one CUDA graph (batch 1) with one warm-up, 4 tokens generated.
# shellcheck disable=SC2054  # the commas are the engine's token list
ENGINE_ARGS=(generate --tokens 464,2068,7586,21831 --max-tokens 4 --ignore-eos --json
  --max-num-seqs 1 --max-model-len 64 --max-num-batched-tokens 16 --cuda-graph-sizes 1
  --num-warmups 1)
((QUICK)) && ENGINE_ARGS[2]=464,2068,7586,2183
[[ $KV == auto ]] || ENGINE_ARGS+=(--num-gpu-blocks-override "$KV")
RUNS=$WORK/runs.tsv
: >"$RUNS"
engine() {  # engine NAME MODEL_DIR [env...]: one engine run to its exit; NAME.timeline, NAME.out
  local name=$1 dir=$2
  shift 2
  env REFENGINE_LIBCUDA="$LIBCUDA" THAW_EMU_KERNELS="$TWINS" "${EMU_ENV[@]}" "$@" \
    "$REFENGINE" "${ENGINE_ARGS[@]}" --model "$dir" --timeline "$WORK/$name.timeline" \
    >"$WORK/$name.out" 2>"$WORK/$name.err" ||
    die "engine run $name failed: $(tail -5 "$WORK/$name.err")$(shim_tail "$name")"
}
shim_tail() { if [[ -f $WORK/$1.shim.log ]]; then printf '\nshim log: %s' "$(tail -3 "$WORK/$1.shim.log")"; fi; }
# THAW_DEMO_LD_PRELOAD: the LD_PRELOAD value (an ASan build puts the sanitizer runtime first).
shimmed() {  # shimmed NAME MODEL_DIR ATTACH(0|1)
  engine "$1" "$2" LD_PRELOAD="${THAW_DEMO_LD_PRELOAD:-$PRELOAD}" THAW_SOCKET="$SOCKET" \
    THAW_PRELOAD_LOG="$WORK/$1.shim.log" THAW_PRELOAD_ATTACH="$3"
}
record() {  # record ID LABEL NAMES RUN_START FETCH_END ENGINE_START (NAMES: "cold1 cold2 ...")
  local n timelines=() outs=()
  for n in $3; do timelines+=("$WORK/$n.timeline"); outs+=("$WORK/$n.out"); done
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$(IFS=,; echo "${timelines[*]}")" \
    "$(IFS=,; echo "${outs[*]}")" "$4" "$5" "$6" >>"$RUNS"
}
names() { local i; for ((i = 1; i <= REPEAT; i++)); do printf '%s%d ' "$1" "$i"; done; }
slot_field() {  # slot_field FIELD: the first slot's FIELD in thawctl --json slots ("none": no slot)
  "${THAWCTL[@]}" --json slots | /usr/bin/python3 -c \
    'import json,sys; s=json.load(sys.stdin); print(s[0][sys.argv[1]] if s else "none")' "$1"
}
wait_slot_prewarmed() {
  local state
  for _ in $(seq 600); do
    state=$(slot_field state)
    [[ $state == prewarmed ]] && return
    sleep 0.1
  done
  die "the slot is $state, not prewarmed, after 60 s"
}
settle_slot() {  # until the first slot is prewarmed, empty, failed or gone (at most 20 s)
  local state
  for _ in $(seq 100); do
    state=$(slot_field state)
    [[ $state == @(prewarmed|empty|failed|none) ]] && return
    sleep 0.2
  done
}
prewarm_packed() {  # sets PREWARM_C (seconds) of the last one
  local p0 p1 tries=0
  p0=$(now)
  for ((;;)); do
    "${THAWCTL[@]}" prewarm "$MODEL_NAME" >/dev/null 2>"$WORK/prewarm-c.log" && break
    # See prewarm_d: pages an engine had are back in the pool some time after it exits.
    if grep -q 'page pool: .* 0 free' "$WORK/prewarm-c.log" && ((++tries < 100)); then
      "${THAWCTL[@]}" evict "$(slot_field id)" >/dev/null 2>&1 || true
      sleep 0.1
      continue
    fi
    die "thawctl prewarm failed: $(tail -3 "$WORK/prewarm-c.log")"
  done
  p1=$(now)
  PREWARM_C=$(elapsed "$p0" "$p1")
  [[ $(slot_field layout) == packed ]] || die "expected a packed slot, got: $(slot_field layout)"
}
shim_summary() { grep -o 'slot g0s[0-9]*: .*' "$WORK/$1.shim.log" | tail -1 || echo "(no slot line in the shim log)"; }

# (a) cold: fetch completely, then start the engine (no shim, no slot).
log "(a) cold: thawctl fetch $MODEL_NAME, then the engine"
t0=$(now)
"${THAWCTL[@]}" fetch "$MODEL_NAME" 2>"$WORK/fetch-a.log" >/dev/null ||
  die "thawctl fetch $MODEL_NAME failed: $(tail -3 "$WORK/fetch-a.log")"
t1=$(now)
for ((i = 1; i <= REPEAT; i++)); do engine "cold$i" "$CACHE/$MODEL_NAME"; done
record a "cold: fetch, then start" "$(names cold)" "$t0" "$t1" "$t1"

# (b) streamed: thawd fetches a fresh copy; the engine starts under the shim as soon as the
# model's files exist in the cache and reads their bytes as they arrive.
log "(b) streamed: thawctl fetch $STREAM_NAME --no-wait, the engine under the shim at once"
t0=$(now)
"${THAWCTL[@]}" fetch "$STREAM_NAME" --no-wait >/dev/null
("${THAWCTL[@]}" wait "$STREAM_NAME" >/dev/null 2>"$WORK/wait-b.log" && now >"$WORK/fetch-b.end") &
WAIT_PID=$!
defer "kill $WAIT_PID"
for _ in $(seq 2000); do
  all=1
  for f in "${MODEL_FILES[@]}"; do [[ -e $CACHE/$STREAM_NAME/$f ]] || { all=0; break; }; done
  ((all)) && break
  sleep 0.005
done
((all)) || die "thawd did not create the files of $STREAM_NAME in 10 s"
t1=$(now)
shimmed streamed "$CACHE/$STREAM_NAME" 0
wait "$WAIT_PID" || die "thawd's fetch of $STREAM_NAME failed: $(cat "$WORK/wait-b.log")"
record b "streamed: start while thawd fetches" streamed "$t0" "$(cat "$WORK/fetch-b.end")" "$t1"
STREAMED_MAPS=$(grep -c 'served by userfaultfd' "$WORK/streamed.shim.log" || true)

# (c) copy mode: a slot prewarmed in the packed layout (no engine has recorded one yet; with
# --repeat, the record the previous copy-mode run left is deleted first — the demo owns
# thawd's state directory).
log "(c) copy mode: thawctl prewarm $MODEL_NAME (packed), the engine attached"
for ((i = 1; i <= REPEAT; i++)); do
  if ((i > 1)); then
    settle_slot
    slot=$(slot_field id)
    [[ $slot == none ]] || "${THAWCTL[@]}" evict "$slot" >/dev/null 2>&1 || true
    rm -f "$STATE"/artifacts/layout-*
  fi
  prewarm_packed
  t1=$(now)
  shimmed "copy$i" "$CACHE/$MODEL_NAME" 1
done
record c "prewarmed, copy mode" "$(names copy)" "$t1" - "$t1"
COPY_SLOT=$(shim_summary copy1)
log "(c) shim: $COPY_SLOT"

# (d) zero-copy: thawd prewarms in the engine layout recorded by an earlier run of this engine
# on this model; the engine's weight allocations are the slot's pages. A copy-mode engine
# frees the slot's pages as it copies them out, so (c)'s slot is not handed back: evict what
# is left of it and prewarm again.
prewarm_d() {
  local slot tries=0
  p0=$(now)
  for ((;;)); do
    slot=$(slot_field id)
    # (the slot may be gone already: its engine's exit evicted it)
    [[ $slot == none ]] || "${THAWCTL[@]}" evict "$slot" >/dev/null 2>&1 || true
    "${THAWCTL[@]}" prewarm "$MODEL_NAME" >/dev/null 2>"$WORK/prewarm-d.log" && break
    # The pool gets the pages it lent an engine back some time after the engine exits; until
    # then a prewarm finds no free page (though D-Bus says they are free).
    if grep -q 'page pool: .* 0 free' "$WORK/prewarm-d.log" && ((++tries < 100)); then
      sleep 0.1
      continue
    fi
    die "thawctl prewarm failed: $(tail -3 "$WORK/prewarm-d.log")
$("${THAWCTL[@]}" gpus)
$("${THAWCTL[@]}" slots)
thawd's log: $(tail -15 "$WORK/thawd.log")"
  done
  p1=$(now)
  PREWARM_D=$(elapsed "$p0" "$p1")
  ((tries == 0)) || log "warning: thawd's pool had no free page for $tries prewarm tries" \
    "($(printf '%.1f' "$PREWARM_D") s) after the copy-mode engine exited, although D-Bus showed them free"
}
settle_slot
if [[ $(slot_field state) == prewarmed && $(slot_field layout) == engine ]]; then
  PREWARM_D="0 (the slot run (c) handed back)"
else
  prewarm_d
fi
if [[ $(slot_field layout) != engine ]]; then
  # No record from the copy-mode run: one unattached run under the shim records the layout.
  log "(d) recording the engine layout: one run under the shim, not attached"
  shimmed recording "$CACHE/$MODEL_NAME" 0
  prewarm_d
fi
[[ $(slot_field layout) == engine ]] || die "expected an engine-layout slot, got: $(slot_field layout)"
wait_slot_prewarmed
log "(d) zero-copy: slot $(slot_field id) in the engine layout, the engine attached"
for ((i = 1; i <= REPEAT; i++)); do
  # A handed-back slot is offered again once thawd has checked its bytes against the model.
  ((i == 1)) || wait_slot_prewarmed
  t1=$(now)
  shimmed "zero$i" "$CACHE/$MODEL_NAME" 1
  grep -q 'zero-copy on' "$WORK/zero$i.shim.log" ||
    log "warning: (d) run $i did not run zero-copy: $(shim_summary "zero$i")"
done
record d "prewarmed, zero-copy" "$(names zero)" "$t1" - "$t1"
ZERO_SLOT=$(shim_summary zero1)

# ------------------------------------------------------------------------------ report
SVG_OUT=${SVG_OUT:-$OUT_DIR/thaw-demo-timeline.svg}
JSON_OUT=${JSON_OUT:-$OUT_DIR/thaw-demo.json}
echo
echo "thaw demo: $MODEL_NAME ($((MODEL_BYTES / 1000000)) MB, ${MODEL_SHAPE[*]}) on an emulated $EMU_MEMORY GPU," \
  "thawd at the shipped defaults (pool_share 0.9); seconds, each run to its first token$( ((REPEAT > 1)) && echo "; engine phases: median of $REPEAT runs")"
META=$(/usr/bin/python3 -c 'import json,sys; print(json.dumps({"model_bytes": int(sys.argv[1]),
  "model_shape": sys.argv[2], "emu_memory": sys.argv[3], "kv_blocks": sys.argv[4],
  "prewarm_c_s": sys.argv[5], "prewarm_d_s": sys.argv[6], "streamed_mappings": int(sys.argv[7] or 0),
  "copy_slot": sys.argv[8], "zero_slot": sys.argv[9], "repeat": int(sys.argv[10])}))' "$MODEL_BYTES" "${MODEL_SHAPE[*]}" \
  "$EMU_MEMORY" "$KV" "$PREWARM_C" "$PREWARM_D" "$STREAMED_MAPS" "$COPY_SLOT" "$ZERO_SLOT" "$REPEAT")
/usr/bin/python3 "$REPO_ROOT/tools/demo/report.py" "$RUNS" --json "$JSON_OUT" --svg "$SVG_OUT" \
  --meta "$META" \
  --title "thaw demo: $((MODEL_BYTES / 1000000)) MB GPT-2 on the emulator, each run to its first token" \
  --note "(a) thawctl fetch, then the engine; (b) the engine under the shim while thawd fetches" \
  --note "(c), (d): slot prewarmed before the run (thawctl prewarm: $(printf '%.2f' "$PREWARM_C") s packed; (d) ${PREWARM_D%% *} s)"
echo
echo "fetch: thawd over HTTP from nginx, chunks verified; (b) streamed $STREAMED_MAPS tensor mappings by userfaultfd"
echo "prewarm before (c): $(printf '%.2f' "$PREWARM_C") s (packed layout); before (d): $(printf '%.2f' "$PREWARM_D") s (engine layout)"
echo "shim (c): $COPY_SLOT"
echo "shim (d): $ZERO_SLOT"
# Show the slot as the next engine finds it: handed back by (d)'s last engine and checked.
for _ in $(seq 100); do
  [[ $(slot_field state) == prewarmed && $(slot_field owner) == "" ]] && break
  sleep 0.1
done
echo
echo "\$ thawctl slots"
"${THAWCTL[@]}" slots
SLOT_PATH=$("${THAWCTL[@]}" --json slots | /usr/bin/python3 -c 'import json,sys; s=json.load(sys.stdin); print(s[0]["path"] if s else "")')
if [[ -n $SLOT_PATH ]]; then
  echo
  echo "\$ busctl --address=\$BUS introspect org.thaw.Node1 $SLOT_PATH org.thaw.Node1.Slot"
  busctl --address="$BUS" introspect org.thaw.Node1 "$SLOT_PATH" org.thaw.Node1.Slot
fi
echo
echo "timeline picture: $SVG_OUT"
echo "table as JSON:    $JSON_OUT"
echo "logs:             $LOGS"
log "demo done in $(printf '%.0f' "$(elapsed "$T_DEMO" "$(now)")") s; stopping thawd, dbus-daemon, nginx"
