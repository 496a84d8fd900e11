#!/bin/bash
# thawd with traffic shaping on, end to end (issue 26): registry (nginx) and node in their
# own network namespaces over a veth; thawd in the node's namespace (a private bpffs: `ip
# netns exec` gives it a mount namespace) shapes the veth at --link bytes/s; a Fetch through
# thawctl; then `thawctl --json net`. Passes when shaping is on, the fetched bytes are
# counted in class critical_fetch (the store's SO_MARK, read by the BPF classifier) and
# under the model's name in the per-model counters, and no class dropped a packet. Needs root (CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON) and
# build/default's thawd and thawctl.
#
# Usage: bench/store/fetch_classified.sh [--link 1.25GB] [--no-clamp]
#   --no-clamp  [network] clamp_fetch_windows = false: the kernel's receive windows
# shellcheck source=bench/store/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

LINK=1.25GB
CLAMP=true
while [[ $# -gt 0 ]]; do
  case $1 in
    --link) LINK=$2; shift 2 ;;
    --no-clamp) CLAMP=false; shift ;;
    *) die "unknown argument $1" ;;
  esac
done
B="$REPO_ROOT/build/default"
[[ -x $B/daemon/cli/thawd && -x $B/tools/thawctl/thawctl ]] ||
  die "not built: cmake --build --preset default --target thawd thawctl"
ensure_model "$(find_thaw_fetch)"
make_netns "${NS_PREFIX}r"
make_netns "${NS_PREFIX}n"
NODE_IF="tc$$n"
link_ns "${NS_PREFIX}r" "tc$$r" 10.79.0.1 "${NS_PREFIX}n" "$NODE_IF" 10.79.0.2 1500
REGISTRY=http://10.79.0.1:8080
start_nginx classified 10.79.0.1:8080 "${NS_PREFIX}r"
make_cache_root
dbus-daemon --session --address="unix:path=$WORK/bus" --fork --print-pid >"$WORK/dbus.pid"
defer "kill $(cat "$WORK/dbus.pid")"
cat >"$WORK/thawd.toml" <<TOML
[node]
id = "classified"
state_dir = "$WORK/state"
[store]
cache_dir = "$CACHE_ROOT/cache"
cache_budget = "8GiB"
registry = "$REGISTRY"
[shim]
socket = "$WORK/thawd.sock"
[dbus]
bus = "unix:path=$WORK/bus"
[network]
shaping = true
uplink = "$NODE_IF"
link_rate = "$LINK"
clamp_fetch_windows = $CLAMP
TOML
ip netns exec "${NS_PREFIX}n" sh -c 'mount -t bpf bpf /sys/fs/bpf && exec "$0" --config "$1"' \
  "$B/daemon/cli/thawd" "$WORK/thawd.toml" >"$WORK/thawd.log" 2>&1 &
THAWD=$!
defer "kill -TERM $THAWD; wait $THAWD"
for _ in $(seq 100); do grep -q "ready:" "$WORK/thawd.log" && break; sleep 0.1; done
grep -q "ready:" "$WORK/thawd.log" || die "thawd did not start: $(tail -5 "$WORK/thawd.log")"
log "$(grep 'traffic shaping' "$WORK/thawd.log" | sed 's/.*thawd: [a-z]*: //')"
THAWCTL=("$B/tools/thawctl/thawctl" "--bus=unix:path=$WORK/bus")
t0=$(now)
"${THAWCTL[@]}" fetch "$MODEL_NAME" >/dev/null 2>&1 || die "fetch failed: $(tail -5 "$WORK/thawd.log")"
T=$(elapsed "$t0" "$(now)")
echo
echo "== thawd shaping $NODE_IF at $LINK/s (clamp_fetch_windows = $CLAMP); Fetch of $MODEL_NAME ($MODEL_BYTES bytes) in $T s =="
"${THAWCTL[@]}" net
"${THAWCTL[@]}" --json net >"$WORK/net.json"
/usr/bin/python3 - "$WORK/net.json" "$MODEL_BYTES" <<'PY'
import json, sys
net = json.load(open(sys.argv[1]))
model = int(sys.argv[2])
classes = {c["class"]: c for c in net["classes"]}
crit = classes["critical_fetch"]["ingress"]["bytes"]
drops = sum(c[d]["drops"] for c in net["classes"] for d in ("egress", "ingress"))
# thawd marks each fetched model's sockets with its own id: its bytes, named, in "models".
counted = sum(m["bytes"] for m in net.get("models", []))
names = [m["model"] for m in net.get("models", [])]
ok = net["enabled"] and crit >= model and drops == 0 and len(names) == 1 and counted >= model
print(f"critical_fetch ingress {crit} bytes (the model: {model}; with headers it is more), "
      f"per model {dict(zip(names, (m['bytes'] for m in net.get('models', []))))}, "
      f"drops {drops}: {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
