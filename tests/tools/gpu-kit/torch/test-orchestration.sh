#!/bin/bash
# run_torch_step.sh on thaw's CUDA driver emulator, without torch or a GPU: a private
# dbus-daemon and thawd (the shipped thawd.toml with its paths changed, a local-directory
# registry), a small synthetic GPT-2 published and fetched, and the step with a fake torch
# (only what the step's probe asks) and fake_engine.py in torch_engine.py's place. Checks that
# every run passes — the copy-mode run injected bytes from its slot, the zero-copy run says
# "zero-copy on" — then that a failing device_map run, TORCH_RUNS and TORCH_BUDGET_S are
# reported as they should be. About 20 s; nothing needs root.
#
# usage: tests/tools/gpu-kit/torch/test-orchestration.sh [--build DIR] [--keep]
#   --build  the build tree with thawd, thawctl, thaw-fetch, thaw-genmodel, the shim and the
#            emulator (default build/default)
#   --keep   leave the work directory (logs, torch.json of each case) and say where
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../../../.." && pwd)
STEP_SRC=$REPO/tools/gpu-kit/torch
B=$REPO/build/default
KEEP=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) B=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    *) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
fail() { echo "test-orchestration: FAILED: $*" >&2; exit 1; }
for f in daemon/cli/thawd tools/thawctl/thawctl tools/thaw-fetch/thaw-fetch \
  tools/genmodel/thaw-genmodel preload/libthaw-preload.so emu/libcuda.so.1; do
  [[ -e $B/$f ]] || fail "$B/$f is not built"
done
command -v dbus-daemon >/dev/null || fail "dbus-daemon is missing (Debian's dbus-daemon)"

T=$(mktemp -d /tmp/thaw-torch-test.XXXXXX)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  if ((KEEP)); then echo "test-orchestration: work directory $T" >&2; else rm -rf "$T"; fi
}
trap cleanup EXIT

# A kit as make-kit.sh lays it out (copies: a concurrent build cannot change them mid-test).
KIT=$T/kit
mkdir -p "$KIT/bin" "$KIT/lib" "$KIT/emu" "$T/step" "$T/pylib"/{torch,transformers,safetensors}
cp "$B/daemon/cli/thawd" "$B/tools/thawctl/thawctl" "$B/tools/thaw-fetch/thaw-fetch" \
  "$B/tools/genmodel/thaw-genmodel" "$KIT/bin/"
cp "$B/preload/libthaw-preload.so" "$KIT/lib/"
cp "$B/emu/libcuda.so.1" "$KIT/emu/"
cp "$STEP_SRC/run_torch_step.sh" "$STEP_SRC/torch_report.py" "$T/step/"
cp "$HERE/fake_engine.py" "$T/step/torch_engine.py"
cat >"$T/pylib/torch/__init__.py" <<'PY'
__version__ = "0+fake"
class version:
    cuda = "13.0"
class cuda:
    is_available = staticmethod(lambda: True)
    get_device_name = staticmethod(lambda i=0: "thaw's emulator (a fake torch)")
PY
echo '__version__ = "0+fake"' >"$T/pylib/transformers/__init__.py"
: >"$T/pylib/safetensors/__init__.py"

mkdir -p "$T/registry" "$T/cache" "$T/emu"
"$KIT/bin/thaw-genmodel" --size custom --layers 2 --embd 256 --heads 4 --vocab 4096 \
  --positions 128 --dtype f16 --out "$T/registry/tiny" --quiet >/dev/null || fail "thaw-genmodel"
"$KIT/bin/thaw-fetch" publish --chunk-size 1MiB --quiet "$T/registry/tiny" || fail "thaw-fetch publish"
# The same files under a second name: a model no engine has recorded a layout of yet.
cp -al "$T/registry/tiny" "$T/registry/tiny2"

cat >"$T/bus.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>custom</type><listen>unix:path=$T/bus</listen><auth>EXTERNAL</auth>
<policy context="default"><allow user="*"/><allow own="org.thaw.Node1"/>
<allow send_destination="*"/><allow receive_sender="*"/></policy></busconfig>
CONF
dbus-daemon --nofork --nopidfile --config-file="$T/bus.conf" 2>"$T/dbus.log" &
PIDS+=($!)
for _ in $(seq 100); do [[ -S $T/bus ]] && break; sleep 0.05; done
sed -e "s|^state_dir = .*|state_dir = \"$T/state\"|" -e "s|^cache_dir = .*|cache_dir = \"$T/cache\"|" \
  -e "s|^registry = .*|registry = \"$T/registry\"|" -e "s|^socket = .*|socket = \"$T/thawd.sock\"|" \
  -e "s|^bus = .*|bus = \"unix:path=$T/bus\"|" "$REPO/packaging/thawd.toml" >"$T/thawd.toml"
if [[ $(id -u) -ne 0 ]]; then
  sed -i "s|^allow_groups = .*|allow_groups = [\"thaw\", \"$(id -gn)\"]|" "$T/thawd.toml"
fi
export THAW_LIBCUDA=$KIT/emu/libcuda.so.1 FAKE_LIBCUDA=$KIT/emu/libcuda.so.1
export THAW_EMU_DEVICE_MEMORY=2G THAW_EMU_STATE_DIR=$T/emu
"$KIT/bin/thawd" --config "$T/thawd.toml" 2>"$T/thawd.log" &
PIDS=("$!" "${PIDS[@]}")  # thawd stops before its bus
for _ in $(seq 200); do [[ -S $T/thawd.sock ]] && break; sleep 0.05; done
[[ -S $T/thawd.sock ]] || fail "thawd did not start: $(tail -3 "$T/thawd.log")"
THAWCTL="$KIT/bin/thawctl --bus=unix:path=$T/bus"
for m in tiny tiny2; do
  $THAWCTL fetch $m >/dev/null 2>"$T/fetch.log" || fail "thawctl fetch $m: $(tail -2 "$T/fetch.log")"
done
export KIT THAW_SOCKET=$T/thawd.sock THAWCTL MODEL_NAME=tiny MODEL_DIR=$T/cache/tiny \
  PYTHONPATH=$T/pylib TORCH_PROMPT_IDS=464,2068,758,21

# case NAME [VAR=value...]: the step with those settings; its torch.json is $T/NAME/torch.json.
case_() {
  local name=$1
  shift
  env "$@" OUT="$T/$name" bash "$T/step/run_torch_step.sh" >"$T/$name.log" 2>&1 ||
    fail "$name: the step exited $? ($(tail -3 "$T/$name.log"))"
  [[ -f $T/$name/torch.json ]] || fail "$name: no torch.json"
}
# expect NAME PYTHON-EXPRESSION: true of `runs` (name -> entry) from NAME's torch.json.
expect() {
  python3 - "$T/$1/torch.json" "$2" <<'PY' || fail "$1: not true: $2 (see $T/$1.log, --keep)"
import json, sys
runs = {e["name"]: e for e in json.load(open(sys.argv[1]))}
sys.exit(0 if eval(sys.argv[2], {"runs": runs}) else 1)
PY
}

case_ all
expect all 'all(runs[n]["passed"] for n in runs if n != "record_to_cuda")'
expect all 'runs["record_to_cuda"]["passed"] is None'
expect all 'runs["attach_copy"]["shim_log"]["injection"]["bytes_injected"] > 0'
expect all 'runs["attach_zero_copy"]["shim_log"]["injection"]["zero_copy"]'
expect all 'runs["shim_to_cuda"]["shim_log"]["record_compared"] and not runs["shim_to_cuda"]["shim_log"]["divergence"]'
expect all 'all(runs[n]["tokens_equal_baseline"] for n in runs if n.startswith(("shim", "attach")))'
expect all 'runs["shim_expandable"]["baseline"] == "baseline_expandable"'

case_ device_map_fails FAKE_FAIL_MODE=device_map TORCH_RUNS=baseline_to_cuda,baseline_device_map,shim_device_map
expect device_map_fails 'runs["baseline_to_cuda"]["passed"] and runs["baseline_device_map"]["passed"] is False'
expect device_map_fails 'runs["shim_device_map"]["passed"] is False and "exited 1" in runs["shim_device_map"]["error"]'
expect device_map_fails 'runs["attach_copy"]["skipped_reason"].startswith("not selected")'

# Without the copy-mode run, a recording run comes first (tiny2 has no layout record yet).
case_ zero_copy_alone TORCH_RUNS=baseline_to_cuda,attach_zero_copy MODEL_NAME=tiny2 MODEL_DIR="$T/cache/tiny2"
expect zero_copy_alone 'runs["record_to_cuda"]["passed"] and runs["attach_zero_copy"]["passed"]'
expect zero_copy_alone 'runs["attach_zero_copy"]["shim_log"]["injection"]["zero_copy"]'

case_ no_budget TORCH_BUDGET_S=20
expect no_budget 'all(e["passed"] is None and e["skipped_reason"] for e in runs.values())'

# A prompt the model cannot take: exit 2, one failed entry that says why.
env OUT="$T/bad_prompt" TORCH_PROMPT_IDS=464,9999 bash "$T/step/run_torch_step.sh" >"$T/bad_prompt.log" 2>&1
rc=$?
((rc == 2)) || fail "bad_prompt: the step exited $rc, not 2"
expect bad_prompt 'runs["torch"]["passed"] is False and "vocab_size 4096" in runs["torch"]["error"]'

echo "test-orchestration: 5 cases passed"
