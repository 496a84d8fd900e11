#!/bin/bash
# Step a: driver conformance. The emulator's tests that pin documented driver behaviour (VMM,
# export/import, cuGetProcAddress incl. every entry point PyTorch requires, streams/events,
# capture and graphs, module loading, error codes), as one program (tests/emu/conformance), run
# against this machine's libcuda.so.1 — or the kit's emulator. Each test runs in its own
# process. On NVIDIA's driver every failure is a place where the emulator is wrong.
set -uo pipefail
DIR=$1
# shellcheck source=tools/gpu-kit/steps/common.sh
source "$KIT/share/steps/common.sh"
env_vars=()
if [[ $KIT_DRIVER == emulator ]]; then
  STATE=$(kit_scratch conformance)
  trap 'rm -rf "$STATE"' EXIT
  env_vars=(THAW_LIBCUDA="$KIT/emu/libcuda.so.1" THAW_EMU_STATE_DIR="$STATE")
fi
per_test=30
((QUICK)) && per_test=20
env "${env_vars[@]}" "$KIT/conformance/thaw-driver-conformance" --json "$DIR/conformance.json" \
  --timeout "$per_test" >"$DIR/conformance.out" 2>&1
rc=$?
tail -5 "$DIR/conformance.out"
get() { "$KIT/bin/thaw-demo-report" get "$1" --default "" <"$DIR/conformance.json"; }
if [[ ! -s $DIR/conformance.json ]]; then
  kit_result "$DIR" failed "the conformance program exited $rc without a report: $(tail -1 "$DIR/conformance.out")"
  exit 0
fi
# Failed tests by name, one per line, for the report and for whoever fixes the emulator.
"$KIT/bin/thaw-demo-report" get 'failed.*' --default '' <"$DIR/conformance.json" >"$DIR/failed.txt" 2>/dev/null || true
n_failed=$(grep -c . "$DIR/failed.txt" || true)
figures=("figure.driver_version=$(get driver_version)" "figure.passed=$(get counts.passed)"
  "figure.failed=$(get counts.failed)" "figure.skipped=$(get counts.skipped)")
# The same program under libthaw-preload.so with no thawd, compared test by test with the run
# on the driver alone (issue 22: every call the shim does not deliberately change answers as
# the driver does). under_shim_test.sh runs both and lists the known differences.
shim="not compared"
if [[ ! -x $KIT/conformance/under_shim_test.sh ]]; then
  shim="not compared (this kit has no under_shim_test.sh)"
elif ! command -v python3 >/dev/null; then
  shim="not compared (no python3 here)"
else
  libcuda=libcuda.so.1  # the system's, found by dlopen
  [[ $KIT_DRIVER == emulator ]] && libcuda=$KIT/emu/libcuda.so.1
  if env "${env_vars[@]}" "$KIT/conformance/under_shim_test.sh" "$KIT/conformance/thaw-driver-conformance" \
    "$libcuda" "$KIT/lib/libthaw-preload.so" >"$DIR/under-shim.out" 2>&1; then
    shim="same answers ($(tail -1 "$DIR/under-shim.out"))"
  else
    shim="DIFFERENT: $(grep -m5 ' under the shim$' "$DIR/under-shim.out" | tr '\n' ' ')($(tail -1 "$DIR/under-shim.out"); a/under-shim.out)"
  fi
fi
echo "under the shim: $shim"
figures+=("figure.under_shim=$shim")
if ((rc == 0)) && [[ $shim == DIFFERENT* ]]; then
  kit_result "$DIR" failed "the driver passes, but under the shim: $shim" "${figures[@]}"
elif ((rc == 0)); then
  kit_result "$DIR" passed "$(get counts.passed) passed, $(get counts.skipped) skipped (emulator-only checks) on $KIT_DRIVER; under the shim: $shim" "${figures[@]}"
else
  kit_result "$DIR" failed "$n_failed test(s) disagree with this driver (exit $rc): $(head -5 "$DIR/failed.txt" | tr '\n' ' ')$( ((n_failed > 5)) && echo "... (a/failed.txt)")" \
    "${figures[@]}" "figure.failed_tests=$(tr '\n' ' ' <"$DIR/failed.txt")"
fi
