#!/usr/bin/env bash
# The emulator's compute, before and after the blocked host twins (issue 20, part 3).
#
#  1. thaw-twins-bench: one forward pass's matrix products and attention at gpt2-large's shapes
#     and a 4-token batch, the kernel-mirroring twins against the blocked ones in one process
#     (see bench/refengine/twins_bench.cpp).
#  2. The engine end to end: `refengine generate` on a gpt2-large-sized synthetic model (36
#     layers, n_embd 1280, f16, 1.55 GB: bench/preload/streaming_cold_start.sh's model and
#     engine arguments: one 4-token profile batch, eager) on the emulator with its timing model,
#     once with the reference twin library (librefengine_kernels_twins_reference.so: the
#     products block by block and attention thread by thread, as before) and twice with the
#     shipped one, alternating, --rounds times. Reported per run from the engine's timeline:
#     weights (allocator_ready → weights_loaded), the profile batch (weights_loaded →
#     profile_done), time to ready and to the first token. Every run's logits (all positions)
#     must be the same bits: before = after, and after = after (run to run).
#
#   bench/refengine/twins_speedup.sh [--rounds 3] [--no-build]
#
# BUILD (default build/default) is the build directory; --no-build uses what it holds.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$REPO_ROOT/build/default}
ROUNDS=3
DO_BUILD=1
while (($#)); do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --no-build) DO_BUILD=0; shift ;;
    *) echo "usage: $0 [--rounds N] [--no-build]" >&2; exit 2 ;;
  esac
done

if ((DO_BUILD)); then
  cmake --build "$BUILD" --target thaw-twins-bench thaw-genmodel refengine thaw_emu \
    refengine_kernels_twins refengine_kernels_twins_reference >/dev/null
fi
TWINS_NEW=$BUILD/tools/refengine/librefengine_kernels_twins.so
TWINS_REF=$BUILD/tools/refengine/librefengine_kernels_twins_reference.so
for f in "$BUILD/bench/refengine/thaw-twins-bench" "$BUILD/tools/refengine/refengine" "$TWINS_NEW" \
  "$TWINS_REF" "$BUILD/emu/libcuda.so.1"; do
  [[ -e $f ]] || { echo "missing $f: build it (or drop --no-build)" >&2; exit 1; }
done

echo "== twin micro-benchmark (one thread) =="
"$BUILD/bench/refengine/thaw-twins-bench"

MODEL=$BUILD/bench-models/gpt2-large-syn-f16
if [[ ! -f $MODEL/config.json ]]; then
  echo "generating the gpt2-large-sized model into $MODEL" >&2
  "$BUILD/tools/genmodel/thaw-genmodel" --size custom --layers 36 --embd 1280 --heads 20 \
    --dtype f16 --shard-size 500MB --out "$MODEL" --force --quiet >/dev/null
fi
cat "$MODEL"/*.safetensors >/dev/null  # page-cached: the weight phase is not what is measured

WORK=$(mktemp -d /dev/shm/thaw-twins-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

engine() {  # engine NAME TWINS: one run; its timeline and logits under $WORK/NAME.*
  local name=$1 twins=$2
  mkdir -p "$WORK/$name.emu"
  env LD_LIBRARY_PATH="$BUILD/emu" THAW_EMU_KERNELS="$twins" THAW_EMU_DEVICE_MEMORY=8G \
    THAW_EMU_STATE_DIR="$WORK/$name.emu" THAW_EMU_TIMING=1 \
    "$BUILD/tools/refengine/refengine" generate --model "$MODEL" --tokens 1,2,3,4 --max-tokens 2 \
    --ignore-eos --json --max-num-seqs 1 --max-model-len 32 --max-num-batched-tokens 4 \
    --enforce-eager --all-positions --logits-out "$WORK/$name.logits" \
    --timeline "$WORK/$name.timeline" >"$WORK/$name.out" 2>"$WORK/$name.err" ||
    { echo "engine run $name failed: $(tail -5 "$WORK/$name.err")" >&2; exit 1; }
  rm -rf "$WORK/$name.emu"
}

echo
echo "== refengine generate, gpt2-large-sized f16, 4-token profile batch, eager, timing model on =="
for ((r = 1; r <= ROUNDS; r++)); do
  engine "before$r" "$TWINS_REF"
  engine "after$r" "$TWINS_NEW"
  engine "again$r" "$TWINS_NEW"
done

/usr/bin/python3 - "$WORK" "$ROUNDS" <<'EOF'
import hashlib, json, os, statistics, sys

work, rounds = sys.argv[1], int(sys.argv[2])

def phases(name):
    ev = {}
    for line in open(os.path.join(work, name + ".timeline")):
        e = json.loads(line)
        ev.setdefault(e["event"], e["since_start_ms"] / 1000)
    return {"weights": ev["weights_loaded"] - ev["allocator_ready"],
            "profile batch": ev["profile_done"] - ev["weights_loaded"],
            "to ready": ev["ready"], "to first token": ev["first_token"]}

def digest(name):
    with open(os.path.join(work, name + ".logits"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]

runs = {kind: [phases(f"{kind}{r}") for r in range(1, rounds + 1)] for kind in ("before", "after", "again")}
print(f"{'seconds (median of %d)' % rounds:<24} {'before':>9} {'after':>9} {'speed-up':>9}")
for key in runs["before"][0]:
    b = statistics.median(p[key] for p in runs["before"])
    a = statistics.median(p[key] for p in runs["after"] + runs["again"])
    print(f"{key:<24} {b:9.3f} {a:9.3f} {b / a:8.1f}x")
for kind in ("before", "after", "again"):
    print(f"{kind:<6} per round, profile batch s: " +
          " ".join(f"{p['profile batch']:.3f}" for p in runs[kind]))
digests = {f"{k}{r}": digest(f"{k}{r}") for k in runs for r in range(1, rounds + 1)}
same = len(set(digests.values())) == 1
print(f"logits of all {len(digests)} runs (every position, sha256 of the file): "
      + ("the same bits, " + next(iter(digests.values())) if same else "DIFFERENT " + str(digests)))
sys.exit(0 if same else 1)
EOF
