#!/usr/bin/env bash
# The Debian packages, installed and used the way an operator does, in a Debian 12 root booted
# with systemd as PID 1 (booted_root.sh): apt install → systemctl enable --now thawd (READY=1)
# → busctl as an unprivileged user and as a member of group thaw → thawctl fetch / prewarm /
# slots → the reference engine under LD_PRELOAD=libthaw-preload.so (by name) gets its weights
# from thawd's slot → a worker unit (thaw-worker-*) left running is adopted by the restarted
# thawd → systemctl reload → systemctl stop gives the GPU memory back →
# thaw-gateway.service (a dynamic user; an API key, certificate and TLS key as credentials)
# answers /health over HTTPS, 401 and a JSON 404 → apt purge leaves nothing behind (a diff of the root, users, groups and units
# before and after).
#
#   package_boot_test.sh --debs DIR --build DIR [--keep]
#     --debs   where thaw_*.deb, thaw-emulator_*.deb, thaw-coordinator_*.deb, thaw-gateway_*.deb
#              and thaw-dev_*.deb are (make deb: build/deb)
#     --build  a development build (the reference engine, its kernels' CPU twins and
#              thaw-genmodel come from there: they are not packaged)
#     --keep   leave the container running at the end (its work dir is printed)
# Root only; exits 77 with "SKIP: reason" where the machine cannot boot a container.
# `make test-packaging` builds the packages and runs this.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
B=$here/booted_root.sh
debs="" build="" keep=0
while (($#)); do
  case $1 in
    --debs) debs=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "package_boot_test.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
[[ -n $debs && -n $build ]] || { echo "package_boot_test.sh: needs --debs DIR and --build DIR" >&2; exit 2; }
((EUID == 0)) || { echo "SKIP: needs root (a container with systemd as PID 1)"; exit 77; }
shopt -s nullglob
thaw_deb=("$debs"/thaw_*.deb)
emu_deb=("$debs"/thaw-emulator_*.deb)
coord_deb=("$debs"/thaw-coordinator_*.deb)
gateway_deb=("$debs"/thaw-gateway_*.deb)
dev_deb=("$debs"/thaw-dev_*.deb)
((${#thaw_deb[@]} == 1 && ${#emu_deb[@]} == 1 && ${#coord_deb[@]} == 1 && ${#gateway_deb[@]} == 1 && ${#dev_deb[@]} == 1)) ||
  { echo "package_boot_test.sh: not exactly one each of thaw_*.deb, thaw-emulator_*.deb, thaw-coordinator_*.deb, thaw-gateway_*.deb and thaw-dev_*.deb in $debs (make deb)" >&2; exit 2; }
REFENGINE=$build/tools/refengine/refengine
TWINS=$build/tools/refengine/librefengine_kernels_twins.so
GENMODEL=$build/tools/genmodel/thaw-genmodel
for f in "$REFENGINE" "$TWINS" "$GENMODEL"; do
  [[ -e $f ]] || { echo "package_boot_test.sh: $f missing (build the default preset first)" >&2; exit 2; }
done

T=$(mktemp -d /tmp/thaw-package-boot.XXXXXX)
W=$T/c
started=$SECONDS
step=0
cleanup() {
  if ((keep)); then
    echo "# --keep: the container is still running: $B exec $W -- bash; $B stop $W"
  else
    "$B" stop "$W" >/dev/null 2>&1
    rm -rf "$T"
  fi
}
trap cleanup EXIT
inside() { "$B" exec "$W" -- "$@"; }
as() { local user=$1; shift; "$B" exec --user "$user" "$W" -- "$@"; }
ok() { step=$((step + 1)); printf 'ok %d - %s (%ds)\n' "$step" "$1" $((SECONDS - started)); }
fail() {
  step=$((step + 1))
  printf 'not ok %d - %s\n' "$step" "$1"
  shift
  (($#)) && printf '#   %s\n' "$@"
  echo "# thawd's journal (last 30 lines):"
  inside journalctl -u thawd --no-pager -o cat 2>/dev/null | awk '!seen[$0]++' | tail -30 | sed 's/^/#   /'
  exit 1
}
# journal_line REGEX: the first line of thawd's journal matching REGEX, waiting up to 5 s for it
# (journald takes thawd's stdout asynchronously).
journal_line() {
  local line
  for _ in $(seq 50); do
    line=$(inside journalctl -u thawd --no-pager -o cat | grep -m1 -E "$1") && { echo "$line"; return 0; }
    sleep 0.1
  done
  return 1
}
# expect DESCRIPTION COMMAND...: the command succeeds inside (its output shown on failure).
expect() {
  local what=$1 out
  shift
  out=$("$@" 2>&1) || fail "$what" "$* failed:" "$(tail -15 <<<"$out")"
  ok "$what"
}
# A listing of what is installed: files (path, type+mode, owner, group) outside the
# package manager's own bookkeeping, users, groups, unit files. /var/lib/dpkg and apt's
# caches and logs change with any install; dpkg's own state is checked with dpkg -l instead.
snapshot() {
  inside sh -c '
    find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /tmp -o -path /var/tmp \
      -o -path /var/log -o -path /var/cache/apt -o -path /var/lib/apt -o -path /var/lib/dpkg \
      -o -path /var/cache/debconf -o -path /var/cache/ldconfig -o -path /etc/ld.so.cache \
      -o -path "/etc/*-" \) -prune -o -printf "file %p %M %u %g\n" | sort
    getent passwd | cut -d: -f1,3,4,6,7 | sed "s/^/user /" | sort
    getent group | cut -d: -f1,3,4 | sed "s/^/group /" | sort
    systemctl list-unit-files --no-legend --no-pager | sed "s/^/unit /" | sort
    dpkg-query -W -f "package \${Package} \${db:Status-Abbrev}\n" "thaw*" 2>/dev/null | grep -v " un *$"
    true'
}

# -------------------------------------------------------------------------------- boot
echo "# booting a Debian 12 root with systemd as PID 1"
"$B" boot --nspawn-arg --capability=CAP_BPF,CAP_PERFMON,CAP_NET_ADMIN,CAP_IPC_LOCK "$W" >"$T/boot.log" 2>&1
rc=$?
if ((rc == 77)); then grep '^SKIP' "$T/boot.log" || echo "SKIP: $(tail -1 "$T/boot.log")"; exit 77; fi
((rc == 0)) || { cat "$T/boot.log"; fail "the container boots"; }
ok "a Debian 12 root boots with systemd as PID 1 ($(inside systemctl is-system-running))"

# What the test brings that is not packaged: a model published as a registry, the reference
# engine. In place before the first snapshot, so they are not counted as leftovers.
mkdir -p "$T/in/registry" "$T/in/engine"
"$GENMODEL" --size custom --layers 2 --embd 128 --heads 4 --vocab 1024 --positions 64 \
  --dtype f16 --out "$T/in/registry/tiny" --quiet >/dev/null ||
  fail "thaw-genmodel makes the test model"
cp "${thaw_deb[0]}" "${emu_deb[0]}" "${coord_deb[0]}" "${gateway_deb[0]}" "${dev_deb[0]}" "$T/in/"
cp "$REFENGINE" "$TWINS" "$T/in/engine/"
# The gateway's TLS certificate (the root has no openssl CLI).
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$T/in/gateway.key" -out "$T/in/gateway.crt" \
  >/dev/null 2>&1 || fail "openssl makes a certificate for the gateway"
expect "the packages, a model and the reference engine are copied in" \
  "$B" copy-in "$W" "$T/in" /srv/thaw-test
inside sh -c 'chmod -R a+rX /srv/thaw-test' || fail "chmod /srv/thaw-test"
snapshot >"$T/before.txt" || fail "listing the root before the install"

# ------------------------------------------------------------------------------ install
debs_in=(/srv/thaw-test/"$(basename "${thaw_deb[0]}")" /srv/thaw-test/"$(basename "${emu_deb[0]}")"
  /srv/thaw-test/"$(basename "${coord_deb[0]}")" /srv/thaw-test/"$(basename "${gateway_deb[0]}")"
  /srv/thaw-test/"$(basename "${dev_deb[0]}")")
expect "apt install ./thaw_*.deb ./thaw-emulator_*.deb ./thaw-coordinator_*.deb ./thaw-gateway_*.deb ./thaw-dev_*.deb" \
  inside env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${debs_in[@]}"
[[ $(inside getent group thaw) == thaw:* ]] || fail "the install creates group thaw (sysusers)"
ok "group thaw exists"
for f in /usr/bin/thawd /usr/bin/thawctl /usr/bin/thaw-fetch /usr/lib/x86_64-linux-gnu/libthaw-preload.so \
  /usr/share/dbus-1/system.d/org.thaw.Node1.conf /usr/share/dbus-1/interfaces/org.thaw.Node1.Manager.xml \
  /etc/thaw/thawd.toml /usr/share/man/man8/thawd.8.gz /usr/share/man/man5/thawd.toml.5.gz \
  /usr/share/bash-completion/completions/thawctl /usr/include/thaw/thaw_restore.h \
  /usr/bin/thaw-gateway /etc/thaw/gateway.env /usr/share/man/man8/thaw-gateway.8.gz; do
  inside test -e "$f" || fail "the thaw package installs $f"
done
ok "programs, preload library (multiarch dir), bus policy, interfaces, conffile, man pages, completion, restore ABI header installed"
# The units' exposure as systemd itself rates it (the issue's bar: 4.5 at most).
for unit in thawd.service thaw-coordinator.service thaw-gateway.service; do
  level=$(inside systemd-analyze security --no-pager "$unit" 2>&1 | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
  [[ -n $level ]] || fail "systemd-analyze security $unit" "$(inside systemd-analyze security --no-pager "$unit" 2>&1 | tail -3)"
  awk -v l="$level" 'BEGIN { exit !(l <= 4.5) }' || fail "systemd-analyze security $unit: exposure $level, over 4.5"
  ok "systemd-analyze security $unit: exposure $level (at most 4.5)"
done

# The emulator instead of a GPU (the package's documented drop-in) and the test's registry.
inside sh -c 'sed -i "s|^registry = .*|registry = \"file:///srv/thaw-test/registry\"|" /etc/thaw/thawd.toml &&
  mkdir -p /etc/systemd/system/thawd.service.d &&
  ln -s /usr/share/thaw-emulator/thawd-emulator.conf /etc/systemd/system/thawd.service.d/emulator.conf &&
  systemctl daemon-reload' || fail "configuring thawd for the emulator"
expect "thaw-fetch publish (packaged) makes the test model a registry entry" \
  inside thaw-fetch publish --chunk-size 1MiB --quiet /srv/thaw-test/registry/tiny
# The package started thawd on install (no driver then); enable --now + restart with the drop-in.
expect "systemctl enable --now thawd" inside systemctl enable --now thawd.service
expect "systemctl restart thawd (the emulator drop-in)" inside systemctl restart thawd.service
props=$(inside systemctl show -p Type,ActiveState,SubState,UnitFileState,StatusText thawd.service)
grep -qx 'Type=notify' <<<"$props" && grep -qx 'ActiveState=active' <<<"$props" &&
  grep -qx 'SubState=running' <<<"$props" && grep -qx 'UnitFileState=enabled' <<<"$props" &&
  grep -q '^StatusText=1 GPU(s)' <<<"$props" ||
  fail "thawd.service is enabled and active (running) through READY=1 with one GPU" "$props"
ok "thawd.service enabled, active (running) after READY=1 (Type=notify): $(grep StatusText <<<"$props")"

# ------------------------------------------------------------------------------ the bus
inside useradd --create-home --groups thaw alice || fail "useradd alice (group thaw)"
out=$(as nobody busctl --system introspect org.thaw.Node1 /org/thaw/Node1 2>&1)
grep -q 'org.thaw.Node1.Manager' <<<"$out" || fail "busctl introspect as nobody" "$out"
ok "busctl --system introspect org.thaw.Node1 /org/thaw/Node1 as nobody"
expect "thawctl fetch tiny (root)" inside thawctl fetch tiny
expect "thawctl prewarm tiny, as a member of group thaw" as alice thawctl prewarm tiny
for _ in $(seq 100); do
  [[ $(inside thawctl --json slots) == *'"state":"prewarmed"'* ]] && break
  sleep 0.1
done
slots=$(inside thawctl --json slots)
[[ $slots == *'"model":"tiny"'*'"state":"prewarmed"'* ]] || fail "thawctl slots shows tiny prewarmed" "$slots"
ok "thawctl slots: tiny prewarmed"
slot=$(sed -n 's/.*"path":"\([^"]*\)".*/\1/p' <<<"$slots")
out=$(as nobody busctl --system get-property org.thaw.Node1 "$slot" org.thaw.Node1.Slot State 2>&1)
[[ $out == 's "prewarmed"' ]] || fail "busctl get-property of the slot as nobody" "$out"
ok "busctl get-property $slot State as nobody: $out"
out=$(as nobody busctl --system call org.thaw.Node1 /org/thaw/Node1 org.thaw.Node1.Manager \
  Fetch s tiny 2>&1) && fail "a mutating method (Fetch) is denied to nobody" "it was allowed: $out"
grep -qi 'denied' <<<"$out" || fail "a mutating method is denied to nobody" "$out"
ok "Manager.Fetch as nobody: $out"
out=$(as alice busctl --system call org.thaw.Node1 /org/thaw/Node1 org.thaw.Node1.Manager \
  Fetch s tiny 2>&1) || fail "Manager.Fetch as a member of thaw" "$out"
ok "Manager.Fetch as a member of thaw: $out"

# ------------------------------------------------------------------------------ an engine
ENGINE_ENV=(LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/thaw-emulator
  THAW_EMU_KERNELS=/srv/thaw-test/engine/librefengine_kernels_twins.so THAW_EMU_DEVICE_MEMORY=16G)
ENGINE=(/srv/thaw-test/engine/refengine generate --tokens 1,2,3,4 --max-tokens 4 --ignore-eos
  --json --max-num-seqs 1 --max-model-len 64 --max-num-batched-tokens 16 --cuda-graph-sizes 1
  --num-warmups 1 --model /var/cache/thaw/tiny)
out=$(as alice env "${ENGINE_ENV[@]}" LD_PRELOAD=libthaw-preload.so THAW_PRELOAD_ATTACH=1 \
  THAW_PRELOAD_LOG=/tmp/engine.shim.log "${ENGINE[@]}" 2>&1) ||
  fail "the reference engine runs under LD_PRELOAD=libthaw-preload.so" "$out"
[[ $out == *'"finish_reason":"length"'* ]] || fail "the engine generated tokens" "$out"
shim=$(inside cat /tmp/engine.shim.log)
grep -q 'connected to thawd' <<<"$shim" && grep -q 'attached to slot' <<<"$shim" &&
  grep -Eq '[1-9][0-9]* bytes injected' <<<"$shim" ||
  fail "the engine's weights came from thawd's slot" "$(tail -8 <<<"$shim")"
ok "the engine (LD_PRELOAD by name, as a member of thaw) took its weights from the slot: $(grep -Eo '[0-9]+ bytes injected' <<<"$shim")"
hits=$(inside busctl --system get-property org.thaw.Node1 /org/thaw/Node1 org.thaw.Node1.Manager PrewarmHits)
[[ $hits =~ ^t\ [1-9] ]] || fail "thawd counts the prewarm hit" "$hits"
ok "Manager.PrewarmHits: $hits"

# ------------------------------------------------------------ a worker across a restart
# Workers are transient units (thaw-worker-*) that outlive thawd on purpose; a thawd restarted
# with a coordinator endpoint adopts the ones still running (WorkerLauncher) from `systemctl
# list-units`, run from inside thawd's hardened unit. The coordinator need not be up: the
# agent connects in the background.
out=$(inside sh -c '{ [ -e /etc/thaw/coordinator.pub ] || thaw-coordinator keygen /etc/thaw/coordinator >/dev/null; } &&
  thaw-coordinator keygen /etc/thaw/node >/dev/null &&
  sed -i "s|^endpoint = \"\"|endpoint = \"tcp://127.0.0.1:5570\"|" /etc/thaw/thawd.toml' 2>&1) ||
  fail "configuring a coordinator endpoint and the keys" "$out"
expect "systemd-run --unit=thaw-worker-adopt-0 (a worker a thawd before this one launched)" \
  inside systemd-run --quiet --collect --unit=thaw-worker-adopt-0 sleep 600
inside sh -c 'mkdir -p /var/lib/thaw/workers &&
  printf "gpu 0\nports 18080\n" >/var/lib/thaw/workers/thaw-worker-adopt-0.spec' ||
  fail "recording the worker's GPU and ports as its launch would"
expect "systemctl restart thawd (now with a coordinator endpoint)" inside systemctl restart thawd.service
line=$(journal_line 'worker thaw-worker-adopt-0: running since before this start; adopted') ||
  fail "the restarted thawd adopts the worker unit still running" \
    "$(inside journalctl -u thawd --no-pager -o cat | tail -8)"
ok "a restarted thawd adopts the worker unit still running: $line"
expect "systemctl stop thaw-worker-adopt-0" inside systemctl stop thaw-worker-adopt-0.service
# What the packages do not own goes, so that purge leaves the root as it was.
inside rm -f /etc/thaw/node.key /etc/thaw/node.pub /var/lib/thaw/workers/thaw-worker-adopt-0.spec

# ------------------------------------------------------------------------ reload, stop
pid=$(inside systemctl show -p MainPID --value thawd.service)
expect "systemctl reload thawd" inside systemctl reload thawd.service
[[ $(inside systemctl show -p MainPID --value thawd.service) == "$pid" && $(inside systemctl is-active thawd.service) == active ]] ||
  fail "thawd is the same process, active, after reload"
journal_line '^reloaded /etc/thaw/thawd.toml' >/dev/null ||
  fail "thawd logs the reload"
ok "reload: the same thawd (pid $pid) reread /etc/thaw/thawd.toml"
out=$(as alice cat /var/cache/thaw/tiny/config.json 2>&1) ||
  fail "members of thaw still read the host cache after reload" "$out" "$(inside ls -ld /var/cache/thaw)"
ok "the host cache stays readable to group thaw after reload ($(inside stat -c '%U:%G %a' /var/cache/thaw))"
expect "thawctl prewarm tiny again" inside thawctl prewarm tiny
# What the device has free, as an engine without thaw sees it (cuMemGetInfo after its weights;
# while thawd holds its pool the engine then stops for want of KV-cache memory, as it should).
device_free() {
  inside rm -f /tmp/free.timeline
  as alice env "${ENGINE_ENV[@]}" "${ENGINE[@]}" --timeline /tmp/free.timeline >/dev/null 2>&1
  inside sed -n 's/.*"event":"profile_done","free":\([0-9]*\),.*"total":\([0-9]*\),.*/\1 \2/p' /tmp/free.timeline
}
read -r free_on total_on < <(device_free) || fail "an engine without the shim runs while thawd holds its pool"
expect "systemctl stop thawd" inside systemctl stop thawd.service
read -r free_off total_off < <(device_free) || fail "an engine without the shim runs after thawd stopped"
released=$(journal_line '^stopped: gave') || fail "thawd logs what it gave back at stop"
((free_on * 4 < total_on && free_off * 100 > total_off * 99)) ||
  fail "systemctl stop gives every GPU page back" \
    "device free while thawd ran: $free_on of $total_on; after stop: $free_off of $total_off"
ok "stop: $released; the device had $((free_on >> 20)) MiB free while thawd ran, $((free_off >> 20)) of $((total_off >> 20)) MiB after"
[[ $(inside systemctl show -p Result --value thawd.service) == success ]] || fail "thawd stopped cleanly (Result=success)"

# ------------------------------------------------------------------------------ gateway
# Installed, not enabled; configured the way README.Debian says: routes in gateway.env, an API
# key file and a TLS certificate and key (mode 600, root's) handed to the dynamic user as
# credentials.
gw_key=thaw-test-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
[[ $(inside systemctl is-enabled thaw-gateway.service) == disabled && $(inside systemctl is-active thaw-gateway.service) != active ]] ||
  fail "thaw-gateway.service is installed but neither enabled nor started"
ok "thaw-gateway.service installed, disabled, not started"
creds=/run/credentials/thaw-gateway.service
inside sh -c "umask 077 && echo '$gw_key' >/etc/thaw/gateway.keys &&
  cp /srv/thaw-test/gateway.crt /srv/thaw-test/gateway.key /etc/thaw/ &&
  sed -i 's|^THAW_GATEWAY_ARGS=.*|THAW_GATEWAY_ARGS=\"--route tiny=http://127.0.0.1:9 --listen 127.0.0.1:8443 --api-key-file $creds/api-keys --tls-cert $creds/tls-cert --tls-key $creds/tls-key\"|' /etc/thaw/gateway.env &&
  mkdir -p /etc/systemd/system/thaw-gateway.service.d &&
  printf '[Service]\nLoadCredential=api-keys:/etc/thaw/gateway.keys\nLoadCredential=tls-cert:/etc/thaw/gateway.crt\nLoadCredential=tls-key:/etc/thaw/gateway.key\n' >/etc/systemd/system/thaw-gateway.service.d/credentials.conf &&
  systemctl daemon-reload" || fail "configuring thaw-gateway (routes, API key and TLS credentials)"
gw_curl() { inside curl -s --cacert /srv/thaw-test/gateway.crt -w ' %{http_code}' "$@"; }
expect "systemctl start thaw-gateway" inside systemctl start thaw-gateway.service
health=""
for _ in $(seq 50); do
  health=$(gw_curl https://127.0.0.1:8443/health 2>/dev/null) && [[ $health == *' 200' ]] && break
  sleep 0.1
done
[[ $health == '{"status":"ok"} 200' ]] ||
  fail "GET https://.../health answers 200 without a key" "$health" "$(inside journalctl -u thaw-gateway --no-pager -o cat | tail -5)"
ok "thaw-gateway.service: GET https://127.0.0.1:8443/health (certificate verified) $health"
gw_pid=$(inside systemctl show -p MainPID --value thaw-gateway.service)
gw_user=$(inside ps -o user= -p "$gw_pid" | tr -d ' ')
gw_caps=$(inside grep CapEff "/proc/$gw_pid/status" | awk '{print $2}')
[[ -n $gw_user && $gw_user != root && $gw_caps == 0000000000000000 ]] ||
  fail "the gateway runs as a dynamic user without capabilities" "user $gw_user, CapEff $gw_caps"
ok "the gateway runs as $gw_user (dynamic), CapEff $gw_caps"
body='{"model":"nope","prompt":"hi"}'
out=$(gw_curl -H 'Content-Type: application/json' -d "$body" https://127.0.0.1:8443/v1/completions)
[[ $out == *'"code":"invalid_api_key"'*' 401' ]] || fail "POST /v1/completions without a key is 401 invalid_api_key" "$out"
ok "no key: $out"
out=$(gw_curl -H "Authorization: Bearer $gw_key" -H 'Content-Type: application/json' -d "$body" https://127.0.0.1:8443/v1/completions)
[[ $out == *'"code":"model_not_found"'*' 404' ]] || fail "an unknown model is a JSON 404 with the key" "$out"
ok "the key, an unknown model: $out"
expect "systemctl stop thaw-gateway" inside systemctl stop thaw-gateway.service
[[ $(inside systemctl show -p Result --value thaw-gateway.service) == success ]] || fail "thaw-gateway stopped cleanly (Result=success)"
inside sh -c 'rm -rf /etc/systemd/system/thaw-gateway.service.d /etc/thaw/gateway.keys /etc/thaw/gateway.crt /etc/thaw/gateway.key && systemctl daemon-reload' ||
  fail "removing the gateway's drop-in, key file and certificate"

# ------------------------------------------------------------------------------ purge
# What the test itself added goes first (the alice's drop-in and user are theirs to remove).
inside sh -c 'rm -rf /etc/systemd/system/thawd.service.d && userdel --remove alice 2>/dev/null && rm -f /tmp/*.log /tmp/*.timeline /srv/thaw-test/registry/tiny/thaw-manifest.json' ||
  fail "removing the test's drop-in and user"
expect "apt purge thaw thaw-emulator thaw-coordinator thaw-gateway thaw-dev" \
  inside env DEBIAN_FRONTEND=noninteractive apt-get purge -y thaw thaw-emulator thaw-coordinator thaw-gateway thaw-dev
inside systemctl daemon-reload
snapshot >"$T/after.txt" || fail "listing the root after the purge"
if ! diff -u "$T/before.txt" "$T/after.txt" >"$T/diff.txt"; then
  fail "apt purge leaves no file, user, group or unit behind" "$(grep '^[-+][^-+]' "$T/diff.txt" | head -30)"
fi
ok "apt purge: the root, users, groups and units are as before the install ($(wc -l <"$T/before.txt") entries compared)"
echo "# PASS: the packages install, serve, reload, stop and purge under a booted systemd in $((SECONDS - started)) s"
