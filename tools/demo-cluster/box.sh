# shellcheck shell=bash
# The cluster in a box (issue 25): N thawd nodes, each in its own network namespace with an
# emulated GPU, behind one switch; a registry namespace with nginx; a control namespace with
# thaw-coordinator and thaw-gateway. Sourced by tools/demo-cluster/run-demo-cluster.sh and
# tests/cluster/box_smoke_test.sh, not run. Needs root (namespaces, tc).
#
#   netns BOX-reg   nginx 10.211.0.2:8080 ─┐
#   netns BOX-ctl   coordinator, gateway ──┤ 10.211.0.3        netns BOX-sw: bridge br0
#   netns BOX-nI    thawd, dbus-daemon, ───┤ 10.211.0.(10+I)   (one veth port each)
#                   its workers            │  HTB RATE on both directions of every node link
#
# Only node links are shaped (the paper's bottleneck is each server's NIC; the registry and
# the control plane are not). Addresses are private to the box's namespaces, so two boxes
# never collide. Every namespace is named BOX-*, BOX = thawcb<pid of the script>: the reap
# step at start deletes boxes whose script is gone (a crash, a SIGKILL) with every process in
# them, their work directories and caches.
BOX_PREFIX=thawcb
BOX=$BOX_PREFIX$$
# (tools/demo/lib.sh makes WORK, /tmp/BOX.XXXXXX: the reap step finds it by that name.)
# shellcheck source=tools/demo/lib.sh
THAW_WORK_PREFIX=$BOX TMPDIR=/tmp source "$(dirname "${BASH_SOURCE[0]}")/../demo/lib.sh"
# shellcheck source=tools/demo-cluster/netns.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns.sh"

BOX_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BOX_WORK=$WORK
BOX_WORKER_COMMAND=${BOX_WORKER_COMMAND:-}
BOX_SUBNET=10.211.0
BOX_REG_ADDR=$BOX_SUBNET.2
BOX_CTL_ADDR=$BOX_SUBNET.3
BOX_REG_PORT=8080
BOX_NODES_PORT=5570
BOX_GATEWAY_PORT=8000
node_addr() { printf '%s.%d\n' "$BOX_SUBNET" $((10 + $1)); }
in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

# rate_bps 1gbit -> 1000000000 (tc's units: kbit/mbit/gbit are powers of 1000).
rate_bps() {
  awk -v r="$1" 'BEGIN {
    if (!match(r, /^[0-9.]+/)) exit 1
    v = substr(r, 1, RLENGTH); u = substr(r, RLENGTH + 1)
    m = (u == "bit") ? 1 : (u == "kbit") ? 1e3 : (u == "mbit") ? 1e6 : (u == "gbit") ? 1e9 : -1
    if (m < 0) exit 1
    printf "%.0f\n", v * m }' || die "rate $1: want a tc rate such as 1gbit or 250mbit"
}

# box_check_host: root, iproute2, tc, nginx, dbus-daemon, the bridge and veth drivers. Exits
# 77 (ctest's skip) with the reason when the machine cannot hold a box.
box_check_host() {
  local skip=${1:-77}
  if [[ $(id -u) -ne 0 ]]; then log "skip: the cluster box needs root (network namespaces, tc)"; exit "$skip"; fi
  local t
  for t in ip tc /usr/sbin/nginx dbus-daemon curl; do
    command -v "$t" >/dev/null || { log "skip: $t is not installed (scripts/install-deps)"; exit "$skip"; }
  done
  if ! ip netns add "${BOX}-probe" 2>/dev/null; then
    log "skip: cannot create a network namespace here (ip netns add failed)"
    exit "$skip"
  fi
  local ok=1
  ip -n "${BOX}-probe" link add br0 type bridge 2>/dev/null || ok=0
  ip -n "${BOX}-probe" link add v0 type veth peer name v1 2>/dev/null || ok=0
  ip netns del "${BOX}-probe"
  ((ok)) || { log "skip: no bridge or veth support in this kernel"; exit "$skip"; }
}

# box_reap_leftovers: boxes (namespaces BOX_PREFIX<pid>-*) whose script no longer runs: every
# process in them is killed, the namespaces deleted (their veths and qdiscs go with them),
# their work directories and caches removed. Boxes of running scripts are left alone.
box_reap_leftovers() {
  local ns pid reaped=()
  while read -r ns _; do
    [[ $ns =~ ^${BOX_PREFIX}([0-9]+)- ]] || continue
    pid=${BASH_REMATCH[1]}
    [[ $pid == "$$" ]] && continue
    if kill -0 "$pid" 2>/dev/null && grep -qa 'box\|cluster' "/proc/$pid/cmdline" 2>/dev/null; then
      continue  # a live box
    fi
    kill_netns_pids "$ns"
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
    reaped+=("$ns")
    rm -rf "/tmp/${BOX_PREFIX}${pid}".* "/dev/shm/${BOX_PREFIX}${pid}".* 2>/dev/null || true
  done < <(ip netns list 2>/dev/null)
  ((${#reaped[@]} == 0)) || log "reaped a crashed box's leftovers: ${reaped[*]}"
}

# box_leftovers [BOX]: prints what a box left behind (namespaces, processes, directories);
# empty output = clean. The smoke test checks it after teardown.
box_leftovers() {
  local box=${1:-$BOX}
  ip netns list 2>/dev/null | awk -v p="$box-" 'index($1, p) == 1 { print "netns " $1 }'
  # shellcheck disable=SC2012  # names are ours, no odd characters
  ls -d "/tmp/$box".* "/dev/shm/$box".* "/etc/netns/$box"-* 2>/dev/null | sed 's/^/dir /' || true
  local p
  for p in "${BOX_PIDS[@]}"; do
    pid_alive "$p" && echo "process $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"
  done
  return 0
}
# pid_alive PID: running, not a zombie waiting for its reaper (kill -0 succeeds on those).
pid_alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}
BOX_PIDS=()

# box_spawn NS LOG CMD...: CMD in NS, in the background, stopped (TERM, then KILL) on exit.
# Sets SPAWNED (its pid: `ip netns exec` execs CMD, so it is CMD's).
box_spawn() {
  local ns=$1 logf=$2
  shift 2
  ip netns exec "$ns" "$@" >"$logf" 2>&1 &
  SPAWNED=$!
  BOX_PIDS+=("$SPAWNED")
  defer "box_stop $SPAWNED"
}
box_stop() {
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return 0; }
    sleep 0.05
  done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null || true
}

# box_network N RATE: the switch, registry, control and N node namespaces; node links shaped
# to RATE (tc units: 1gbit, 250mbit) in both directions.
box_network() {
  local n=$1 rate=$2 i
  make_switch "$BOX-sw"
  defer "kill_netns_pids '$BOX-sw'"
  make_netns "$BOX-reg"
  defer "kill_netns_pids '$BOX-reg'"
  plug_ns "$BOX-sw" preg "$BOX-reg" eth0 "$BOX_REG_ADDR"
  make_netns "$BOX-ctl"
  defer "kill_netns_pids '$BOX-ctl'"
  plug_ns "$BOX-sw" pctl "$BOX-ctl" eth0 "$BOX_CTL_ADDR"
  for ((i = 0; i < n; i++)); do
    make_netns "$BOX-n$i"
    defer "kill_netns_pids '$BOX-n$i'"
    plug_ns "$BOX-sw" "pn$i" "$BOX-n$i" eth0 "$(node_addr "$i")"
    shape_egress "$BOX-n$i" eth0 "$rate"    # the node's uplink
    shape_egress "$BOX-sw" "pn$i" "$rate"   # its downlink: what a stage's fetch crosses
  done
  # Names inside the box (`ip netns exec` mounts /etc/netns/NS/hosts on /etc/hosts): nodes by
  # their ids, so a worker URL built from a node id (the coordinator's fallback when a node
  # reports no worker_host) reaches it too.
  local ns hosts="127.0.0.1 localhost
$BOX_REG_ADDR registry
$BOX_CTL_ADDR control"
  for ((i = 0; i < n; i++)); do hosts+=$'\n'"$(node_addr "$i") n$i"; done
  for ns in "$BOX-ctl" "$BOX-reg" $(for ((i = 0; i < n; i++)); do echo "$BOX-n$i"; done); do
    mkdir -p "/etc/netns/$ns"
    defer "rm -rf '/etc/netns/$ns'"
    printf '%s\n' "$hosts" >"/etc/netns/$ns/hosts"
  done
  log "box $BOX: switch, registry $BOX_REG_ADDR, control $BOX_CTL_ADDR, $n nodes at $rate each way"
}

# box_registry ROOT PROBE: nginx in BOX-reg serving ROOT; PROBE must answer (a file path).
box_registry() {
  local root=$1 probe=$2 dir="$BOX_WORK/nginx" i
  mkdir -p "$dir"
  write_nginx_conf "$dir" "$root" "$BOX_REG_ADDR:$BOX_REG_PORT"
  box_spawn "$BOX-reg" "$dir/stderr" /usr/sbin/nginx -c "$dir/nginx.conf" -g 'daemon off;'
  BOX_REGISTRY=http://$BOX_REG_ADDR:$BOX_REG_PORT
  for ((i = 0; i < 100; i++)); do
    in_ns "$BOX-ctl" curl -sf -o /dev/null "$BOX_REGISTRY/$probe" && return 0
    sleep 0.1
  done
  die "the box's nginx does not serve $BOX_REGISTRY/$probe: $(cat "$dir/stderr" "$dir/error.log" 2>/dev/null)"
}

# box_coordinator [ARGS...]: keys, then thaw-coordinator serve in BOX-ctl with the nodes'
# endpoint on the box network and the frontend on an ipc:// socket (a file: reachable from
# every namespace, thawctl included). Sets BOX_FRONTEND.
box_coordinator() {
  local dir="$BOX_WORK/coordinator"
  mkdir -p "$dir/nodes.d"
  "$COORDINATOR_BIN" keygen "$dir/coordinator" >/dev/null
  BOX_FRONTEND=ipc://$dir/frontend.sock
  BOX_COORDINATOR_ARGS=("$@")
  box_coordinator_start coordinator.log
}
# box_coordinator_start [LOG]: (re)starts thaw-coordinator with the keys and arguments of
# box_coordinator (a restart keeps the nodes' allow-list and the endpoints); its log goes to
# coordinator/LOG (default coordinator.log).
box_coordinator_start() {
  local dir="$BOX_WORK/coordinator" i logf=${1:-coordinator.log}
  box_spawn "$BOX-ctl" "$dir/$logf" "$COORDINATOR_BIN" serve \
    --nodes "tcp://$BOX_CTL_ADDR:$BOX_NODES_PORT" --frontend "$BOX_FRONTEND" \
    --key "$dir/coordinator.key" --allow "$dir/nodes.d" --heartbeat 250ms --liveness 8 \
    "${BOX_COORDINATOR_ARGS[@]}"
  BOX_COORDINATOR_PID=$SPAWNED
  for ((i = 0; i < 100; i++)); do
    cluster state >/dev/null 2>&1 && break
    kill -0 "$BOX_COORDINATOR_PID" 2>/dev/null || break
    sleep 0.1
  done
  cluster state >/dev/null 2>&1 && return 0
  die "thaw-coordinator did not come up: $(tail -5 "$dir/$logf")"
}
# cluster ARGS...: thawctl --json cluster against the box's coordinator.
cluster() { "$THAWCTL_BIN" --json cluster --coordinator "$BOX_FRONTEND" --timeout 5 "$@"; }

# box_node I: node I's private dbus-daemon, thawd.toml and thawd (key admitted by the
# coordinator). Workers are the agent's children, so they run in the node's namespace.
# Environment read: BOX_EMU_MEMORY, BOX_LINK_BYTES (the node's link in bytes/s, for Alg. 1),
# BOX_WORKER_COMMAND (a TOML array; default: worker.sh with every placeholder), BOX_ENGINE_ARGS.
box_node() {
  local i=$1 ns="$BOX-n$1" id="n$1" dir="$BOX_WORK/n$1" t
  mkdir -p "$dir"
  cat >"$dir/bus.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>custom</type><listen>unix:path=$dir/bus</listen><auth>EXTERNAL</auth>
<policy context="default"><allow user="*"/><allow own="org.thaw.Node1"/>
<allow send_destination="*"/><allow receive_sender="*"/></policy></busconfig>
CONF
  box_spawn "$ns" "$dir/dbus.log" dbus-daemon --nofork --nopidfile --config-file="$dir/bus.conf"
  for ((t = 0; t < 100; t++)); do [[ -S $dir/bus ]] && break; sleep 0.05; done
  [[ -S $dir/bus ]] || die "node $id: dbus-daemon did not start: $(cat "$dir/dbus.log")"
  "$COORDINATOR_BIN" keygen "$dir/node" >/dev/null
  cp "$dir/node.pub" "$BOX_WORK/coordinator/nodes.d/$id.pub"
  local cache
  cache=$(mktemp -d "/dev/shm/$BOX.cache-$id.XXXXXX")
  defer "rm -rf '$cache'"
  mkdir -p "$dir/emu"
  # (not a ${:-} default: the placeholders' braces would end it)
  local command=$BOX_WORKER_COMMAND
  [[ -n $command ]] || command='["/bin/bash", "'$BOX_LIB_DIR'/worker.sh", "{model}", "{port}", "{pp_rank}", "{pp_size}", "{peers}", "{timeline}"]'
  cat >"$dir/thawd.toml" <<TOML
[node]
id = "$id"
state_dir = "$dir/state"
[store]
cache_dir = "$cache"
cache_budget = "${BOX_CACHE_BUDGET:-2GiB}"
registry = "$BOX_REGISTRY"
[gpu]
pool_share = ${BOX_POOL_SHARE:-0.3}
[shim]
socket = "$dir/thawd.sock"
[dbus]
bus = "unix:path=$dir/bus"
[coordinator]
endpoint = "tcp://$BOX_CTL_ADDR:$BOX_NODES_PORT"
server_key = "$BOX_WORK/coordinator/coordinator.pub"
key = "$dir/node.key"
network = "${BOX_LINK_BYTES:-125MB}"
pcie = "16GB"
worker_host = "$(node_addr "$i")"
worker_preload = "$PRELOAD"
worker_command = $command
[network]
shaping = false
TOML
  "$THAWD_BIN" --config "$dir/thawd.toml" --check-config >/dev/null 2>"$dir/check.log" ||
    die "thawd rejects node $id's configuration: $(cat "$dir/check.log")"
  # A machine booted with systemd would make thawd launch workers as transient units, which
  # run in the host's namespace, not the node's: hide systemd from thawd.
  local -a wrap=()
  if [[ -d /run/systemd/system ]]; then
    wrap=(unshare --mount --propagation private sh -c 'mount -t tmpfs none /run/systemd && exec "$@"' thawd)
  fi
  box_spawn "$ns" "$dir/thawd.log" env \
    THAW_LIBCUDA="$LIBCUDA" REFENGINE_LIBCUDA="$LIBCUDA" THAW_EMU_KERNELS="$TWINS" \
    THAW_EMU_DEVICE_MEMORY="${BOX_EMU_MEMORY:-2G}" THAW_EMU_STATE_DIR="$dir/emu" THAW_EMU_TIMING=1 \
    THAW_EMU_PCIE_GBPS="${BOX_PCIE_GBPS:-0.25}" THAW_EMU_D2D_GBPS=20 \
    BOX_NODE_BUS="unix:path=$dir/bus" BOX_NODE_CACHE="$cache" BOX_NODE_DIR="$dir" \
    BOX_THAWCTL="$THAWCTL_BIN" BOX_REFENGINE="$REFENGINE" BOX_ENGINE_ARGS="${BOX_ENGINE_ARGS:-}" no_proxy='*' \
    "${wrap[@]}" "$THAWD_BIN" --config "$dir/thawd.toml"
  for ((t = 0; t < 400; t++)); do
    [[ -S $dir/thawd.sock ]] && "$THAWCTL_BIN" --bus="unix:path=$dir/bus" status >/dev/null 2>&1 && return 0
    kill -0 "$SPAWNED" 2>/dev/null || break
    sleep 0.05
  done
  die "node $id: thawd did not come up: $(tail -5 "$dir/thawd.log")"
}

# box_wait_nodes N: until the coordinator lists N live nodes (30 s).
box_wait_nodes() {
  local want=$1 t alive
  for ((t = 0; t < 300; t++)); do
    alive=$(cluster state 2>/dev/null | /usr/bin/python3 -c 'import json,sys
print(sum(1 for n in json.load(sys.stdin).get("nodes", []) if n.get("alive")))' 2>/dev/null || echo 0)
    ((alive >= want)) && return 0
    sleep 0.1
  done
  die "the coordinator sees $alive of $want nodes alive: $(tail -5 "$BOX_WORK/coordinator/coordinator.log")"
}

# box_gateway [ARGS...]: thaw-gateway in BOX-ctl on BOX_CTL_ADDR:BOX_GATEWAY_PORT, routed by
# the coordinator. Sets BOX_GATEWAY (its base URL; reach it with in_ns "$BOX-ctl").
box_gateway() {
  local dir="$BOX_WORK/gateway" t
  mkdir -p "$dir"
  BOX_GATEWAY=http://$BOX_CTL_ADDR:$BOX_GATEWAY_PORT
  box_spawn "$BOX-ctl" "$dir/gateway.log" env no_proxy='*' "$GATEWAY_BIN" \
    --listen "$BOX_CTL_ADDR:$BOX_GATEWAY_PORT" --coordinator "$BOX_FRONTEND" "$@"
  for ((t = 0; t < 100; t++)); do
    in_ns "$BOX-ctl" curl -sf -o /dev/null "$BOX_GATEWAY/v1/models" && return 0
    kill -0 "$SPAWNED" 2>/dev/null || break
    sleep 0.1
  done
  die "thaw-gateway did not come up: $(tail -5 "$dir/gateway.log")"
}

# box_binaries BUILD: the binaries a box runs, from a build tree.
box_binaries() {
  local b=$1 f
  THAWD_BIN=$b/daemon/cli/thawd
  THAWCTL_BIN=$b/tools/thawctl/thawctl
  COORDINATOR_BIN=$b/coordinator/thaw-coordinator
  GATEWAY_BIN=$b/gateway/thaw-gateway
  GENMODEL=$b/tools/genmodel/thaw-genmodel
  THAW_FETCH_BIN=$b/tools/thaw-fetch/thaw-fetch
  REFENGINE=$b/tools/refengine/refengine
  PRELOAD=$b/preload/libthaw-preload.so
  LIBCUDA=$b/emu/libcuda.so.1
  TWINS=$b/tools/refengine/librefengine_kernels_twins.so
  for f in "$THAWD_BIN" "$THAWCTL_BIN" "$COORDINATOR_BIN" "$GATEWAY_BIN" "$GENMODEL" \
    "$THAW_FETCH_BIN" "$REFENGINE" "$PRELOAD" "$LIBCUDA" "$TWINS"; do
    [[ -e $f ]] || die "$f is not built (cmake --build --preset default)"
  done
}

# box_publish_model ROOT NAME GENMODEL_FLAGS...: a synthetic model generated and published
# (thaw-fetch publish) into ROOT/NAME once; reused while its manifest is there.
box_publish_model() {
  local root=$1 name=$2 new
  shift 2
  [[ -f $root/$name/thaw-manifest.json ]] && return 0
  log "generating model $name ($*)"
  # Written aside and renamed into place: a concurrent box (ctest -j) never sees half of it.
  # (A box killed while writing leaves its aside directory: gone after 10 minutes.)
  find "$root" -maxdepth 1 -name ".$name.*" -mmin +10 -exec rm -rf {} + 2>/dev/null || true
  new=$(mktemp -d "$root/.$name.XXXXXX")
  defer "rm -rf '$new'"
  "$GENMODEL" --size custom "$@" --shard-size 200MB --out "$new/$name" --quiet >/dev/null
  "$THAW_FETCH_BIN" publish --chunk-size 1MiB --quiet "$new/$name"
  chmod 755 "$new/$name"
  mv -T "$new/$name" "$root/$name" 2>/dev/null || true  # a concurrent box may have won
  [[ -f $root/$name/thaw-manifest.json ]] || die "model $name: not published in $root"
}
model_bytes() {  # model_bytes DIR: the weight files' bytes (the manifest excluded)
  find "$1" -maxdepth 1 -type f ! -name thaw-manifest.json -printf '%s\n' | awk '{s += $1} END {print s}'
}
