#!/bin/bash
# Tokens/s before and after consolidation (HydraServe §6): a PP=2 cold start in a cluster in a
# box (tools/demo-cluster/box.sh), then a closed loop of requests through thaw-gateway while the
# coordinator loads the full-memory worker, hands over and stops the pipeline. The plan's phase
# is polled all along; tokens/s is counted from the answers that ended in each phase, and every
# answer must carry the same tokens (one prompt, greedy). Root only.
#
# usage: bench/cluster/consolidation.sh [--build DIR] [--handover drain|kv-transfer]
#                                       [--rate 1gbit] [--seconds 40] [--clients 2]
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=tools/demo-cluster/box.sh
source "$REPO/tools/demo-cluster/box.sh"

BUILD=$REPO/build/default HANDOVER=drain RATE=1gbit SECONDS_=40 CLIENTS=2
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --handover) HANDOVER=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --seconds) SECONDS_=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    *) die "unknown argument $1" ;;
  esac
done
[[ $HANDOVER == @(drain|kv-transfer) ]] || die "--handover drain or kv-transfer"
BUILD=$(cd "$BUILD" && pwd)
box_check_host 1
box_reap_leftovers
box_binaries "$BUILD"
ROOT=$BUILD/cluster-box/models
MODEL=c-large
mkdir -p "$ROOT"
box_publish_model "$ROOT" "$MODEL" --layers 8 --embd 1024 --heads 16 --vocab 8192 --positions 256 --dtype f16
BYTES=$(model_bytes "$ROOT/$MODEL")
LINK_BPS=$(rate_bps "$RATE")
export BOX_ENGINE_ARGS="--max-num-seqs 4 --max-model-len 64 --num-gpu-blocks-override 64 --enforce-eager"
export BOX_EMU_MEMORY=3G BOX_CACHE_BUDGET=4GiB

box_network 2 "$RATE"
box_registry "$ROOT" "$MODEL/config.json"
box_coordinator --launch-workers --worker-ports 20000 --worker-port-count 64 --handover "$HANDOVER" \
  --fixed-startup-costs --t-cc 0.1 --t-cu 0.1 --t-l 0.3
box_node 0
box_node 1
box_wait_nodes 2
box_gateway --hold-deadline 120s --upstream-timeout 120s
# An SLO between Alg. 1's predictions for one and two stages (as cold_start.sh's pp2).
SLO=$(awk -v m="$BYTES" -v b="$LINK_BPS" 'BEGIN { printf "%.3f", 0.5 + 1.15 * m * 8 / b / 2 }')
cluster deploy "$MODEL" --size "$BYTES" --layers 8 --ttft "$SLO" >/dev/null

# The phase poller: "t phase stages" lines while the clients run.
(
  while :; do
    cluster state 2>/dev/null | /usr/bin/python3 -c 'import json,sys,time
p = [p for p in json.load(sys.stdin).get("plans", []) if p.get("model") == sys.argv[1]]
if p: print(time.time(), p[0].get("phase"), p[0].get("stages"), flush=True)' "$MODEL" 2>/dev/null || true
    sleep 0.2
  done
) >"$WORK/phases.txt" &
POLLER=$!
defer "kill $POLLER"

log "closed loop: $CLIENTS clients, $SECONDS_ s, through the gateway (handover: $HANDOVER)"
in_ns "$BOX-ctl" /usr/bin/python3 - "$BOX_GATEWAY" "$MODEL" "$CLIENTS" "$SECONDS_" >"$WORK/answers.jsonl" <<'PY'
import http.client, json, sys, threading, time, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1]); model = sys.argv[2]
clients, seconds = int(sys.argv[3]), float(sys.argv[4])
end = time.time() + seconds
lock = threading.Lock()
def loop():
    while time.time() < end:
        t0 = time.time()
        rec = {"t_sent": t0}
        try:
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=150)
            c.request("POST", "/v1/completions", body=json.dumps({"model": model, "prompt": [5, 6, 7, 8],
                      "max_tokens": 16, "ignore_eos": True}), headers={"Content-Type": "application/json"})
            r = c.getresponse(); body = r.read()
            rec["status"] = r.status
            if r.status == 200:
                choice = json.loads(body)["choices"][0]
                rec["tokens"], rec["finish"] = choice["token_ids"], choice.get("finish_reason")
            else:
                rec["error"] = body[:300].decode(errors="replace")
                time.sleep(0.5)
        except Exception as e:
            rec["status"], rec["error"] = 0, str(e)
            time.sleep(0.5)
        rec["t_end"] = time.time()
        with lock:
            print(json.dumps(rec), flush=True)
ts = [threading.Thread(target=loop) for _ in range(clients)]
for t in ts: t.start()
for t in ts: t.join()
PY
kill "$POLLER" 2>/dev/null || true
cluster state >"$WORK/state.json"
echo
echo "== consolidation: $MODEL ($BYTES bytes, 8 layers), 2 nodes at $RATE, handover $HANDOVER, $CLIENTS clients x $SECONDS_ s =="
/usr/bin/python3 - "$WORK/phases.txt" "$WORK/answers.jsonl" <<'PY'
import json, sys
phases = [l.split() for l in open(sys.argv[1]) if l.strip()]
answers = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
def phase_at(t):
    cur = None
    for tp, ph, st in phases:
        if float(tp) <= t: cur = ph
    return cur or "before the plan"
t0 = min(a["t_sent"] for a in answers)
t_last = max(a["t_end"] for a in answers)
starts = []
for tp, ph, st in phases:
    if not starts or starts[-1][1] != ph:
        starts.append((float(tp), ph, st))
ok = [a for a in answers if a.get("status") == 200]
# Each phase's window runs from its first sighting to the next phase's (or the last answer).
# tokens/s: tokens of the answers that ended in the window over its length; latency: of the
# answers sent and ended inside it (a window shorter than one answer has none).
print(f"{'phase':22} {'from':>7} {'for':>7} {'answers ended':>14} {'tokens/s':>9} {'latency (inside)':>17}")
for i, (ts, ph, st) in enumerate(starts):
    te = starts[i + 1][0] if i + 1 < len(starts) else t_last
    if te <= ts: continue
    ended = [a for a in ok if ts <= a["t_end"] < te]
    inside = [a for a in ended if a["t_sent"] >= ts]
    toks = sum(len(a["tokens"]) for a in ended)
    lat = f"{sum(a['t_end'] - a['t_sent'] for a in inside) / len(inside):.3f}s ({len(inside)})" if inside else "-"
    print(f"{ph:22} {ts - t0:6.2f}s {te - ts:6.2f}s {len(ended):14} {toks / (te - ts):9.1f} {lat:>17}")
bad = [a for a in answers if a.get("status") != 200]
answers_ok = {tuple(a["tokens"]) for a in answers if a.get("status") == 200}
print(f"failed requests: {len(bad)}" + (f" (first: {bad[0].get('status')} {bad[0].get('error', '')[:200]})" if bad else ""))
print("every answer's tokens identical" if len(answers_ok) == 1 else f"ANSWERS DIFFER: {len(answers_ok)} variants")
if len(answers_ok) > 1:
    for v in answers_ok:
        which = [a for a in ok if tuple(a["tokens"]) == v]
        print(f"  {len(which)} answer(s), {len(v)} tokens: {list(v)}; finish_reason "
              f"{sorted({str(a.get('finish')) for a in which})}; ended at "
              + ", ".join("%.2f" % (a["t_end"] - t0) for a in which[:5]) + " s")
sys.exit(0 if len(answers_ok) == 1 and not bad else 1)
PY
