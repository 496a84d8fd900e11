#!/bin/bash
# Benchmark 2 of issue 5: goodput over a link shaped to 1 Gbit/s, as a share of the
# shaped rate; thaw-fetch and curl on the same link in one run.
#
# Topology (all in private network namespaces; nothing touches the host's interfaces):
#
#   netns <pfx>r (registry)                       netns <pfx>n (node)
#   nginx 10.77.0.1:8080 -- veth tb<pid>r ====== veth tb<pid>n -- 10.77.0.2, thaw-fetch
#                           egress shaped:
#                           qdisc htb 1: default 10 r2q 1000
#                           class 1:10 htb rate 1gbit ceil 1gbit burst 64k cburst 64k
#                           leaf pfifo limit 1000
#
# Only the registry's egress toward the node is shaped (the ACK direction is not). tc's
# "1gbit" is 10^9 bit/s and HTB counts each frame's bytes from the Ethernet header on, so
# at MTU 1500 the most TCP payload (MSS 1448 with timestamps) the link can carry is
# 1448/1514 = 95.6 % of the shaped rate; stats.py prints both shares.
#
# --thaw-shaping: thaw's own traffic shaper (daemon/network, thawd's [network]) also runs on
# the node's end of the link at the link rate: its BPF classifier on the veth, HTB on egress
# and on the IFB its downloads are redirected to. Nothing else uses the link, so the fetch's
# goodput must not change (issue 26); run with and without to compare.
#
# Usage: bench/store/fetch_shaped.sh [--repeats N] [--rate 1gbit] [--mtu 1500]
#                                    [--with-aria2c] [--thaw-shaping]
#                                    [-- extra thaw-fetch fetch args]
# shellcheck source=bench/store/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REPEATS=3
RATE=1gbit
MTU=1500
CONTENDERS=(thaw curl)
THAW_SHAPING=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --repeats) REPEATS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --mtu) MTU=$2; shift 2 ;;
    --with-aria2c) CONTENDERS+=(aria2c); shift ;;
    --thaw-shaping) THAW_SHAPING=1; shift ;;
    --) shift; THAW_EXTRA_ARGS=("$@"); break ;;
    *) die "unknown argument $1" ;;
  esac
done
RATE_BPS=$(tc_rate_bps "$RATE")

THAW_FETCH_BIN=$(find_thaw_fetch)
ensure_model "$THAW_FETCH_BIN"
log "model: $MODEL_DIR, ${#MODEL_FILES[@]} files, $MODEL_BYTES bytes"

REG_NS="${NS_PREFIX}r"
NODE_NS="${NS_PREFIX}n"
REG_IF="tb$$r"
make_netns "$REG_NS"
make_netns "$NODE_NS"
link_ns "$REG_NS" "$REG_IF" 10.77.0.1 "$NODE_NS" "tb$$n" 10.77.0.2 "$MTU"
shape_egress "$REG_NS" "$REG_IF" "$RATE"
log "shaping: $(tc -n "$REG_NS" class show dev "$REG_IF")"
if ((THAW_SHAPING)); then
  SHAPER="$REPO_ROOT/build/default/daemon/network/thaw-shaper"
  [[ -x $SHAPER ]] || die "thaw-shaper not built: cmake --build --preset default --target thaw-shaper"
  # `ip netns exec` gives the command a mount namespace of its own: the shaper pins into a
  # private bpffs there, never the host's /sys/fs/bpf.
  ip netns exec "$NODE_NS" sh -c 'mount -t bpf bpf /sys/fs/bpf && exec "$0" "$@"' \
    "$SHAPER" "tb$$n" "$((RATE_BPS / 8))" >"$WORK/shaper.log" 2>&1 &
  SHAPER_PID=$!
  defer "kill -INT $SHAPER_PID; sleep 1; kill -KILL $SHAPER_PID"
  for _ in $(seq 50); do grep -q '^shaping ' "$WORK/shaper.log" && break; sleep 0.1; done
  grep -q '^shaping ' "$WORK/shaper.log" || die "thaw-shaper did not start: $(cat "$WORK/shaper.log")"
  log "thaw shaping on the node: $(head -1 "$WORK/shaper.log")"
fi
start_nginx shaped 10.77.0.1:8080 "$REG_NS"
REGISTRY=http://10.77.0.1:8080
make_cache_root
RESULTS="$WORK/results.tsv"
: >"$RESULTS"

n=${#CONTENDERS[@]}
for ((round = 1; round <= REPEATS; round++)); do
  warm_page_cache
  note_load
  for ((i = 0; i < n; i++)); do
    run_contender "${CONTENDERS[(i + round - 1) % n]}" "$round" "$NODE_NS" "$REGISTRY"
  done
done

echo
echo "== shaped link: $MODEL_NAME, $MODEL_BYTES bytes, registry netns -> node netns over veth, HTB $RATE on the registry's egress, MTU $MTU, $REPEATS rounds$( ((THAW_SHAPING)) && echo ", thaw's shaper on the node at the link rate") =="
tc -n "$REG_NS" -s class show dev "$REG_IF" | sed 's/^/  tc: /'
if ((THAW_SHAPING)); then
  tail -8 "$WORK/shaper.log" | sed 's/^/  thaw-shaper: /'
  tc -n "$NODE_NS" -s class show dev "thifb$(ip netns exec "$NODE_NS" cat /sys/class/net/tb$$n/ifindex)" |
    grep -A1 'class htb' | sed 's/^/  tc (node ingress): /' || true
fi
$STATS goodput "$RESULTS" --link-bps "$RATE_BPS" --mtu "$MTU" --link-target 95 \
  --ratio thaw/curl
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
