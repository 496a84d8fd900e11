#!/bin/bash
# ctest cluster.box_reap (root only; 77 = skipped): a box whose script is SIGKILLed — no trap
# runs — leaves namespaces, thawd/dbus/nginx/coordinator/gateway processes and directories
# behind; the next box's start (box_reap_leftovers) must remove all of it, and must leave a
# box whose script still runs alone.
#
# usage: box_reap_test.sh BUILD_DIR
# shellcheck source=tools/demo-cluster/box.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/demo-cluster/box.sh"
BUILD=${1:?usage: $0 BUILD_DIR}
box_check_host 77
SMOKE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/box_smoke_test.sh

# A victim box: the smoke test, in its own session so the kill reaches it alone.
setsid "$SMOKE" "$BUILD" >"$WORK/victim.log" 2>&1 &
VICTIM=$!
defer "kill -KILL $VICTIM 2>/dev/null"
for ((i = 0; i < 200; i++)); do
  # up to its gateway: every kind of process a box runs is there
  [[ -n $(ip netns pids "${BOX_PREFIX}$VICTIM-ctl" 2>/dev/null | sed -n 2p) ]] && break
  kill -0 "$VICTIM" 2>/dev/null || die "the victim box ended early: $(tail -5 "$WORK/victim.log")"
  sleep 0.05
done
before=$(ip netns list | grep -c "^${BOX_PREFIX}$VICTIM-" || true)
((before >= 4)) || die "the victim box has $before namespaces, expected 5"
pids=()
for ns in $(ip netns list | awk -v p="${BOX_PREFIX}$VICTIM-" 'index($1, p) == 1 { print $1 }'); do
  read -r -a more <<<"$(ip netns pids "$ns" | tr '\n' ' ')"
  pids+=("${more[@]}")
done
log "victim box ${BOX_PREFIX}$VICTIM: $before namespaces, ${#pids[@]} processes; SIGKILL its script"
kill -KILL "$VICTIM"
wait "$VICTIM" 2>/dev/null || true
# Its processes and namespaces outlive it (nothing ran its trap).
[[ -n $(box_leftovers "${BOX_PREFIX}$VICTIM") ]] || die "the killed box left nothing: the test shows nothing"

# A live box (this script's: its namespaces) must survive the reap.
make_netns "$BOX-alive"
box_reap_leftovers
left=$(box_leftovers "${BOX_PREFIX}$VICTIM")
for p in "${pids[@]}"; do pid_alive "$p" && left+=$'\n'"process $p $(tr '\0' ' ' <"/proc/$p/cmdline")"; done
[[ -z $left ]] || die "after the reap, the killed box left: $left"
ip netns list | grep -q "^$BOX-alive" || die "the reap removed a live box's namespace"
log "reaped: no namespace, process or directory of the killed box left; the live box kept"
