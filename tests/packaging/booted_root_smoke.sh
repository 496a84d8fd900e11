#!/bin/bash
# The booted-root harness (booted_root.sh) works: a Debian 12 root boots with systemd as
# PID 1, its system bus answers, units start (transient and Type=notify from a unit file),
# journald records, sysusers/tmpfiles snippets copied in are applied, commands run as another
# user, exit statuses come through; and stop leaves no process, mount or directory behind.
# Exits 77 (SKIP) where this machine cannot boot such a root (booted_root.sh says why).
# usage: booted_root_smoke.sh   (as root; THAW_BOOTED_ROOT_CACHE and the like as for booted_root.sh)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
B=$HERE/booted_root.sh

fail() {
  echo "FAIL: $*"
  exit 1
}
[[ $(id -u) -eq 0 ]] || { echo "SKIP: needs root (mounts, systemd-nspawn)"; exit 77; }

base=$(mktemp -d /tmp/thaw-booted-smoke.XXXXXX)
W=$base/c
cleanup() {
  "$B" stop "$W" || echo "stop failed; left: $W"
  rm -rf "$base/files"
  rmdir "$base" 2>/dev/null || true
}
trap cleanup EXIT

t0=$SECONDS
rc=0
"$B" boot "$W" || rc=$?
[[ $rc -eq 0 ]] || exit "$rc" # 77: this machine cannot (the line above says why)
echo "booted in $((SECONDS - t0)) s (prepare included)"
ins() { "$B" exec "$W" -- "$@"; }

state=$(ins systemctl is-system-running) || true
[[ $state == running || $state == degraded ]] || fail "systemctl is-system-running: '$state'"
echo "system: $state"

# The system bus, with systemd and logind on it.
names=$(ins busctl --system list --no-legend) || fail "busctl --system list failed"
for n in org.freedesktop.DBus org.freedesktop.systemd1 org.freedesktop.login1; do
  grep -q "^$n " <<<"$names" || fail "$n is not on the system bus: $names"
done
ins busctl --system get-property org.freedesktop.systemd1 /org/freedesktop/systemd1 \
  org.freedesktop.systemd1.Manager Version | grep -q '^s "252' || fail "systemd1.Manager.Version over D-Bus"
echo "system bus: DBus, systemd1, login1"

# Exit statuses come through, as root and as another user.
rc=0
ins sh -c 'exit 7' || rc=$?
[[ $rc -eq 7 ]] || fail "exec: exit status 7 came back as $rc"
[[ $("$B" exec --user nobody "$W" -- id -un) == nobody ]] || fail "exec --user nobody"

# Transient units: one that succeeds, one that fails, one that keeps running.
ins systemd-run --wait -q true || fail "systemd-run --wait true"
if ins systemd-run --wait -q false; then fail "systemd-run --wait false succeeded"; fi
ins systemd-run -q --unit=thaw-smoke-sleep sleep 600 || fail "systemd-run sleep"
[[ $(ins systemctl is-active thaw-smoke-sleep.service) == active ]] || fail "thaw-smoke-sleep not active"
ins systemctl stop thaw-smoke-sleep.service
echo "transient units: started, failed, stopped"

# Files copied in: a sysusers and a tmpfiles snippet, and a Type=notify service.
mkdir -p "$base/files"
cat >"$base/files/thaw-smoke-sysusers.conf" <<'EOF'
u thaw-smoke - "thaw smoke test" /var/lib/thaw-smoke
EOF
cat >"$base/files/thaw-smoke-tmpfiles.conf" <<'EOF'
d /run/thaw-smoke 0750 thaw-smoke thaw-smoke -
EOF
cat >"$base/files/thaw-smoke.service" <<'EOF'
[Unit]
Description=thaw smoke test: a Type=notify service under a system user
[Service]
Type=notify
NotifyAccess=all
User=thaw-smoke
RuntimeDirectory=thaw-smoke-svc
ExecStart=/bin/sh -c 'echo thaw-smoke-started; systemd-notify --ready; exec sleep infinity'
EOF
"$B" copy-in "$W" "$base/files/thaw-smoke-sysusers.conf" /usr/lib/sysusers.d/thaw-smoke.conf
"$B" copy-in "$W" "$base/files/thaw-smoke-tmpfiles.conf" /usr/lib/tmpfiles.d/thaw-smoke.conf
"$B" copy-in "$W" "$base/files/thaw-smoke.service" /etc/systemd/system/
"$B" copy-in "$W" "$base/files" /root/ # a directory too
ins test -f /root/files/thaw-smoke.service || fail "copy-in of a directory"
[[ $(ins stat -c %U /etc/systemd/system/thaw-smoke.service) == root ]] || fail "copy-in: not owned by root"

ins systemd-sysusers
ins getent passwd thaw-smoke >/dev/null || fail "systemd-sysusers did not create thaw-smoke"
ins systemd-tmpfiles --create /usr/lib/tmpfiles.d/thaw-smoke.conf
[[ $(ins stat -c '%U %a' /run/thaw-smoke) == "thaw-smoke 750" ]] ||
  fail "systemd-tmpfiles: /run/thaw-smoke is '$(ins stat -c '%U %a' /run/thaw-smoke)'"
"$B" exec --user thaw-smoke "$W" -- touch /run/thaw-smoke/x || fail "thaw-smoke cannot write its directory"
if "$B" exec --user nobody "$W" -- touch /run/thaw-smoke/y 2>/dev/null; then
  fail "nobody could write into /run/thaw-smoke"
fi
echo "sysusers, tmpfiles: applied"

ins systemctl daemon-reload
ins timeout 30 systemctl start thaw-smoke.service || fail "thaw-smoke.service did not start"
[[ $(ins systemctl show -P MainPID thaw-smoke.service) != 0 ]] || fail "thaw-smoke.service has no MainPID"
[[ $(ins stat -c %U /run/thaw-smoke-svc) == thaw-smoke ]] || fail "RuntimeDirectory= not owned by thaw-smoke"

# journald records: the service's stdout, and a line sent by systemd-cat.
ins systemd-cat -t thaw-smoke-tag echo thaw-smoke-journal-line
found=0
for _ in $(seq 50); do
  if ins journalctl -q -o cat -t thaw-smoke-tag | grep -q thaw-smoke-journal-line &&
    ins journalctl -q -o cat -u thaw-smoke.service | grep -q thaw-smoke-started; then
    found=1
    break
  fi
  sleep 0.2
done
[[ $found -eq 1 ]] || fail "journald does not have the lines: $(ins journalctl -q --no-pager | tail -n 20)"
echo "journal: $(ins journalctl -q -o cat | wc -l) lines, ours among them"
ins systemctl stop thaw-smoke.service

# stop leaves nothing: no process of the container, no mount, no directory.
pidns=$(<"$W/pidns")
npid=$(<"$W/nspawn.pid")
t1=$SECONDS
"$B" stop "$W" || fail "stop failed"
echo "stopped in $((SECONDS - t1)) s"
[[ ! -e $W ]] || fail "stop left $W"
if findmnt -rn -o TARGET | grep -qF "$W"; then fail "mounts left: $(findmnt -rn -o TARGET | grep -F "$W")"; fi
# (A zombie is fine: the nspawn process was orphaned when boot returned, and the host's
# PID 1 reaps it in its own time.)
if [[ -r /proc/$npid/stat ]] && ! awk '{ exit $3 != "Z" }' "/proc/$npid/stat" 2>/dev/null; then
  fail "systemd-nspawn (pid $npid) still runs"
fi
for p in /proc/[0-9]*; do
  [[ $(readlink "$p/ns/pid" 2>/dev/null) != "$pidns" ]] || fail "process ${p#/proc/} of the container remains"
done
"$B" stop "$W" || fail "a second stop is not a no-op"
echo "PASS in $((SECONDS - t0)) s"
