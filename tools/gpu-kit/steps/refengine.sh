#!/bin/bash
# Step b: the reference engine on this GPU. Two small synthetic GPT-2 models (f16 and f32,
# regenerated here from their seeds) and two prompts; the engine's tokens must equal what the
# same engine generated on thaw's emulator when the kit was built (share/expected-tokens.txt).
# On a real GPU this checks that the kernels' cubins and the emulator's host twins agree, and
# that the engine's driver use works on NVIDIA's driver; its phase timeline is kept.
#
#   steps/refengine.sh STEP_DIR                      (from run)
#   steps/refengine.sh --kit KIT --emulator --record FILE --work DIR   (make-kit.sh)
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tools/gpu-kit/steps/common.sh
source "$HERE/common.sh"
RECORD=
if [[ ${1:-} == --kit ]]; then
  KIT=$2 KIT_DRIVER=emulator QUICK=1
  [[ $3 == --emulator && $4 == --record && $6 == --work ]] || { echo "usage: see the header" >&2; exit 2; }
  RECORD=$5 DIR=$7
  mkdir -p "$DIR"
else
  DIR=$1
fi
WORK=$(kit_scratch refengine)
trap 'rm -rf "$WORK"' EXIT
read -ra EMU <<<"$(kit_emulator_env "$WORK/emu-state")"

# name | genmodel flags | engine flags. The seeds and shapes are part of the recorded answers.
CASES=(
  "f16-graphs|--layers 4 --embd 256 --heads 4 --vocab 4096 --positions 128 --dtype f16 --seed 11|--cuda-graph-sizes 1 2"
  "f32-eager-module|--layers 3 --embd 192 --heads 3 --vocab 3000 --positions 128 --dtype f32 --seed 12|--enforce-eager --module-api module"
)
# shellcheck disable=SC2054  # the commas are the engine's token lists
PROMPTS=(--tokens 464,2068,1586,21 --tokens 40,1101,257,1332,286)
actual=$WORK/tokens.txt
: >"$actual"
failed=()
for c in "${CASES[@]}"; do
  IFS='|' read -r name model_flags engine_flags <<<"$c"
  read -ra mf <<<"$model_flags"
  read -ra ef <<<"$engine_flags"
  "$KIT/bin/thaw-genmodel" --size custom "${mf[@]}" --out "$WORK/$name" --quiet >/dev/null ||
    { failed+=("$name: thaw-genmodel failed"); continue; }
  if ! env "${EMU[@]}" "$KIT/bin/refengine" generate --model "$WORK/$name" "${PROMPTS[@]}" \
    --max-tokens 8 --ignore-eos --json --max-num-seqs 2 --max-model-len 64 \
    --num-gpu-blocks-override 16 "${ef[@]}" --timeline "$DIR/$name.timeline" \
    --logits-out "$DIR/$name.logits.json" \
    >"$DIR/$name.out" 2>"$DIR/$name.err"; then
    failed+=("$name: the engine failed: $(tail -2 "$DIR/$name.err" | tr '\n' ' ')")
    continue
  fi
  # One line per prompt: NAME PROMPT_INDEX TOKENS (from the engine's --json lines).
  sed -n 's/.*"index":\([0-9]*\).*"tokens":\[\([0-9,]*\)\].*/\1 \2/p' "$DIR/$name.out" |
    sort -n | sed "s/^/$name /" >>"$actual"
done

if [[ -n $RECORD ]]; then
  ((${#failed[@]} == 0)) || { printf 'make-kit: %s\n' "${failed[@]}" >&2; exit 1; }
  [[ $(wc -l <"$actual") -eq 4 ]] || { echo "expected 4 answers, got: $(cat "$actual")" >&2; exit 1; }
  cp "$actual" "$RECORD"
  # The logits too: the synthetic models' greedy tokens repeat, so equal tokens alone would miss
  # a small numerical disagreement between the kernels and their twins.
  for c in "${CASES[@]}"; do cp "$DIR/${c%%|*}.logits.json" "$(dirname "$RECORD")/${c%%|*}.logits.json"; done
  exit 0
fi

# max_abs_diff A B: the largest |a - b| over the numbers of two logits files of the same shape
# ("shape" if they do not have the same count of numbers).
max_abs_diff() {
  awk 'FNR == 1 { f++ } { gsub(/[][{}":a-z_]/, " "); gsub(/,/, " ");
         for (i = 1; i <= NF; i++) { if (f == 1) a[n1++] = $i; else b[n2++] = $i } }
       END { if (n1 != n2) { print "shape"; exit }
             m = 0; for (i = 0; i < n1; i++) { d = a[i] - b[i]; if (d < 0) d = -d; if (d > m) m = d }
             printf "%.3g\n", m }' "$1" "$2"
}

cp "$actual" "$DIR/tokens.txt"
# Phases of the f16 run, from its timeline (ms since the process started).
phase() { sed -n "s/.*\"event\":\"$1\".*\"since_start_ms\":\([0-9.]*\).*/\1/p" "$DIR/f16-graphs.timeline" | head -1; }
figures=()
for e in driver_init allocator_ready weights_loaded kv_cache_ready graphs_captured first_token; do
  v=$(phase "$e")
  [[ -n $v ]] && figures+=("figure.f16_${e}_ms=$v")
done
logits=()
for c in "${CASES[@]}"; do
  name=${c%%|*}
  [[ -f $DIR/$name.logits.json ]] || continue
  if cmp -s "$KIT/share/$name.logits.json" "$DIR/$name.logits.json"; then
    figures+=("figure.${name}_logits=bit-identical to the emulator's")
  else
    d=$(max_abs_diff "$KIT/share/$name.logits.json" "$DIR/$name.logits.json")
    figures+=("figure.${name}_logits_max_abs_diff=$d")
    logits+=("$name logits differ by up to $d")
  fi
done
if ((${#failed[@]})); then
  kit_result "$DIR" failed "${failed[*]}" "${figures[@]}"
elif ! diff -u "$KIT/share/expected-tokens.txt" "$actual" >"$DIR/tokens.diff"; then
  kit_result "$DIR" failed "tokens differ from the emulator's (see b/tokens.diff): the emulator's twins or the kernels are wrong" "${figures[@]}"
elif ((${#logits[@]})); then
  kit_result "$DIR" passed "4 of 4 answers equal the emulator's, but not bit for bit: ${logits[*]} (the twins are meant to round as the kernels do)" "${figures[@]}"
else
  kit_result "$DIR" passed "4 of 4 answers (2 models x 2 prompts, 8 tokens) equal the emulator's on $KIT_DRIVER, logits bit-identical" "${figures[@]}"
fi
