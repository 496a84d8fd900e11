#!/bin/bash
# Cold-start TTFT over shaped links: thaw with PP = 1, 2, 4 against the baseline (one worker
# that downloads the whole model, then starts without the shim — serverless vLLM), each in a
# fresh cluster in a box (tools/demo-cluster/box.sh), in one run. bench/cluster/README.md says
# how PP is steered (Alg. 1 and a TTFT SLO) and what TTFT means here. Root only.
#
# usage: bench/cluster/cold_start.sh [--build DIR] [--repeats N] [--rate 1gbit] [--nodes 4]
#                                    [--pp "1 2 4"] [--layers 16]
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=tools/demo-cluster/box.sh
source "$REPO/tools/demo-cluster/box.sh"

BUILD=$REPO/build/default REPEATS=3 RATE=1gbit NODES=4 PPS="1 2 4" LAYERS=16 ONE=''
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --pp) PPS=$2; shift 2 ;;
    --layers) LAYERS=$2; shift 2 ;;
    --one) ONE=$2; shift 2 ;;  # internal: one contender in this process's own box
    *) die "unknown argument $1" ;;
  esac
done
BUILD=$(cd "$BUILD" && pwd)
box_check_host 1
box_binaries "$BUILD"
ROOT=$BUILD/cluster-box/models
MODEL=b-cold-$LAYERS
LINK_BPS=$(rate_bps "$RATE")
# What every node tells the coordinator its link is (Alg. 1's b): the shaped rate, in bytes/s.
export BOX_LINK_BYTES=$((LINK_BPS / 8))
# Alg. 1's start-up costs, fixed so that its choice depends on the SLO alone, and the PCIe rate
# the nodes report (box.sh: pcie = "16GB").
T_CC=0.1 T_CU=0.1 T_L=0.3 PCIE_BPS=16e9
PROMPT='[5,6,7,8,9,10,11,12]'
export BOX_ENGINE_ARGS="--max-num-seqs 2 --max-model-len 64 --num-gpu-blocks-override 32 --enforce-eager"
export BOX_EMU_MEMORY=3G BOX_CACHE_BUDGET=4GiB

# ----------------------------------------------------------------- one contender, one box
# Prints: contender  planned-stages  ttft-s  tokens
if [[ -n $ONE ]]; then
  box_network "$NODES" "$RATE"
  box_registry "$ROOT" "$MODEL/config.json"
  # Fixed start-up costs: Alg. 1's choice then depends on the SLO alone (README.md).
  box_coordinator --launch-workers --worker-ports 20000 --worker-port-count 64 \
    --fixed-startup-costs --t-cc "$T_CC" --t-cu "$T_CU" --t-l "$T_L"
  for ((i = 0; i < NODES; i++)); do box_node "$i"; done
  box_wait_nodes "$NODES"
  box_gateway --hold-deadline 120s --upstream-timeout 120s
  bytes=$(model_bytes "$ROOT/$MODEL")
  name=$MODEL slo=none
  case $ONE in
    baseline) name=$MODEL-baseline; cluster deploy "$name" --size "$bytes" --layers "$LAYERS" >/dev/null ;;
    pp1) cluster deploy "$name" --size "$bytes" --layers "$LAYERS" >/dev/null ;;
    pp*)
      k=${ONE#pp}
      # Alg. 1's TTFT for s stages is Eq. 5 (coordinator/policy/hydraserve_prediction.cpp),
      #   T(s) = max(t_cc + t_cu + max(M/(s p), t_l), M/(s b))   (t_p = t_n = 0 here),
      # the start-up and the stage's fetch overlapped, not added. An SLO between T(k) and
      # T(k-1) is met by k stages and by no fewer; more stages meet it too, but Alg. 1 takes
      # the scheme with the least GPU memory, M + (s-1)/s M for one full-memory worker, which
      # grows with s: so exactly k. (An SLO of 0.5 s + 1.15 M/(k b), used before, added the
      # start-up to the fetch: for k = 4 it was above T(3), and Alg. 1 rightly chose 3.)
      slo=$(awk -v m="$bytes" -v b="$BOX_LINK_BYTES" -v p="$PCIE_BPS" -v k="$k" \
        -v cc="$T_CC" -v cu="$T_CU" -v l="$T_L" '
        function max(x, y) { return x > y ? x : y }
        function t(s) { return max(cc + cu + max(m / s / p, l), m / s / b) }
        BEGIN {
          if (k < 2 || t(k - 1) - t(k) < 0.02) { print "none"; exit }
          printf "%.3f", (t(k) + t(k - 1)) / 2
        }')
      [[ $slo != none ]] || die "$ONE: no TTFT SLO makes Alg. 1 choose $k stages: with start-up $T_CC+$T_CU+$T_L s and $bytes bytes over $BOX_LINK_BYTES B/s, $k and $((k - 1)) stages are predicted (nearly) the same TTFT (the start-up, not the fetch, decides); use a slower --rate or a larger --layers"
      cluster deploy "$name" --size "$bytes" --layers "$LAYERS" --ttft "$slo" >/dev/null
      ;;
    *) die "--one $ONE: baseline or ppK" ;;
  esac
  # Streamed: TTFT is the first token's event, as a client sees it (bench/cluster/stream_ttft.py).
  out=$(in_ns "$BOX-ctl" /usr/bin/python3 "$HERE/stream_ttft.py" "$BOX_GATEWAY" "$name" "$PROMPT" 4 150 \
    2>"$BOX_WORK/answer.err") || die "$ONE: ${out:-no answer}: $(cat "$BOX_WORK/answer.err")"
  read -r _status ttft _total tokens <<<"$out"
  # The plan Alg. 1 made (its stages and its predicted TTFT), as the coordinator reports it.
  read -r stages predicted < <(cluster state | /usr/bin/python3 -c '
import json, sys
plans = json.load(sys.stdin).get("plans", [])
p = max(plans, key=lambda p: p.get("stages", 0)) if plans else {}
print(p.get("stages", 0), "%.2f" % p.get("predicted_ttft_s", 0))')
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$ONE" "$stages" "$ttft" "$tokens" "$slo" "$predicted"
  exit 0
fi

# ----------------------------------------------------------------------------- the runs
box_reap_leftovers
mkdir -p "$ROOT"
box_publish_model "$ROOT" "$MODEL" --layers "$LAYERS" --embd 1024 --heads 16 --vocab 8192 --positions 256 --dtype f16
[[ -d $ROOT/$MODEL-baseline ]] || cp -al "$ROOT/$MODEL" "$ROOT/$MODEL-baseline"
BYTES=$(model_bytes "$ROOT/$MODEL")
CONTENDERS=(baseline)
for k in $PPS; do CONTENDERS+=("pp$k"); done
RESULTS=$WORK/results.tsv
: >"$RESULTS"
n=${#CONTENDERS[@]}
for ((r = 1; r <= REPEATS; r++)); do
  for ((j = 0; j < n; j++)); do
    c=${CONTENDERS[(j + r - 1) % n]}
    log "round $r: $c"
    line=$(bash "$0" --one "$c" --build "$BUILD" --rate "$RATE" --nodes "$NODES" --layers "$LAYERS" 2>"$WORK/$c.$r.log") ||
      die "$c failed: $(tail -5 "$WORK/$c.$r.log")"
    log "  $line"
    printf '%s\n' "$line" >>"$RESULTS"
  done
done
echo
echo "== cold start, one request through thaw-gateway: $MODEL ($BYTES bytes, $LAYERS layers) on $NODES nodes, links $RATE each way, $REPEATS rounds =="
/usr/bin/python3 - "$RESULTS" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
by = {}
for c, stages, t, tokens, slo, predicted in rows:
    by.setdefault(c, []).append((int(stages), float(t), tokens, slo, predicted))
answers = {v[2] for vs in by.values() for v in vs}
base = statistics.median(v[1] for v in by["baseline"])
print(f"{'contender':10} {'planned PP':>10} {'SLO':>7} {'Alg.1 TTFT':>10} {'TTFT median':>12} {'min':>7} {'max':>7} {'baseline/this':>14}")
for c, v in by.items():
    ts = [x[1] for x in v]
    pp = sorted({x[0] for x in v})
    slo = "/".join(sorted({x[3] for x in v}))
    pred = "/".join(sorted({x[4] for x in v}))
    med = statistics.median(ts)
    print(f"{c:10} {'/'.join(map(str, pp)):>10} {slo:>7} {pred:>10} {med:11.2f}s {min(ts):6.2f}s {max(ts):6.2f}s {base / med:13.2f}x")
print("answers identical across contenders:" if len(answers) == 1 else "ANSWERS DIFFER:", " | ".join(sorted(answers)))
sys.exit(0 if len(answers) == 1 else 1)
PY
