#!/bin/bash
# Step f: CUDA graphs restored transparently under an unmodified PyTorch program (issue 24).
# share/torch/torch_graph.py captures a GPT-2 decode step (transformers' modules, static KV
# cache) with torch.cuda.CUDAGraph and replays it on a fixed prompt; it runs twice in separate
# processes under libthaw-preload.so with the kit's thawd (the demo's node, gpt2-small's shape):
# the first run's graph is recorded in thawd, the second run's capture is answered from the
# record by the shim (share/torch/run_graph_step.sh). Passes when both runs' tokens and logits
# are bit-identical, thawd holds the graphs artifact, and the second run's shim summary says
# transparent >= 1 with no fallback (their reasons are the step's reason otherwise). Needs
# python3 with torch and a GPU; otherwise skipped with the reason.
set -uo pipefail
DIR=$1
# shellcheck source=tools/gpu-kit/steps/common.sh
source "$KIT/share/steps/common.sh"
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null; then
  kit_result "$DIR" skipped "no python3 on this machine"; exit 0
fi
if [[ $KIT_DRIVER != real ]]; then
  kit_result "$DIR" skipped "no GPU ($KIT_DRIVER_REASON): PyTorch's CUDA graphs need NVIDIA's driver"; exit 0
fi
if ! probe=$("$PY" -c 'import torch, transformers; assert torch.cuda.is_available(), "torch.cuda.is_available() is False"; print(torch.__version__)' 2>&1); then
  kit_result "$DIR" skipped "python3 cannot use torch+transformers on the GPU: $(tail -1 <<<"$probe")"; exit 0
fi
WORK=/var/tmp/thaw-kit-graphs
mkdir -p "$WORK"
run_timeout=$(( (${STEP_BUDGET_S:-75} - 15) / 2 ))  # two runs; the rest brings the node up
((run_timeout >= 30)) || run_timeout=30
cat >"$WORK/node.sh" <<NODE
export KIT="$KIT" OUT="$DIR" GRAPH_RUN_TIMEOUT=$run_timeout
bash "$KIT/share/torch/run_graph_step.sh"
NODE
"$KIT/share/run-demo.sh" --kit "$KIT" --driver real --registry dir --size small --work "$WORK" \
  --with-node "$WORK/node.sh" >"$DIR/node.out" 2>"$DIR/node.log"
rc=$?
if [[ ! -s $DIR/graphs.json ]]; then
  kit_result "$DIR" failed "no verdict (exit $rc): $(tail -2 "$DIR/node.log" | tr '\n' ' ')"; exit 0
fi
# The verdict's figures and problems as result lines (graph_verdict.py says what each means).
mapfile -t lines < <("$PY" -c 'import json, sys
v = json.load(open(sys.argv[1]))
print("passed" if v["passed"] else "failed")
print("; ".join(v["problems"]) or "-")
for k, x in sorted(v["figures"].items()):
    print(f"figure.{k}={x}")' "$DIR/graphs.json")
if [[ ${lines[0]:-} == passed ]] && ((rc == 0)); then
  kit_result "$DIR" passed "the second run's graph was restored transparently, outputs bit-identical" "${lines[@]:2}"
elif [[ ${lines[0]:-} == passed ]]; then
  kit_result "$DIR" failed "the verdict passed but the node exited $rc (see f/node.log)" "${lines[@]:2}"
else
  kit_result "$DIR" failed "${lines[1]:-graph_verdict.py unreadable} (see f/graphs/)" "${lines[@]:2}"
fi
