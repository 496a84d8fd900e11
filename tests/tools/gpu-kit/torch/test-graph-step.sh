#!/bin/bash
# The kit's step f (tools/gpu-kit/steps/graphs.sh, torch/run_graph_step.sh, graph_verdict.py)
# without torch or a GPU: the verdict on recorded outputs of both runs (passes only when they
# are bit-identical, thawd holds a graphs artifact, and the second run's shim summary says
# transparent >= 1 with no fallback — the reasons verbatim otherwise), the step's skips, the
# node script's refusal of a bad environment, and the kit's run script with step f in its
# report. A few seconds; needs python3.
#
#
# With --node, also the node script for real on thaw's emulator, on the demo's node
# (tools/demo/run-demo.sh --quick --with-node: private thawd and bus, the model in thawd's cache)
# and the real shim, with fake_graph.py in torch_graph.py's place (ctypes on the driver API: it
# loads the model's tensors and the reference engine's kernel module, captures a chain of six
# kernel launches, replays the graph): both runs must complete with bit-identical outputs and
# thawd must list the first run's graphs artifact; where the shim writes its graph restore
# summary (a shim with transparent restore), the whole verdict must pass: the second run's
# graph handed back, no fallback. A shim without it writes no summary line; that is said, and
# the rest is still checked. About 10 s more.
#
# usage: tests/tools/gpu-kit/torch/test-graph-step.sh [--node] [--build DIR] [--keep]
#   --build  the build tree for --node (default build/default)
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../../../.." && pwd)
SRC=$REPO/tools/gpu-kit
B=$REPO/build/default
KEEP=0
NODE=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --keep) KEEP=1; shift ;;
    --node) NODE=1; shift ;;
    --build) B=$2; shift 2 ;;
    *) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
T=$(mktemp -d /tmp/thaw-graph-step-test.XXXXXX)
cleanup() { if ((KEEP)); then echo "work directory $T" >&2; else rm -rf "$T"; fi; }
trap cleanup EXIT
FAILS=0
fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }
ok() { echo "ok: $*"; }

# ------------------------------------------------------------------------ the verdict
V=$SRC/torch/graph_verdict.py
# run_doc FILE TOKENS SHA [OK]: a torch_graph.py output
run_doc() {
  local ok=${4:-true} err=null
  [[ $ok == true ]] || err='"RuntimeError: capture failed"'
  printf '{"ok":%s,"phase":"capture","error":%s,"missing":null,"tokens":%s,"logits_sha256":"%s","logits_head":[0.5],"capture_s":0.01}\n' \
    "$ok" "$err" "$2" "$3" >"$1"
}
GRAPHS='[{"kind":"layout","readable":true,"summary":"412 allocations"},{"kind":"graphs","readable":true,"summary":"1 graph, 197 nodes"}]'
# case NAME EXPECT(0|1) PROBLEM_TEXT: sets up the default passing files, then $SETUP changes them
verdict_case() {
  local name=$1 want=$2 text=$3 d=$T/v/$1 rc
  mkdir -p "$d"
  run_doc "$d/1.json" '[11,12,13]' aaaa
  run_doc "$d/2.json" '[11,12,13]' aaaa
  echo 'thaw-preload[10]: loaded' >"$d/1.log"
  printf 'thaw-preload[11]: loaded\nthaw-preload[11]: thaw: graph restore summary: captures=1 transparent=1 fallbacks=0\n' >"$d/2.log"
  echo "$GRAPHS" >"$d/a.json"
  (cd "$d" && eval "${SETUP:-:}")
  python3 "$V" --first "$d/1.json" --second "$d/2.json" --first-log "$d/1.log" \
    --second-log "$d/2.log" --artifacts "$d/a.json" --out "$d/v.json" >"$d/stdout"
  rc=$?
  if ((rc != want)); then
    fail "verdict $name: exit $rc, wanted $want: $(cat "$d/stdout")"
  elif [[ -n $text ]] && ! grep -qF -- "$text" "$d/v.json"; then
    fail "verdict $name: no '$text' in $(cat "$d/v.json")"
  elif ((want == 1)) && python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["passed"] else 1)' "$d/v.json"; then
    fail "verdict $name: exit 1 but passed is true"
  else
    ok "verdict $name"
  fi
}
SETUP='' verdict_case pass 0 '"second_transparent": 1'
SETUP='run_doc 2.json "[11,12,14]" aaaa' verdict_case tokens_differ 1 'tokens differ: [11, 12, 13] then [11, 12, 14]'
SETUP='run_doc 2.json "[11,12,13]" bbbb' verdict_case logits_differ 1 'logits differ: sha256 aaaa then bbbb'
SETUP='run_doc 2.json "[11,12,13]" aaaa false' verdict_case second_failed 1 'second run failed in phase capture: RuntimeError: capture failed'
SETUP='rm 2.json' verdict_case second_missing 1 'second run: no file'
SETUP='echo "[{\"kind\":\"layout\",\"readable\":true}]" >a.json' verdict_case no_graphs_artifact 1 'left no graphs artifact'
SETUP='echo "[{\"kind\":\"graphs\",\"readable\":false,\"summary\":\"bad digest\"}]" >a.json' verdict_case unreadable_artifact 1 'unreadable: bad digest'
SETUP='echo loaded >2.log' verdict_case no_summary 1 "wrote no 'thaw: graph restore summary' line"
SETUP='echo "thaw-preload[11]: thaw: graph restore summary: captures=2 transparent=1 fallbacks=1 (kernel of an unknown module: 1)" >2.log' \
  verdict_case fallback 1 'fell back 1 time(s): (kernel of an unknown module: 1)'
SETUP='echo "thaw: graph restore summary: captures=1 transparent=0 fallbacks=0" >2.log' \
  verdict_case none_transparent 1 'restored no graph transparently (captures=1 transparent=0 fallbacks=0)'
# The last summary line counts (a shim that wrote one per context, say).
SETUP='printf "thaw: graph restore summary: captures=1 transparent=0 fallbacks=1 (x: 1)\nthaw: graph restore summary: captures=1 transparent=1 fallbacks=0\n" >2.log' \
  verdict_case last_line_counts 0 ''

# ------------------------------------------------------------------------ the step's skips
export KIT=$T/kit
mkdir -p "$KIT/share" "$KIT/lib"
cp -r "$SRC/steps" "$KIT/share/steps"
cp -r "$SRC/torch" "$KIT/share/torch"
cp "$SRC/run" "$KIT/run"
echo "test" >"$KIT/share/commit"
step_status() {  # step_status DIR: "status|reason"
  echo "$(sed -n 's/^status=//p' "$1/result" | tail -1)|$(sed -n 's/^reason=//p' "$1/result" | tail -1)"
}
mkdir -p "$T/s1" "$T/s2"
KIT_DRIVER=emulator KIT_DRIVER_REASON="no /dev/nvidia* device on this machine" \
  bash "$KIT/share/steps/graphs.sh" "$T/s1" >"$T/s1/log" 2>&1
r=$(step_status "$T/s1")
if [[ $r == "skipped|no GPU (no /dev/nvidia* device on this machine)"* ]]; then
  ok "step f skips on the emulator"
else
  fail "step f on the emulator: $r"
fi
KIT_DRIVER=real KIT_DRIVER_REASON=x PYTHON=/nonexistent/python3 \
  bash "$KIT/share/steps/graphs.sh" "$T/s2" >"$T/s2/log" 2>&1
r=$(step_status "$T/s2")
if [[ $r == "skipped|no python3 on this machine" ]]; then
  ok "step f skips without python3"
else
  fail "step f without python3: $r"
fi

# run_graph_step.sh: a bad environment is exit 2 with what is missing.
out=$(env -u THAW_SOCKET OUT="$T/g" THAWCTL=true MODEL_DIR="$T" bash "$KIT/share/torch/run_graph_step.sh" 2>&1)
rc=$?
((rc == 2)) && [[ $out == *"THAW_SOCKET is not set"* ]] && ok "run_graph_step.sh refuses a missing THAW_SOCKET" ||
  fail "run_graph_step.sh without THAW_SOCKET: exit $rc: $out"

# ------------------------------------------------------------------------ the kit's run
"$KIT/run" --only g --out "$T/bad" >/dev/null 2>&1
rc=$?
((rc == 2)) && ok "run --only g is bad usage" || fail "run --only g exited $rc, not 2"
"$KIT/run" --help | grep -q '^  f  CUDA graphs restored transparently' && ok "run --help lists step f" ||
  fail "run --help does not list step f"
"$KIT/run" --emulator --only f --out "$T/report" >"$T/run.log" 2>&1
rc=$?
r=$(step_status "$T/report/f")
if ((rc != 0)); then
  fail "run --emulator --only f exited $rc: $(tail -3 "$T/run.log")"
elif [[ $r != skipped\|no\ GPU* ]]; then
  fail "run --emulator --only f: step f is $r"
elif ! python3 -c 'import json,sys
steps = json.load(open(sys.argv[1]))["steps"]
f = [s for s in steps if s["step"] == "f"]
assert [s["step"] for s in steps] == list("abcdef"), [s["step"] for s in steps]
assert f[0]["name"] == "CUDA graphs restored under PyTorch" and f[0]["status"] == "skipped", f' "$T/report/report.json"; then
  fail "run --emulator --only f: report.json lacks step f as skipped"
elif ! grep -q '^| f CUDA graphs restored under PyTorch | skipped |' "$T/report/report.md"; then
  fail "run --emulator --only f: report.md lacks step f"
else
  ok "run --emulator --only f: f skipped in report.json and report.md"
fi

# ------------------------------------------------------------- the node script, for real
if ((NODE)); then
  cp "$B/preload/libthaw-preload.so" "$KIT/lib/"  # a copy: a concurrent build cannot change it
  cp "$HERE/fake_graph.py" "$KIT/share/torch/torch_graph.py"
  CUBIN=$B/tools/refengine/refengine_kernels_cubins/kernels.sm_90.cubin
  [[ -f $CUBIN ]] || fail "no $CUBIN (build the refengine target)"
  cat >"$T/node.sh" <<NODE
export KIT="$KIT" OUT="$T/node-out" GRAPH_RUN_TIMEOUT=60 FAKE_CUBIN="$CUBIN"
bash "$KIT/share/torch/run_graph_step.sh"
NODE
  timeout 240 "$REPO/tools/demo/run-demo.sh" --build "$B" --quick --registry dir --work "$T/work" \
    --with-node "$T/node.sh" >"$T/node.log" 2>&1
  rc=$?
  V=$T/node-out/graphs.json
  if ((rc != 0)) || [[ ! -s $V ]]; then
    fail "the node script on the emulator: exit $rc, verdict: $(cat "$V" 2>/dev/null): $(tail -3 "$T/node.log")"
  elif ! python3 - "$V" <<'EOP'; then
import json, sys
v = json.load(open(sys.argv[1]))
f, problems = v["figures"], v["problems"]
# The step's own duties: both runs, identical outputs, the artifact.
assert f.get("graphs_artifacts") == 1 and f.get("graphs_artifact", "").startswith("1 graph, 6 nodes"), f
if "second_captures" in f:
    # A shim with transparent restore: the whole verdict.
    assert v["passed"] and f["second_transparent"] == 1 and f["second_fallbacks"] == 0, v
    print("verdict on the emulator: passed", f)
else:
    assert len(problems) == 1 and "wrote no 'thaw: graph restore summary' line" in problems[0], problems
    print("NOTE: this shim wrote no graph restore summary (no transparent restore in it); the rest passed")
EOP
    fail "the node script on the emulator: unexpected verdict $(cat "$V")"
  else
    ok "the node script on the emulator: two runs, identical outputs, graphs artifact$(grep -q '"second_captures"' "$V" && echo ', transparent restore')"
  fi
fi

((FAILS == 0)) || { echo "test-graph-step: $FAILS check(s) failed" >&2; exit 1; }
echo "test-graph-step: all checks passed"
