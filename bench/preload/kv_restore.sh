#!/bin/bash
# Issue 24, part 3: KV-cache init with thaw's restore ABI against the engine's profiling pass,
# in one run, on the CUDA driver emulator.
#
# The node of `make demo` (tools/demo/run-demo.sh --with-node: a private thawd on a private
# dbus-daemon, a loopback registry, the model fetched into thawd's cache, the emulator's timing
# model on) with a gpt2-medium-sized synthetic model (--size medium: 24 layers, n_embd 1024,
# f16, 710 MB). The reference engine runs twice under LD_PRELOAD=libthaw-preload.so with
# --thaw-restore and the same command line:
#
#   profile  the first run finds no record: it runs its profiling pass (one forward pass at
#            --max-num-batched-tokens, then cuMemGetInfo), sizes and allocates the KV cache,
#            and records the result in thawd ("kvcache" artifact)
#   restore  the second run looks the record up and allocates the recorded KV cache, no pass
#
# KV init is each run's own timeline: allocator buffers ready → kv_cache_ready ("kv_init_ms":
# the lookup, the pass or not, sizing, the KV allocations). Printed: both, the profiling pass
# alone (profile_done's "ms"), and profile / restore (the issue's target: >= 20). Both runs must
# produce the same tokens and the same number of KV blocks, or the script fails.
#
# Usage: bench/preload/kv_restore.sh [--size medium|small|large] [--tokens N] [--no-build]
#   --tokens   the engine's --max-num-batched-tokens, the profiling pass's batch (default: the
#              engine's own, --max-model-len = min(n_positions, 1024))
#   --no-build use the build tree as it is (build/default, or $BUILD)
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SIZE=medium
TOKENS=
DO_BUILD=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --size) SIZE=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --no-build) DO_BUILD=0; shift ;;
    *) echo "usage: $0 [--size medium|small|large] [--tokens N] [--no-build]" >&2; exit 2 ;;
  esac
done
# shellcheck source=bench/preload/restore_lib.sh
source "$REPO_ROOT/bench/preload/restore_lib.sh"
restore_bench_prepare kv-restore "$DO_BUILD"

# What runs on the node (run-demo.sh gives it THAW_SOCKET, MODEL_DIR, PRELOAD, NODE_WORK and the
# emulator's environment). The runs' timelines and outputs are kept in $WORK.
cat >"$INNER" <<'EOS'
set -euo pipefail
source "$RESTORE_LIB"
args=(generate --model "$MODEL_DIR" --tokens 1,2,3,4 --max-tokens 2 --ignore-eos --json
      --enforce-eager --thaw-restore)
[[ -n $KV_TOKENS ]] && args+=(--max-num-batched-tokens "$KV_TOKENS")
# field EVENT KEY NAME: KEY of the timeline event EVENT of run NAME ("" when absent).
field() {
  grep "\"event\":\"$1\"" "$NODE_WORK/$3.timeline" | head -1 |
    sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p"
}
restore_run profile
restore_run restore
restore_show_errs profile restore
[[ -n $(field profile_done ms profile) ]] || { echo "the first run did not profile" >&2; exit 1; }
[[ -z $(field profile_done ms restore) ]] || { echo "the second run profiled" >&2; exit 1; }
[[ -n $(field kv_restored ms restore) ]] || { echo "the second run did not restore" >&2; exit 1; }
restore_same_tokens profile restore
cp "$NODE_WORK"/{profile,restore}.{timeline,out,err} "$KV_KEEP/" 2>/dev/null || true
[[ $(field kv_cache_ready num_blocks profile) == $(field kv_cache_ready num_blocks restore) ]] ||
  { echo "the two runs' KV blocks differ" >&2; exit 1; }
p=$(field kv_cache_ready kv_init_ms profile)
r=$(field kv_cache_ready kv_init_ms restore)
pass=$(field profile_done ms profile)
blocks=$(field kv_cache_ready num_blocks restore)
bytes=$(field kv_cache_ready bytes restore)
weights=$(field weights_loaded bytes profile)
awk -v p="$p" -v r="$r" -v pass="$pass" -v blocks="$blocks" -v bytes="$bytes" \
  -v weights="$weights" -v tokens="${KV_TOKENS:-default}" 'BEGIN {
  printf "model weights %.0f MB; KV cache %d blocks, %.2f GiB; profiling batch: %s tokens\n",
    weights / 1e6, blocks, bytes / 2^30, tokens
  printf "KV init, profiling pass (1st run):  %10.2f ms  (of which the pass: %.2f ms)\n", p, pass
  printf "KV init, restored (2nd run):        %10.2f ms\n", r
  printf "ratio profile / restore:            %10.1f x  (target >= 20)\n", p / r
}'
EOS

restore_bench_node KV_TOKENS=$TOKENS KV_KEEP=$WORK
