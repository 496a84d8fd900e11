#!/bin/bash
# Issue 24, part 2: the CUDA-graph phase with thaw's restore ABI against warm-ups + live capture,
# in one run of this script, on the CUDA driver emulator.
#
# The node of `make demo` (tools/demo/run-demo.sh --with-node: a private thawd on a private
# dbus-daemon, a loopback registry, the model fetched into thawd's cache, the emulator's timing
# model on) with a gpt2-medium-sized synthetic model (--size medium: 24 layers, n_embd 1024,
# f16, 710 MB). The reference engine runs twice under LD_PRELOAD=libthaw-preload.so with
# --thaw-restore, --max-num-seqs 32 and --cuda-graph-sizes 1,2,4,8,16,32, the same command line:
#
#   live     the first run finds no graphs record: for each size (largest first) it runs its
#            warm-up forward pass(es) (--num-warmups, default 1), captures the decode forward
#            pass, instantiates it — labelling each capture for thaw; the shim records the graphs
#            and stores them in thawd at exit ("graphs" artifact)
#   restore  the second run asks the ABI for each size and gets an instantiated graph rebuilt
#            from the record: no warm-up, no capture. The shim fetches the record in the
#            background once the run's layout identity is complete, and its worker thread
#            pre-builds graphs (the last captured first) once their allocation index is reached,
#            while the engine builds the ones it asks for first: "pre-built in the background"
#            in restore.shim.log
#
# The graph phase is each run's own timeline: graphs_captured's "ms" (every size, warm-ups,
# captures, instantiation or restores). Printed: both, per size, and live / restore (the
# issue's target: >= 30). Both runs must produce the same tokens, and the second must have
# restored every size, or the script fails.
#
# Usage: bench/preload/graph_restore.sh [--size medium|small|large] [--warmups N] [--no-build]
#   --no-build use the build tree as it is (build/default, or $BUILD)
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SIZE=medium
WARMUPS=1
DO_BUILD=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --size) SIZE=$2; shift 2 ;;
    --warmups) WARMUPS=$2; shift 2 ;;
    --no-build) DO_BUILD=0; shift ;;
    *) echo "usage: $0 [--size medium|small|large] [--warmups N] [--no-build]" >&2; exit 2 ;;
  esac
done
# shellcheck source=bench/preload/restore_lib.sh
source "$REPO_ROOT/bench/preload/restore_lib.sh"
restore_bench_prepare graph-restore "$DO_BUILD"

# What runs on the node (run-demo.sh gives it THAW_SOCKET, MODEL_DIR, PRELOAD, NODE_WORK and the
# emulator's environment). The runs' timelines and outputs are kept in $WORK.
cat >"$INNER" <<'EOS'
set -euo pipefail
source "$RESTORE_LIB"
args=(generate --model "$MODEL_DIR" --tokens 1,2,3,4 --tokens 5,6,7 --max-tokens 3 --ignore-eos
      --json --max-model-len 256 --max-num-seqs 32 --cuda-graph-sizes 1,2,4,8,16,32
      --num-warmups "$GR_WARMUPS" --thaw-restore)
graphs() { grep '"event":"graphs_captured"' "$NODE_WORK/$1.timeline" | head -1; }
restore_run live
restore_run restore
restore_show_errs live restore
cp "$NODE_WORK"/{live,restore}.{timeline,out,err,shim.log} "$GR_KEEP/" 2>/dev/null || true
restore_same_tokens live restore
python3 - "$(graphs live)" "$(graphs restore)" <<'EOP'
import json, sys
live, restore = json.loads(sys.argv[1]), json.loads(sys.argv[2])
if live["captured"] != 6 or restore["restored"] != 6:
    sys.exit(f"expected 6 live captures then 6 restores, got {live['captured']} / {restore['restored']}")
l = {s["size"]: s["ms"] for s in live["per_size"]}
r = {s["size"]: s["ms"] for s in restore["per_size"]}
print("size   live (warm-up + capture)   restored")
for size in sorted(l, reverse=True):
    print(f"{size:>4} {l[size]:>16.2f} ms {r[size]:>14.2f} ms")
print(f"graph phase, live (1st run):      {live['ms']:10.2f} ms")
print(f"graph phase, restored (2nd run):  {restore['ms']:10.2f} ms")
print(f"ratio live / restore:             {live['ms'] / restore['ms']:10.1f} x  (target >= 30)")
EOP
EOS

restore_bench_node GR_WARMUPS=$WARMUPS GR_KEEP=$WORK
