# shellcheck shell=bash
# Network namespaces, veth pairs and HTB-shaped links: the pieces bench/store/lib.sh and the
# cluster in a box (tools/demo-cluster) both build on. Sourced, not run; needs root, iproute2
# and `defer` from tools/demo/lib.sh (each thing created is deferred at once, so the trap
# there undoes it in reverse order on exit, error or Ctrl-C).

# make_netns NAME: a namespace with lo up, deleted on exit.
make_netns() {
  ip netns add "$1"
  defer "ip netns del '$1'"
  ip -n "$1" link set lo up
}

# link_ns NS_A IF_A ADDR_A NS_B IF_B ADDR_B [MTU]: a veth pair between two namespaces.
# Deleting the namespaces also deletes the pair; the explicit deferral covers a failure
# between creation and the move.
link_ns() {
  local nsa=$1 ifa=$2 addra=$3 nsb=$4 ifb=$5 addrb=$6 mtu=${7:-1500}
  ip link add "$ifa" type veth peer name "$ifb"
  defer "ip link del '$ifa'"
  ip link set "$ifa" netns "$nsa"
  ip link set "$ifb" netns "$nsb"
  ip -n "$nsa" link set "$ifa" mtu "$mtu"
  ip -n "$nsb" link set "$ifb" mtu "$mtu"
  ip -n "$nsa" addr add "$addra/24" dev "$ifa"
  ip -n "$nsb" addr add "$addrb/24" dev "$ifb"
  ip -n "$nsa" link set "$ifa" up
  ip -n "$nsb" link set "$ifb" up
}

# make_switch NS: a namespace holding one bridge, br0 (the cluster's top-of-rack switch).
make_switch() {
  make_netns "$1"
  ip -n "$1" link add br0 type bridge
  ip -n "$1" link set br0 up
}

# plug_ns SWITCH_NS PORT_IF NS IF ADDR [MTU]: a veth from NS (IF, ADDR/24) to a port of the
# switch's br0 (PORT_IF, no address). Created inside the switch namespace, so the host's own
# namespace never holds either end, even for a moment.
plug_ns() {
  local sw=$1 port=$2 netns=$3 dev=$4 addr=$5 mtu=${6:-1500}
  ip -n "$sw" link add "$port" mtu "$mtu" type veth peer name "$dev" netns "$netns" mtu "$mtu"
  ip -n "$sw" link set "$port" master br0
  ip -n "$sw" link set "$port" up
  ip -n "$netns" addr add "$addr/24" dev "$dev"
  ip -n "$netns" link set "$dev" up
}

# shape_egress NS IF RATE: HTB on the egress of IF (inside NS): one class, rate = ceil =
# RATE, burst/cburst SHAPE_BURST, every packet in it (default 10), pfifo leaf.
SHAPE_BURST=${SHAPE_BURST:-64k}
shape_egress() {
  local netns=$1 dev=$2 rate=$3
  tc -n "$netns" qdisc add dev "$dev" root handle 1: htb default 10 r2q 1000
  tc -n "$netns" class add dev "$dev" parent 1: classid 1:10 htb rate "$rate" ceil "$rate" \
    burst "$SHAPE_BURST" cburst "$SHAPE_BURST"
  tc -n "$netns" qdisc add dev "$dev" parent 1:10 handle 10: pfifo limit 1000
}

# kill_netns_pids NS: TERM, then after up to 5 s KILL, every process still in NS.
kill_netns_pids() {
  local pids i
  pids=$(ip netns pids "$1" 2>/dev/null) || return 0
  [[ -n $pids ]] || return 0
  # shellcheck disable=SC2086  # one pid a word
  kill -TERM $pids 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    pids=$(ip netns pids "$1" 2>/dev/null) || return 0
    [[ -n $pids ]] || return 0
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
}
