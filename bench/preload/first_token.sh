#!/bin/bash
# Issue 24: start -> first token of a thaw-assisted start (weights zero-copy from a prewarmed
# slot, KV-cache size and CUDA graphs restored through the restore ABI) against a cold start
# from thawd's local cache, in one run of this script, on the CUDA driver emulator.
#
# The node of `make demo` (tools/demo/run-demo.sh --with-node: a private thawd on a private
# dbus-daemon, the model fetched into thawd's cache, the emulator's timing model on) with a
# gpt2-medium-sized synthetic model (--size medium: 24 layers, n_embd 1024, f16, 710 MB). The
# reference engine runs twice under LD_PRELOAD=libthaw-preload.so with one command line
# (--thaw-restore, --max-num-seqs 32, --cuda-graph-sizes 1,2,4,8,16,32, its default KV sizing by
# a profiling pass):
#
#   cold    not attached to a slot, no records in thawd yet: the model's files from thawd's
#           cache (tmpfs) copied to the GPU, the profiling pass sizes the KV cache, six graphs
#           warmed up and captured live; the shim records the layout, the KV size and the graphs
#           in thawd as it goes (and stores them at exit, after the first token)
#   warm    `thawctl prewarm` (before the engine starts, not timed: thawd does it ahead of
#           demand) puts the weights in a slot in the engine layout the cold run recorded; the
#           engine runs attached (THAW_PRELOAD_ATTACH=1): weights zero-copy, KV size and graphs
#           restored
#
# Why cold runs under the shim: on the demo's node thawd's pool holds 90 % of the (emulated,
# 4 GiB) GPU (the shipped pool_share), and an engine without the shim sees only the other 10 %,
# too little for this model; under the shim, unattached, the engine borrows pool pages.
#
# Start -> first token is measured two ways: the engine's own timeline (first_token's
# since_start_ms; "start" is the process start the kernel recorded, 10 ms resolution) and wall
# time (CLOCK_MONOTONIC from just before the script launches the engine to the first_token
# event's t_ns). Printed: both for each run, and cold / warm. The script fails unless the two
# runs generated the same tokens, the warm run ran zero-copy, restored the KV size and all six
# graphs, and the cold run profiled and captured live.
#
# Usage: bench/preload/first_token.sh [--size medium|small|large] [--no-build]
#   --no-build use the build tree as it is (build/default, or $BUILD)
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SIZE=medium
DO_BUILD=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --size) SIZE=$2; shift 2 ;;
    --no-build) DO_BUILD=0; shift ;;
    *) echo "usage: $0 [--size medium|small|large] [--no-build]" >&2; exit 2 ;;
  esac
done
command -v python3 >/dev/null || { echo "first_token.sh: python3 is needed (the report)" >&2; exit 1; }
# shellcheck source=bench/preload/restore_lib.sh
source "$REPO_ROOT/bench/preload/restore_lib.sh"
restore_bench_prepare first-token "$DO_BUILD"
# thaw-demo-report: run-demo.sh needs it and restore_bench_prepare does not build it.
if ((DO_BUILD)); then
  flock /tmp/thaw-build.lock cmake --build --preset default --target thaw-demo-report >/dev/null
fi

cat >"$INNER" <<'EOS'
set -euo pipefail
source "$RESTORE_LIB"
args=(generate --model "$MODEL_DIR" --tokens 1,2,3,4 --tokens 5,6,7 --max-tokens 3 --ignore-eos
      --json --max-model-len 256 --max-num-seqs 32 --cuda-graph-sizes 1,2,4,8,16,32
      --thaw-restore)
read -r -a THAWCTL_CMD <<<"$THAWCTL"
# CLOCK_REALTIME - CLOCK_MONOTONIC, so that bash's $EPOCHREALTIME (no process to start) can
# stamp a launch on the timeline's clock.
MONO_OFFSET_NS=$(python3 -c 'import time; print(time.time_ns() - time.clock_gettime_ns(time.CLOCK_MONOTONIC))')
# ft_run NAME ENV...: one engine run with ENV (no shim unless ENV sets LD_PRELOAD); the
# launch's monotonic time goes to NAME.launch.
ft_run() {
  local name=$1 launch
  shift
  launch=${EPOCHREALTIME/./}
  echo "$((launch * 1000 - MONO_OFFSET_NS))" >"$NODE_WORK/$name.launch"
  env -u LD_PRELOAD -u THAW_PRELOAD_ATTACH "$@" "$REFENGINE" "${args[@]}" \
    --timeline "$NODE_WORK/$name.timeline" >"$NODE_WORK/$name.out" 2>"$NODE_WORK/$name.err" ||
    { echo "engine run $name failed: $(tail -3 "$NODE_WORK/$name.err")" >&2; exit 1; }
}
slot_field() {  # slot_field FIELD: the model's first slot's FIELD ("none": no slot)
  "${THAWCTL_CMD[@]}" --json slots | python3 -c 'import json, sys
s = [x for x in json.load(sys.stdin) if x.get("model") == sys.argv[1]]
print(s[0].get(sys.argv[2], "none") if s else "none")' "$MODEL_NAME" "$1"
}
shim() { echo LD_PRELOAD="$PRELOAD" THAW_PRELOAD_LOG="$NODE_WORK/$1.shim.log"; }

# shellcheck disable=SC2046  # shim prints NAME=VALUE words without spaces in them
ft_run cold $(shim cold) THAW_PRELOAD_ATTACH=0
"${THAWCTL_CMD[@]}" artifacts >"$NODE_WORK/artifacts.txt"
# The slot: thawd prewarms in the engine layout the cold run left (the pool may still be
# getting the cold run's pages back for a moment).
for try in $(seq 100); do
  "${THAWCTL_CMD[@]}" prewarm "$MODEL_NAME" >/dev/null 2>"$NODE_WORK/prewarm.err" && break
  grep -q 'page pool: .* 0 free' "$NODE_WORK/prewarm.err" && ((try < 100)) ||
    { echo "thawctl prewarm failed: $(tail -2 "$NODE_WORK/prewarm.err")" >&2; exit 1; }
  sleep 0.1
done
for _ in $(seq 600); do [[ $(slot_field state) == prewarmed ]] && break; sleep 0.1; done
[[ $(slot_field state) == prewarmed && $(slot_field layout) == engine ]] ||
  { echo "expected a prewarmed slot in the engine layout: $(slot_field state), $(slot_field layout)" >&2; exit 1; }
# shellcheck disable=SC2046
ft_run warm $(shim warm) THAW_PRELOAD_ATTACH=1
restore_show_errs cold warm
cp "$NODE_WORK"/{cold,warm}.{timeline,out,err,launch,shim.log} \
  "$NODE_WORK/artifacts.txt" "$FT_KEEP/" 2>/dev/null || true
restore_same_tokens cold warm
grep -q 'zero-copy on' "$NODE_WORK/warm.shim.log" ||
  { echo "the warm run did not run zero-copy: $(grep -o 'slot g0s[0-9]*: .*' "$NODE_WORK/warm.shim.log" | tail -1)" >&2; exit 1; }
python3 - "$NODE_WORK" <<'EOP'
import json, sys
work = sys.argv[1]
runs = {}
for name in ("cold", "warm"):
    events = {}
    with open(f"{work}/{name}.timeline") as f:
        for line in f:
            e = json.loads(line)
            events.setdefault(e["event"], e)
    launch = int(open(f"{work}/{name}.launch").read())
    if "first_token" not in events:
        sys.exit(f"run {name}: no first_token event in its timeline")
    runs[name] = {
        "timeline_ms": events["first_token"]["since_start_ms"],
        "wall_ms": (events["first_token"]["t_ns"] - launch) / 1e6,
        "weights_ms": (events["weights_loaded"]["t_ns"] - events["process_start"]["t_ns"]) / 1e6,
        "events": events,
    }
cold, warm = runs["cold"]["events"], runs["warm"]["events"]
problems = []
if "profile_done" not in cold or "kv_restored" in cold:
    problems.append("the cold run did not size its KV cache by profiling")
if "kv_restored" not in warm or "profile_done" in warm:
    problems.append("the warm run did not restore its KV-cache size")
if cold["graphs_captured"].get("captured") != 6:
    problems.append(f"the cold run captured {cold['graphs_captured'].get('captured')} graphs, not 6")
if warm["graphs_captured"].get("restored") != 6:
    problems.append(f"the warm run restored {warm['graphs_captured'].get('restored')} graphs, not 6")
if problems:
    sys.exit("; ".join(problems))


def phases(ev):
    t0 = ev["process_start"]["t_ns"]
    at = lambda k: (ev[k]["t_ns"] - t0) / 1e6 if k in ev else float("nan")
    return (f"weights {at('weights_loaded'):8.1f}  kv {at('kv_cache_ready'):8.1f}  "
            f"graphs {at('graphs_captured'):8.1f}  ready {at('ready'):8.1f}")


print("run      start->first token: timeline     wall    (ms since process start: phases' ends)")
for name in ("cold", "warm"):
    r = runs[name]
    print(f"{name:<8} {r['timeline_ms']:27.1f} {r['wall_ms']:8.1f}    {phases(r['events'])}")
print(f"cold / warm, timeline: {runs['cold']['timeline_ms'] / runs['warm']['timeline_ms']:6.2f} x")
print(f"cold / warm, wall:     {runs['cold']['wall_ms'] / runs['warm']['wall_ms']:6.2f} x")
EOP
EOS

restore_bench_node FT_KEEP="$WORK"
