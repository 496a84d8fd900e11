#!/bin/bash
# Step e: an unmodified PyTorch program (share/torch/torch_engine.py: transformers GPT-2, greedy)
# under libthaw-preload.so with the kit's thawd running — plain, expandable segments, attached
# to a prewarmed slot in copy mode and zero-copy, and a CUDA-graph capture of a decode step —
# against the same program without thaw (share/torch/run_torch_step.sh). Needs python3 with
# torch and a GPU; otherwise skipped with the reason.
set -uo pipefail
DIR=$1
# shellcheck source=tools/gpu-kit/steps/common.sh
source "$KIT/share/steps/common.sh"
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null; then
  kit_result "$DIR" skipped "no python3 on this machine"; exit 0
fi
if [[ $KIT_DRIVER != real ]]; then
  kit_result "$DIR" skipped "no GPU ($KIT_DRIVER_REASON): PyTorch's CUDA runtime needs NVIDIA's driver"; exit 0
fi
if ! probe=$("$PY" -c 'import torch, transformers; assert torch.cuda.is_available(), "torch.cuda.is_available() is False"; print(torch.__version__, transformers.__version__)' 2>&1); then
  kit_result "$DIR" skipped "python3 cannot use torch+transformers on the GPU: $(tail -1 <<<"$probe")"; exit 0
fi
# The node (thawd, bus, the model in thawd's cache) as the demo brings it up; gpt2-small's
# shape (the PyTorch program's prompt needs its vocabulary).
WORK=/var/tmp/thaw-kit-torch
mkdir -p "$WORK"
budget=$(( ${STEP_BUDGET_S:-120} - 30 ))
cat >"$WORK/node.sh" <<NODE
export KIT="$KIT" OUT="$DIR" TORCH_BUDGET_S=$budget
bash "$KIT/share/torch/run_torch_step.sh"
NODE
"$KIT/share/run-demo.sh" --kit "$KIT" --driver real --registry dir --size small --work "$WORK" \
  --with-node "$WORK/node.sh" >"$DIR/node.out" 2>"$DIR/node.log"
rc=$?
if [[ ! -s $DIR/torch.json ]]; then
  kit_result "$DIR" failed "no torch.json (exit $rc): $(tail -2 "$DIR/node.log" | tr '\n' ' ')"; exit 0
fi
# torch.json: a list of {name, passed (true/false/null), skipped_reason, ...}.
passed=$(grep -o '"passed": *true' "$DIR/torch.json" | wc -l)
failed=$(grep -o '"passed": *false' "$DIR/torch.json" | wc -l)
skipped=$(grep -o '"passed": *null' "$DIR/torch.json" | wc -l)
figs=("figure.runs_passed=$passed" "figure.runs_failed=$failed" "figure.runs_skipped=$skipped")
if ((failed > 0 || rc != 0)); then
  kit_result "$DIR" failed "$failed run(s) failed, $passed passed, $skipped skipped (exit $rc; see e/torch.json)" "${figs[@]}"
elif ((passed == 0)); then
  kit_result "$DIR" skipped "no PyTorch run completed: $skipped skipped (see e/torch.json)" "${figs[@]}"
else
  kit_result "$DIR" passed "$passed runs passed, $skipped skipped (tokens equal to the program without thaw)" "${figs[@]}"
fi
