#!/bin/bash
# thaw's main job on one node, on the CUDA driver emulator (`make demo`; issue 20) or on a real
# GPU (the real-GPU kit, issue 21).
#
# A private thawd (its own state, cache and socket under a temporary directory, a private
# dbus-daemon, the shipped packaging/thawd.toml with only its paths changed), a synthetic
# GPT-2 model published with `thaw-fetch publish` into a registry (a loopback nginx, or a local
# directory where there is no nginx), and the same unmodified reference engine started four
# ways, each to its first token:
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
# busctl read of a slot's properties (where busctl is installed), and writes a timeline
# picture (SVG) whose path it prints. Nothing needs root, nor python3, curl or busctl.
# Everything it starts is stopped on exit, error or Ctrl-C.
#
# usage: run-demo.sh [--quick] [--repeat N] [--json FILE] [--svg FILE] [--kv auto|N]
#                    [--build DIR | --kit DIR] [--work DIR] [--driver emulator|real]
#                    [--registry auto|http|dir] [--size NAME | --model-shape "FLAGS"]
#                    [--emu-memory SIZE]
#   --quick        a small model (the ctest demo.quick); the default is a gpt2-small-sized model
#   --repeat       run the engine of (a), (c) and (d) N times (default 3; each (c) from a fresh
#                  packed slot) and report each phase's median: the emulator's copies are CPU
#                  copies, noisy on a busy machine ((a)'s fetch and (b) run once)
#   --json, --svg  where to write the table as JSON and the picture (default: in the work dir)
#   --kv           KV cache blocks of every engine run (default 64); "auto": the engine sizes it
#                  from cuMemGetInfo (--gpu-memory-utilization 0.9), see "KV cache" below
#   --build        the build tree (default build/default; `make demo` builds it)
#   --kit          a real-GPU kit (make gpu-kit): KIT/bin, KIT/lib, KIT/emu, KIT/share; the
#                  default when this script is KIT/share/run-demo.sh
#   --work         where the generated model, the registry, the logs and the outputs go
#                  (default BUILD/demo, or /var/tmp/thaw-demo-$UID with --kit: a kit may be
#                  read-only); the model is generated once per shape and reused
#   --driver       emulator (default): thaw's CUDA driver emulator, the kernels' CPU twins, the
#                  emulated links scaled to 1/100 of an H100's; real: the system's libcuda.so.1
#                  and the engine's own cubins (no emulator variable is set)
#   --registry     http: a loopback nginx (fails if nginx is missing); dir: thawd reads the
#                  published model from a local directory (file://); auto (default): http
#                  where nginx is installed, else dir
#   --size         a genmodel preset in f16: small (250 MB), medium (710 MB), large (1.6 GB),
#                  xl (3.1 GB) — for a real GPU
#   --model-shape  thaw-genmodel flags, e.g. "--layers 24 --embd 2048 --heads 16 --dtype f16"
#                  (--size custom is added when they name no --size)
#   --emu-memory   the emulated GPU's memory (default 2G with --quick, 4G, or 3x a larger
#                  model); ignored with --driver real
#   --with-node S  bring the node up as for the demo (registry, private bus, thawd, the model
#                  fetched into thawd's cache), then run bash script S instead of the four runs
#                  and exit with its status (the real-GPU kit's PyTorch step). S gets THAW_SOCKET,
#                  THAWCTL ("thawctl --bus=..."), MODEL_NAME, MODEL_DIR (in the cache), PRELOAD,
#                  NODE_WORK, and on the emulator THAW_LIBCUDA and the emulator's variables
#
# Environment: DBUS_DAEMON (the dbus-daemon to run; default: the kit's bin/dbus-daemon, else
# the system's), NGINX (default: nginx on PATH, else /usr/sbin/nginx), THAW_DEMO_LD_PRELOAD
# (the engines' LD_PRELOAD; an ASan build puts the sanitizer runtime first),
# THAW_DEMO_PCIE_GBPS and THAW_DEMO_D2D_GBPS (the emulated links).
#
# KV cache: every run uses one fixed number of KV blocks (as bench/preload does), so the four
# runs do the same work after their weights and allocate the same sequence (a layout record
# compares allocations one by one). With thawd's default pool_share 0.9 an engine that is not
# attached to a slot, (a) and (b), is told by the driver that only the other 10 % of the GPU is
# free, which at --gpu-memory-utilization 0.9 leaves it no KV budget at all; `--kv auto` shows
# what the engines do with their own sizing.
# shellcheck source=tools/demo/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# (A kit must carry tools/demo/lib.sh as share/lib.sh, not bench/store/lib.sh: that one needs python3.)
declare -F http_ok >/dev/null ||
  { echo "$(dirname "$0")/lib.sh is not tools/demo/lib.sh: copy that one next to $0" >&2; exit 1; }
trap 'log "error: line $LINENO: \"$BASH_COMMAND\" exited $?"' ERR
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

QUICK=0
JSON_OUT=
SVG_OUT=
BUILD=
KIT=
OUT_DIR=
DRIVER=emulator
REGISTRY_KIND=auto
SIZE=
SHAPE_FLAGS=
EMU_MEMORY=
WITH_NODE=
KV=64
REPEAT=3
usage() {
  die "usage: $0 [--quick] [--repeat N] [--json FILE] [--svg FILE] [--kv auto|N]" \
    "[--build DIR | --kit DIR] [--work DIR] [--driver emulator|real] [--registry auto|http|dir]" \
    "[--size NAME | --model-shape \"FLAGS\"] [--emu-memory SIZE] (--help says more)"
}
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) QUICK=1; shift ;;
    --json) [[ $# -ge 2 ]] || usage; JSON_OUT=$2; shift 2 ;;
    --svg) [[ $# -ge 2 ]] || usage; SVG_OUT=$2; shift 2 ;;
    --build) [[ $# -ge 2 ]] || usage; BUILD=$2; shift 2 ;;
    --kit) [[ $# -ge 2 ]] || usage; KIT=$2; shift 2 ;;
    --work) [[ $# -ge 2 ]] || usage; OUT_DIR=$2; shift 2 ;;
    --driver) [[ $# -ge 2 ]] || usage; DRIVER=$2; shift 2 ;;
    --registry) [[ $# -ge 2 ]] || usage; REGISTRY_KIND=$2; shift 2 ;;
    --size) [[ $# -ge 2 ]] || usage; SIZE=$2; shift 2 ;;
    --model-shape) [[ $# -ge 2 ]] || usage; SHAPE_FLAGS=$2; shift 2 ;;
    --emu-memory) [[ $# -ge 2 ]] || usage; EMU_MEMORY=$2; shift 2 ;;
    --with-node) [[ $# -ge 2 ]] || usage; WITH_NODE=$2; shift 2 ;;
    --kv) [[ $# -ge 2 ]] || usage; KV=$2; shift 2 ;;
    --repeat) [[ $# -ge 2 ]] || usage; REPEAT=$2; shift 2 ;;
    -h | --help) sed -n '2,/^# shellcheck/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) usage ;;
  esac
done
[[ $KV == auto || $KV =~ ^[1-9][0-9]*$ ]] || die "--kv must be auto or a number of blocks"
[[ $REPEAT =~ ^[1-9]$ ]] || die "--repeat must be 1 to 9"
[[ $DRIVER == @(emulator|real) ]] || die "--driver must be emulator or real"
[[ $REGISTRY_KIND == @(auto|http|dir) ]] || die "--registry must be auto, http or dir"
[[ -z $SIZE || -z $SHAPE_FLAGS ]] || die "--size and --model-shape exclude each other"
[[ -z $SIZE || $SIZE == @(small|medium|large|xl) ]] ||
  die "--size must be small, medium, large or xl (or give --model-shape)"
[[ -z $EMU_MEMORY || $EMU_MEMORY =~ ^[1-9][0-9]*[MG]$ ]] || die "--emu-memory must look like 4G or 512M"
[[ -z $BUILD || -z $KIT ]] || die "--build and --kit exclude each other"
[[ -z $WITH_NODE || -f $WITH_NODE ]] || die "--with-node: no script at $WITH_NODE"
[[ -z $WITH_NODE ]] || WITH_NODE=$(cd "$(dirname "$WITH_NODE")" && pwd)/$(basename "$WITH_NODE")
T_DEMO=$(now)
EMU=0
[[ $DRIVER == emulator ]] && EMU=1

# ------------------------------------------------------------------------ prerequisites
# Where the binaries are: a build tree, or a kit (KIT/bin, KIT/lib, KIT/emu, KIT/share). Run as
# KIT/share/run-demo.sh, the kit around it is the default.
if [[ -z $BUILD && -z $KIT && -x $SCRIPT_DIR/../bin/thawd ]]; then KIT=$SCRIPT_DIR/..; fi
if [[ -n $KIT ]]; then
  [[ -d $KIT/bin ]] || die "no kit at $KIT: want KIT/bin, KIT/lib, KIT/emu, KIT/share (make gpu-kit)"
  KIT=$(cd "$KIT" && pwd)
  THAWD_BIN=$KIT/bin/thawd
  THAWCTL_BIN=$KIT/bin/thawctl
  THAW_FETCH_BIN=$KIT/bin/thaw-fetch
  GENMODEL=$KIT/bin/thaw-genmodel
  REFENGINE=$KIT/bin/refengine
  REPORT=$KIT/bin/thaw-demo-report
  PRELOAD=$KIT/lib/libthaw-preload.so
  LIBCUDA=$KIT/emu/libcuda.so.1
  TWINS=$KIT/emu/librefengine_kernels_twins.so
  [[ -x $KIT/bin/dbus-daemon ]] && DBUS_DAEMON=${DBUS_DAEMON:-$KIT/bin/dbus-daemon}
  OUT_DIR=${OUT_DIR:-/var/tmp/thaw-demo-$(id -u)}
  NOT_BUILT="is missing from the kit $KIT: rebuild it (make gpu-kit)"
else
  BUILD=${BUILD:-$SCRIPT_DIR/../../build/default}
  [[ -d $BUILD ]] || die "no build tree at $BUILD: run make build"
  BUILD=$(cd "$BUILD" && pwd)
  THAWD_BIN=$BUILD/daemon/cli/thawd
  THAWCTL_BIN=$BUILD/tools/thawctl/thawctl
  THAW_FETCH_BIN=$BUILD/tools/thaw-fetch/thaw-fetch
  GENMODEL=$BUILD/tools/genmodel/thaw-genmodel
  REFENGINE=$BUILD/tools/refengine/refengine
  REPORT=$BUILD/tools/demo-report/thaw-demo-report
  PRELOAD=$BUILD/preload/libthaw-preload.so
  LIBCUDA=$BUILD/emu/libcuda.so.1
  TWINS=$BUILD/tools/refengine/librefengine_kernels_twins.so
  OUT_DIR=${OUT_DIR:-$BUILD/demo}
  NOT_BUILT="is not built: make build (or cmake --build --preset default)"
  CUDA_ROOT=${CUDA_ROOT:-/usr/local/cuda}
  if [[ ! -x $REFENGINE || ! -f $TWINS ]] && [[ ! -x ${THAW_NVCC:-$CUDA_ROOT/bin/nvcc} ]]; then
    die "the reference engine was not built: its kernels need nvcc (${THAW_NVCC:-$CUDA_ROOT/bin/nvcc}," \
      "the CUDA 13 toolkit's compiler; not a Debian package) — install it, then make build"
  fi
fi
# The shipped configuration: next to this script in a kit (KIT/share/thawd.toml), else the
# repository's packaging/thawd.toml.
CONFIG_TEMPLATE=$SCRIPT_DIR/thawd.toml
[[ -f $CONFIG_TEMPLATE ]] || CONFIG_TEMPLATE=$SCRIPT_DIR/../../packaging/thawd.toml
[[ -f $CONFIG_TEMPLATE ]] || die "no thawd.toml next to $0 nor at packaging/thawd.toml"
NEEDED=("$THAWD_BIN" "$THAWCTL_BIN" "$THAW_FETCH_BIN" "$GENMODEL" "$REFENGINE" "$REPORT" "$PRELOAD")
((EMU)) && NEEDED+=("$LIBCUDA" "$TWINS")
for f in "${NEEDED[@]}"; do [[ -e $f ]] || die "$f $NOT_BUILT"; done

missing_pkg() {  # missing_pkg WHAT PACKAGE
  die "$1 is missing: install Debian's $2 (sudo apt-get install $2${BUILD:+, or scripts/install-deps})"
}
DBUS_DAEMON=${DBUS_DAEMON:-$(command -v dbus-daemon || true)}
[[ -n $DBUS_DAEMON && -x $DBUS_DAEMON ]] ||
  missing_pkg "dbus-daemon (thawd's private bus; or set DBUS_DAEMON)" dbus-daemon
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
case $REGISTRY_KIND in
  http) [[ -x $NGINX ]] || missing_pkg "nginx (--registry http; --registry dir needs none)" nginx-light ;;
  auto) if [[ -x $NGINX ]]; then REGISTRY_KIND=http; else REGISTRY_KIND=dir; fi ;;
esac
BUSCTL=$(command -v busctl || true)

# ------------------------------------------------------------------------------ model
# Big enough that weights matter, small enough for the CPU twins of the kernels (on the
# emulator). The model is generated and published once per shape (WORK_DIR/models) and reused.
if [[ -n $SIZE ]]; then
  MODEL_SHAPE=(--size "$SIZE" --dtype f16)
elif [[ -n $SHAPE_FLAGS ]]; then
  read -r -a MODEL_SHAPE <<<"$SHAPE_FLAGS"
elif ((QUICK)); then
  MODEL_SHAPE=(--layers 6 --embd 768 --heads 12 --vocab 16384 --positions 256 --dtype f16)
  EMU_MEMORY=${EMU_MEMORY:-2G}
else
  MODEL_SHAPE=(--layers 12 --embd 768 --heads 12 --vocab 50257 --positions 1024 --dtype f16)
  EMU_MEMORY=${EMU_MEMORY:-4G}
fi
GEN_ARGS=("${MODEL_SHAPE[@]}")
[[ " ${MODEL_SHAPE[*]} " == *" --size "* ]] || GEN_ARGS=(--size custom "${GEN_ARGS[@]}")
"$GENMODEL" "${GEN_ARGS[@]}" --dry-run --json >/dev/null 2>"$WORK/genmodel.log" ||
  die "thaw-genmodel rejects the model shape (${MODEL_SHAPE[*]}): $(tail -3 "$WORK/genmodel.log")"
# The emulated links, scaled to 1/100 of an H100's (PCIe 25 -> 0.25 GB/s, HBM 2000 -> 20
# GB/s; the same 1:80 ratio). At full speed the model would charge a 250 MB upload 10 ms, far
# below what this host's memcpy takes to move it, so every copy would cost host CPU time alone
# and a device-to-device copy (copy mode) would look no cheaper than an upload from the page
# cache (cold). Scaled, the modelled transfer sets the weight phase as on hardware; the
# kernels' CPU twins are slower than an H100 by far more anyway. Ratios transfer, seconds don't.
LINK_PCIE_GBPS=${THAW_DEMO_PCIE_GBPS:-0.25}
LINK_D2D_GBPS=${THAW_DEMO_D2D_GBPS:-20}
SHAPE_TAG=$(printf '%s' "${MODEL_SHAPE[*]}" | tr -d ' -' | tr -c 'a-z0-9\n' '_')
mkdir -p "$OUT_DIR/models" 2>/dev/null || die "cannot create $OUT_DIR/models: give a writable --work DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
REGISTRY_ROOT=$OUT_DIR/models/$SHAPE_TAG
MODEL_NAME=demo-gpt2
STREAM_NAME=demo-gpt2-streamed  # the same files under a second name: (b) fetches it afresh
MODEL_DIR=$REGISTRY_ROOT/$MODEL_NAME
# The run's logs (thawd, engines, shims, timelines) are kept in $OUT_DIR/logs, also on failure.
LOGS=$OUT_DIR/logs
defer "rm -rf '$LOGS'; mkdir -p '$LOGS'; cp '$WORK'/*.log '$WORK'/*.err '$WORK'/*.out '$WORK'/*.timeline '$WORK'/*.toml '$WORK'/*.tsv '$LOGS'/"
if [[ ! -f $MODEL_DIR/thaw-manifest.json || ! -f $REGISTRY_ROOT/$STREAM_NAME/thaw-manifest.json ]]; then
  log "generating a synthetic GPT-2 (${MODEL_SHAPE[*]}) into $REGISTRY_ROOT"
  rm -rf "$REGISTRY_ROOT"
  # Written aside and renamed into place: a concurrent or interrupted run never sees half.
  NEW_ROOT=$(mktemp -d "$REGISTRY_ROOT.new.XXXXXX")
  defer "rm -rf '$NEW_ROOT'"
  "$GENMODEL" "${GEN_ARGS[@]}" --shard-size 200MB --out "$NEW_ROOT/$MODEL_NAME" --quiet >/dev/null
  "$THAW_FETCH_BIN" publish --chunk-size 1MiB --quiet "$NEW_ROOT/$MODEL_NAME"
  cp -al "$NEW_ROOT/$MODEL_NAME" "$NEW_ROOT/$STREAM_NAME"
  chmod 755 "$NEW_ROOT"
  mv -T "$NEW_ROOT" "$REGISTRY_ROOT" 2>/dev/null || true  # a concurrent run may have won
fi
MODEL_FILES=()
while IFS= read -r f; do MODEL_FILES+=("$f"); done < <(cd "$MODEL_DIR" &&
  find . -maxdepth 1 -type f ! -name thaw-manifest.json -printf '%P\n' | LC_ALL=C sort)
MODEL_BYTES=$(cd "$MODEL_DIR" && stat -c %s "${MODEL_FILES[@]}" | awk '{s += $1} END {print s}')
# A model larger than the defaults': an emulated GPU of 3x its size (a slot, an engine's own
# copy in copy mode, KV cache and workspace), at least 4G.
[[ -n $EMU_MEMORY ]] || EMU_MEMORY=$(awk -v b="$MODEL_BYTES" \
  'BEGIN { g = int(3 * b / 2^30) + 1; print (g < 4 ? 4 : g) "G" }')
if ((EMU)); then
  log "model $MODEL_NAME: $((MODEL_BYTES / 1000000)) MB in ${#MODEL_FILES[@]} files; emulated GPU $EMU_MEMORY"
else
  EMU_MEMORY=""  # (the JSON's meta.emu_memory: none)
  log "model $MODEL_NAME: $((MODEL_BYTES / 1000000)) MB in ${#MODEL_FILES[@]} files; the real driver (system libcuda.so.1)"
fi
# The engine's prompt: token ids below the model's vocabulary (the quick model has 16384).
VOCAB=$(awk '{ for (i = 1; i < NF; i++) if ($i == "--vocab") print $(i + 1) }' <<<"${MODEL_SHAPE[*]}")
VOCAB=${VOCAB:-50257}

# ---------------------------------------------------------------------------- registry
if [[ $REGISTRY_KIND == http ]]; then
  export no_proxy=127.0.0.1,localhost NO_PROXY=127.0.0.1,localhost
  start_nginx "$NGINX" "$REGISTRY_ROOT" "/$MODEL_NAME/config.json"
  REGISTRY=http://127.0.0.1:$NGINX_PORT
  log "registry: nginx $NGINX_PID on $REGISTRY (root $REGISTRY_ROOT)"
  FETCH_NOTE="thawd over HTTP from nginx"
else
  # thawd copies the published files itself, checked against the same thaw-manifest.json.
  REGISTRY=file://$REGISTRY_ROOT
  why="--registry dir"
  [[ -x $NGINX ]] || why="no nginx at $NGINX"
  log "registry: a local directory, $REGISTRY ($why); thawd copies and verifies its chunks"
  FETCH_NOTE="thawd from a local directory registry ($why; no HTTP)"
fi

# ------------------------------------------------------------------------ private bus
# A session-style bus of our own: anyone may talk, only org.thaw.Node1 may be owned.
cat >"$WORK/bus.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>custom</type><listen>unix:path=$WORK/bus</listen><auth>EXTERNAL</auth>
<policy context="default"><allow user="*"/><allow own="org.thaw.Node1"/>
<allow send_destination="*"/><allow receive_sender="*"/></policy></busconfig>
CONF
"$DBUS_DAEMON" --nofork --nopidfile --config-file="$WORK/bus.conf" 2>"$WORK/dbus.log" &
DBUS_PID=$!
defer "kill $DBUS_PID; wait $DBUS_PID"
for _ in $(seq 100); do [[ -S $WORK/bus ]] && break; sleep 0.05; done
[[ -S $WORK/bus ]] || die "dbus-daemon ($DBUS_DAEMON) did not start: $(cat "$WORK/dbus.log")"
log "private bus: dbus-daemon $DBUS_PID on $WORK/bus"
BUS="unix:path=$WORK/bus"
THAWCTL=("$THAWCTL_BIN" --bus="$BUS")

# ---------------------------------------------------------------------------- thawd
# The shipped configuration with only its paths changed (and the registry, which it leaves
# empty). Not root: the shim socket's allow_groups must name a group of ours. The cache is on
# tmpfs (/dev/shm) as the configuration advises, where there is one.
SHM=/dev/shm
[[ -d $SHM && -w $SHM ]] || { SHM=${TMPDIR:-/tmp}; log "no writable /dev/shm: thawd's cache goes to $SHM"; }
CACHE=$(mktemp -d "$SHM/thaw-demo-cache.XXXXXX")
defer "rm -rf '$CACHE'"
EMU_ENV=()
if ((EMU)); then
  EMU_STATE=$(mktemp -d "$SHM/thaw-demo-emu.XXXXXX")
  defer "rm -rf '$EMU_STATE'"
  EMU_ENV=(THAW_EMU_DEVICE_MEMORY="$EMU_MEMORY" THAW_EMU_STATE_DIR="$EMU_STATE" THAW_EMU_TIMING=1
    THAW_EMU_PCIE_GBPS="$LINK_PCIE_GBPS" THAW_EMU_D2D_GBPS="$LINK_D2D_GBPS")
  THAWD_ENV=(THAW_LIBCUDA="$LIBCUDA" "${EMU_ENV[@]}")
  # The engine: the emulator, and the kernels' host twins in place of its cubins.
  ENGINE_ENV=(REFENGINE_LIBCUDA="$LIBCUDA" THAW_EMU_KERNELS="$TWINS" "${EMU_ENV[@]}")
else
  THAWD_ENV=()
  ENGINE_ENV=()
fi
STATE=$WORK/state
SOCKET=$WORK/thawd.sock
sed -e "s|^state_dir = .*|state_dir = \"$STATE\"|" \
  -e "s|^cache_dir = .*|cache_dir = \"$CACHE\"|" \
  -e "s|^registry = .*|registry = \"$REGISTRY\"|" \
  -e "s|^socket = .*|socket = \"$SOCKET\"|" \
  -e "s|^bus = .*|bus = \"$BUS\"|" \
  -e "s|^worker_preload = .*|worker_preload = \"$PRELOAD\"|" \
  "$CONFIG_TEMPLATE" >"$WORK/thawd.toml"
if [[ $(id -u) -ne 0 ]]; then
  GROUP=$(id -gn)
  sed -i "s|^allow_groups = .*|allow_groups = [\"thaw\", \"$GROUP\"]|" "$WORK/thawd.toml"
  log "not root: the shim socket also admits group $GROUP (shim.allow_groups); nothing needs root"
fi
log "thawd.toml: the shipped file with these lines changed:"
# (grep -vxF: what diff would mark '>', without needing diffutils)
grep -vxFf "$CONFIG_TEMPLATE" "$WORK/thawd.toml" | sed 's/^/   /' >&2 || true
"$THAWD_BIN" --config "$WORK/thawd.toml" --check-config >/dev/null 2>"$WORK/check.log" ||
  die "thawd rejects the demo's configuration: $(cat "$WORK/check.log")"
env "${THAWD_ENV[@]}" "$THAWD_BIN" --config "$WORK/thawd.toml" 2>"$WORK/thawd.log" &
THAWD_PID=$!
defer "kill -TERM $THAWD_PID; wait $THAWD_PID"
for _ in $(seq 400); do
  [[ -S $SOCKET ]] && "${THAWCTL[@]}" status >/dev/null 2>&1 && break
  kill -0 "$THAWD_PID" 2>/dev/null || die "thawd exited: $(tail -5 "$WORK/thawd.log")"
  sleep 0.05
done
[[ -S $SOCKET ]] || die "thawd did not come up in 20 s: $(tail -5 "$WORK/thawd.log")"
if ((EMU)); then GPU_WHAT="the emulated $EMU_MEMORY"; else GPU_WHAT="the GPU's memory"; fi
GPUS_JSON=$("${THAWCTL[@]}" --json gpus)
if [[ $GPUS_JSON == "[]" ]]; then
  if ((EMU)); then
    die "thawd found no GPU through the emulator $LIBCUDA: $(tail -3 "$WORK/thawd.log")"
  fi
  die "thawd found no GPU through the system's libcuda.so.1 (--driver real): is the NVIDIA" \
    "driver installed and /dev/nvidia0 there? Prewarm slots need one. thawd's log:" \
    "$(tail -3 "$WORK/thawd.log")"
fi
log "thawd $THAWD_PID up: $(paste <("$REPORT" get '*.index' --default '' <<<"$GPUS_JSON") \
  <("$REPORT" get '*.pool_bytes' --default '' <<<"$GPUS_JSON") | awk -v what="$GPU_WHAT" \
  'NF == 2 { printf "%sGPU %d: pool %.0f MiB of %s", (NR > 1 ? "; " : ""), $1, $2 / 2^20, what }')"

# ---------------------------------------------------------------------------- --with-node
if [[ -n $WITH_NODE ]]; then
  log "--with-node: thawctl fetch $MODEL_NAME, then $WITH_NODE"
  "${THAWCTL[@]}" fetch "$MODEL_NAME" 2>"$WORK/fetch-node.log" >/dev/null ||
    die "thawctl fetch $MODEL_NAME failed: $(tail -3 "$WORK/fetch-node.log")"
  node_rc=0
  node_driver=()
  ((EMU)) && node_driver=(THAW_LIBCUDA="$LIBCUDA")
  env THAW_SOCKET="$SOCKET" THAWCTL="${THAWCTL[*]}" MODEL_NAME="$MODEL_NAME" \
    MODEL_DIR="$CACHE/$MODEL_NAME" PRELOAD="$PRELOAD" NODE_WORK="$WORK" \
    "${node_driver[@]}" "${ENGINE_ENV[@]}" bash "$WITH_NODE" || node_rc=$?
  log "--with-node: $WITH_NODE exited $node_rc; stopping the node"
  exit "$node_rc"
fi

# ---------------------------------------------------------------------------- engines
# Small phases after the weights (the CPU runs every kernel): one sequence, a 4-token prompt,
# one CUDA graph (batch 1) with one warm-up, 4 tokens generated.
# shellcheck disable=SC2054  # the commas are the engine's token list
ENGINE_ARGS=(generate --tokens 464,2068,7586,21831 --max-tokens 4 --ignore-eos --json
  --max-num-seqs 1 --max-model-len 64 --max-num-batched-tokens 16 --cuda-graph-sizes 1
  --num-warmups 1)
((VOCAB > 21831)) || ENGINE_ARGS[2]=464,2068,7586,2183
[[ $KV == auto ]] || ENGINE_ARGS+=(--num-gpu-blocks-override "$KV")
RUNS=$WORK/runs.tsv
: >"$RUNS"
engine() {  # engine NAME MODEL_DIR [env...]: one engine run to its exit; NAME.timeline, NAME.out
  local name=$1 dir=$2
  shift 2
  env "${ENGINE_ENV[@]}" "$@" \
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
  "${THAWCTL[@]}" --json slots | "$REPORT" get "0.$1" --default none
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
# The GPU as the engine's driver named it (refengine's timeline, event driver_init).
DEVICE=$("$REPORT" event "$WORK/cold1.timeline" driver_init device)
if ((EMU)); then
  ON="on an emulated $EMU_MEMORY GPU"
  TITLE_ON="on the emulator"
else
  ON="on ${DEVICE:-a GPU} (real driver)"
  TITLE_ON="on ${DEVICE:-a real GPU}"
fi
echo
echo "thaw demo: $MODEL_NAME ($((MODEL_BYTES / 1000000)) MB, ${MODEL_SHAPE[*]}) $ON," \
  "thawd at the shipped defaults (pool_share 0.9); seconds, each run to its first token$( ((REPEAT > 1)) && echo "; engine phases: median of $REPEAT runs")"
"$REPORT" report "$RUNS" --json "$JSON_OUT" --svg "$SVG_OUT" \
  --meta model_bytes:="$MODEL_BYTES" --meta model_shape="${MODEL_SHAPE[*]}" \
  --meta emu_memory="$EMU_MEMORY" --meta kv_blocks="$KV" \
  --meta prewarm_c_s="$PREWARM_C" --meta prewarm_d_s="$PREWARM_D" \
  --meta streamed_mappings:="${STREAMED_MAPS:-0}" --meta copy_slot="$COPY_SLOT" \
  --meta zero_slot="$ZERO_SLOT" --meta repeat:="$REPEAT" --meta driver="$DRIVER" \
  --meta device="$DEVICE" --meta registry="$REGISTRY_KIND" --meta registry_address="$REGISTRY" \
  --title "thaw demo: $((MODEL_BYTES / 1000000)) MB GPT-2 $TITLE_ON, each run to its first token" \
  --note "(a) thawctl fetch, then the engine; (b) the engine under the shim while thawd fetches" \
  --note "(c), (d): slot prewarmed before the run (thawctl prewarm: $(printf '%.2f' "$PREWARM_C") s packed; (d) ${PREWARM_D%% *} s)"
echo
echo "fetch: $FETCH_NOTE, chunks verified; (b) streamed $STREAMED_MAPS tensor mappings by userfaultfd"
echo "prewarm before (c): $(printf '%.2f' "$PREWARM_C") s (packed layout); before (d): $(printf '%.2f' "${PREWARM_D%% *}") s (engine layout)"
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
SLOT_PATH=$(slot_field path)
if [[ $SLOT_PATH == none ]]; then
  :
elif [[ -n $BUSCTL ]]; then
  echo
  echo "\$ busctl --address=\$BUS introspect org.thaw.Node1 $SLOT_PATH org.thaw.Node1.Slot"
  "$BUSCTL" --address="$BUS" introspect org.thaw.Node1 "$SLOT_PATH" org.thaw.Node1.Slot
else
  log "no busctl (Debian's systemd): skipping the D-Bus read of $SLOT_PATH; thawctl slots above" \
    "read the same slot over D-Bus"
fi
echo
echo "timeline picture: $SVG_OUT"
echo "table as JSON:    $JSON_OUT"
echo "logs:             $LOGS"
log "demo done in $(printf '%.0f' "$(elapsed "$T_DEMO" "$(now)")") s; stopping thawd, dbus-daemon$([[ $REGISTRY_KIND == http ]] && echo ", nginx")"
