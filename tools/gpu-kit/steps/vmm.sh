#!/bin/bash
# Step c: the VMM benchmarks (bench/vmm, issue 6) — prewarm throughput of a slot against the
# measured host-to-device copy rate and against a naive loader, the activation's critical path,
# and switching the GPU between two prewarmed models against a cold load. The small model pair
# (0.29 + 0.08 GB) with --quick or on the emulator, the full pair (3.16 + 0.27 GB) on a GPU.
# Passes when the benchmark ran; the issue's targets are reported as met or missed.
set -uo pipefail
DIR=$1
# shellcheck source=tools/gpu-kit/steps/common.sh
source "$KIT/share/steps/common.sh"
models=small
if [[ $KIT_DRIVER == real ]]; then
  MODELS_DIR=/var/tmp/thaw-kit-vmm-models
  ((QUICK)) || models=default
else
  MODELS_DIR=$(kit_scratch vmm)
  trap 'rm -rf "$MODELS_DIR"' EXIT
fi
mkdir -p "$MODELS_DIR"
"$KIT/share/vmm-run.sh" --kit "$KIT" --driver "$KIT_DRIVER" --models "$models" \
  --models-dir "$MODELS_DIR" --json-file "$DIR/vmm.json"
rc=$?
if ((rc != 0)) || [[ ! -s $DIR/vmm.json ]]; then
  kit_result "$DIR" failed "the VMM benchmark exited $rc (see c/log)"
  exit 0
fi
get() { kit_round "$("$KIT/bin/thaw-demo-report" get "$1" --default "" <"$DIR/vmm.json")"; }
figures=("figure.models=$models" "figure.device=$(get device_name)"
  "figure.pcie_measured_gbps=$(get pcie_measured_gbps)"
  "figure.prewarm_thaw_gbps=$(get prewarm.thaw_gbps)" "figure.prewarm_naive_gbps=$(get prewarm.naive_gbps)"
  "figure.prewarm_thaw_over_naive=$(get prewarm.thaw_over_naive)"
  "figure.activation_critical_path_ms=$(get activation.critical_path_ms_median)"
  "figure.switch_ms=$(get switch.switch_ms)" "figure.cold_load_ms=$(get switch.cold_load_ms)"
  "figure.switch_speedup=$(get switch.speedup)")
met=() missed=()
for t in prewarm_share_ge_95 naive_share_le_70 activation_le_1ms switch_ge_50x; do
  v=$(get "targets.$t")
  figures+=("figure.target_$t=$v")
  if [[ $v == true ]]; then met+=("$t"); else missed+=("$t"); fi
done
kit_result "$DIR" passed "ran on $KIT_DRIVER ($models models); targets met: ${met[*]:-none}; missed: ${missed[*]:-none}" "${figures[@]}"
