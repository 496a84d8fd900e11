#!/bin/bash
# Issue 25's cluster benchmarks in one invocation, each against its peer in the same run:
#   1. cold-start TTFT for PP = 1, 2, 4 against the baseline (cold_start.sh);
#   2. tokens/s before and after consolidation, by drain and by KV transfer (consolidation.sh);
#   3. SLO attainment of thaw against the baseline on a slice of the Azure conv trace
#      (tools/demo-cluster/run-demo-cluster.sh: summary.md, summary.json, timeline.svg).
# Each part's output goes to OUT/<part>.txt as well as here; a part that fails stops the run.
# Root only (network namespaces, tc). About 15-20 min on 2 cores.
#
# usage: bench/cluster/run.sh [--build DIR] [--out DIR] [--repeats N] [--rate 1gbit]
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD=$REPO/build/default OUT="" REPEATS=3 RATE=1gbit
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-$BUILD/bench-cluster}
mkdir -p "$OUT"
part() {
  local name=$1; shift
  echo "== $name: $*"
  "$@" 2>&1 | tee "$OUT/$name.txt"
}
part cold-start bash "$HERE/cold_start.sh" --build "$BUILD" --repeats "$REPEATS" --rate "$RATE"
part consolidation-drain bash "$HERE/consolidation.sh" --build "$BUILD" --handover drain --rate "$RATE"
part consolidation-kv bash "$HERE/consolidation.sh" --build "$BUILD" --handover kv-transfer --rate "$RATE"
part slo bash "$REPO/tools/demo-cluster/run-demo-cluster.sh" --build "$BUILD" --out "$OUT/demo-cluster" --rate "$RATE"
echo "all parts done: $OUT (demo-cluster/summary.md, demo-cluster/timeline.svg)"
