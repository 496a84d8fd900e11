#!/bin/bash
# Step d: thaw's main job — make demo's four runs (cold, streamed, prewarmed copy mode,
# prewarmed zero-copy) with the kit's own thawd, private dbus-daemon and a local-directory
# registry. On a real GPU with a model of a few GB (gpt2-xl's shape in f16, 3.1 GB; --quick:
# gpt2-medium's, 0.7 GB), on the emulator with the demo's models. Passes when the demo ran,
# all four runs generated the same tokens, (d) ran zero-copy, and the weight phase of
# (d) zero-copy < (c) copy mode < (a) cold.
set -uo pipefail
DIR=$1
# shellcheck source=tools/gpu-kit/steps/common.sh
source "$KIT/share/steps/common.sh"
args=(--kit "$KIT" --driver "$KIT_DRIVER" --registry dir --json "$DIR/demo.json" --svg "$DIR/demo.svg")
if [[ $KIT_DRIVER == real ]]; then
  # On disk, not /dev/shm: thawd's cache already holds two copies of the model in memory.
  WORK=/var/tmp/thaw-kit-demo
  if ((QUICK)); then args+=(--size medium); else args+=(--size xl); fi
else
  WORK=$(kit_scratch demo)
  trap 'rm -rf "$WORK"' EXIT
  ((QUICK)) && args+=(--quick --repeat 1)
fi
mkdir -p "$WORK"
"$KIT/share/run-demo.sh" "${args[@]}" --work "$WORK" >"$DIR/table.txt" 2>"$DIR/demo.log"
rc=$?
cat "$DIR/table.txt"
cp -r "$WORK/logs" "$DIR/logs" 2>/dev/null || true
if ((rc != 0)) || [[ ! -s $DIR/demo.json ]]; then
  kit_result "$DIR" failed "run-demo.sh exited $rc: $(grep -v '^\[' "$DIR/demo.log" | tail -1)$(tail -1 "$DIR/demo.log")"
  exit 0
fi
get() { kit_round "$("$KIT/bin/thaw-demo-report" get "$1" --default "" <"$DIR/demo.json")"; }
figures=("figure.device=$(get meta.device)" "figure.model_bytes=$(get meta.model_bytes)")
declare -A w t
problems=()
for i in 0 1 2 3; do
  id=$(get "runs.$i.id")
  w[$id]=$(get "runs.$i.weights_s")
  t[$id]=$(get "runs.$i.total_s")
  figures+=("figure.${id}_weights_s=${w[$id]}" "figure.${id}_total_s=${t[$id]}"
    "figure.${id}_speedup=$(get "runs.$i.speedup")")
  [[ $(get "runs.$i.tokens_equal_first") == true ]] || problems+=("($id)'s tokens differ from (a)'s")
done
less() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'; }
less "${w[d]}" "${w[c]}" || problems+=("weights (d) ${w[d]} s not < (c) ${w[c]} s")
less "${w[c]}" "${w[a]}" || problems+=("weights (c) ${w[c]} s not < (a) ${w[a]} s")
[[ $(get meta.zero_slot) == *"zero-copy on"* ]] || problems+=("(d) did not run zero-copy: $(get meta.zero_slot)")
figures+=("figure.weights_zero_over_cold=$(awk -v a="${w[d]}" -v b="${w[a]}" 'BEGIN { printf "%.3f", a / b }')"
  "figure.weights_copy_over_cold=$(awk -v a="${w[c]}" -v b="${w[a]}" 'BEGIN { printf "%.3f", a / b }')")
if ((${#problems[@]})); then
  kit_result "$DIR" failed "$(IFS=';'; echo "${problems[*]}")" "${figures[@]}"
else
  kit_result "$DIR" passed "4 runs, equal tokens; total speed-up over cold: streamed $(get runs.1.speedup)x, copy $(get runs.2.speedup)x, zero-copy $(get runs.3.speedup)x" "${figures[@]}"
fi
