#!/bin/bash
# A Debian 12 root booted with systemd as PID 1 in a container (systemd-nspawn --boot), for
# tests that need a real system manager: a .deb installed with apt, units started, D-Bus
# policy loaded, sysusers/tmpfiles applied. Each boot sees the cached root through an
# overlay, so nothing a test does stays in the cache. README.md beside it says what works
# where and why.
#
# Skip convention: exit 77 with a one-line "SKIP: reason" when this machine cannot do it
# (not root, a tool missing, the root cannot be built, the container cannot boot).
set -euo pipefail

PROG=${0##*/}
CACHE_DEFAULT=/var/cache/thaw/bookworm-systemd
MINBASE=${THAW_MINBASE_ROOT:-/var/cache/thaw/bookworm-minbase}
# What the root holds beyond minbase: systemd as init and a system bus; procps and iproute2
# for looking around; and the run-time libraries of thaw's binaries (thawd,
# thaw-coordinator, libthaw-preload.so), so that `apt install ./thaw_*.deb` needs no network.
PACKAGES=(systemd systemd-sysv dbus libsystemd0 procps iproute2 curl
  libcurl4 libfmt9 libprotobuf32 libzmq5 libtomlplusplus3 libcpp-httplib0.11)
# Bump when the way the root is made changes; with the package list it forms the stamp, and a
# cached root with another stamp is rebuilt.
RECIPE=2
STAMP_FILE=.thaw-booted-root
INSIDE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

usage() {
  cat <<EOF
usage: $PROG COMMAND [ARGS]

A Debian 12 (bookworm) root with systemd, booted in a container by systemd-nspawn --boot.
Needs root. Exits 77 with "SKIP: reason" where this machine cannot do it.

commands:
  prepare [--cache DIR] [--rebuild]
      Make the cached root once (default $CACHE_DEFAULT): a copy of the minimal root
      \$THAW_MINBASE_ROOT ($MINBASE) if there is one, else debootstrap
      --variant=minbase; then apt-get install: ${PACKAGES[*]}.
      Built in DIR.tmp and renamed, so an interrupted run leaves no half root; DIR/$STAMP_FILE
      records the recipe and package versions, and a root with another recipe is rebuilt.
      Mirror: \$THAW_DEBIAN_MIRROR, else the bookworm entry of /etc/apt/sources.list*.
  boot [--cache DIR] [--timeout SECONDS] [--nspawn-arg ARG]... WORKDIR
      prepare, then boot an overlay of the cached root (a reflink/copy where overlayfs does
      not work) in the background; wait (default 60 s) until \`systemctl is-system-running\`
      says running or degraded (degraded lists the failed units). WORKDIR must not exist;
      WORKDIR/pid holds the host PID of the container's systemd, WORKDIR/console.log its
      console. --nspawn-arg passes ARG to systemd-nspawn, e.g.
      --capability=CAP_BPF,CAP_PERFMON,CAP_NET_ADMIN,CAP_IPC_LOCK (the
      container's default bounding set lacks them; thawd.service asks for them), --bind=PATH.
      A boot that fails (or skips) prints the console's end, takes the container
      down and removes WORKDIR itself.
  exec [--user NAME] [-e VAR=VALUE]... WORKDIR -- CMD [ARG]...
      Run CMD inside (all the container's namespaces, PATH=$INSIDE_PATH, a clean
      environment, as root or, with --user, as NAME through runuser); its exit status is
      this one's. stdin/stdout/stderr pass through.
  copy-in WORKDIR SRC DEST
      Copy host file or directory SRC into the container as \`cp -a SRC DEST\` would inside
      (an existing directory DEST receives SRC by name); files arrive owned by root.
  stop WORKDIR
      Power the container off (killing it after 30 s), check that no process of it is left,
      unmount the overlay and remove WORKDIR. Does nothing if WORKDIR does not exist, so a
      test can say: trap '$PROG stop "\$W"' EXIT
  help
      This text.

environment: THAW_BOOTED_ROOT_CACHE (the cache DIR), THAW_MINBASE_ROOT, THAW_DEBIAN_MIRROR,
THAW_DEBIAN_SECURITY_MIRROR.
EOF
}

say() { echo "$PROG: $*" >&2; }
die() {
  say "error: $*"
  exit 1
}
skip() {
  echo "SKIP: $*"
  exit 77
}

need_root() { [[ $(id -u) -eq 0 ]] || skip "needs root (mounts, chroot, systemd-nspawn)"; }
need_tool() {
  command -v "$1" >/dev/null || skip "$1 is missing (apt-get install $2)"
}

# The mirror of the suite $1 (bookworm, bookworm-security) from apt's own configuration:
# one-line .list entries and deb822 .sources stanzas. Empty if none.
apt_mirror_for() {
  local suite=$1 f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $f ]] || continue
    awk -v s="$suite" '$1 == "deb" {
        i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
        if ($(i + 1) == s) { print $i; exit } }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    awk -v s="$suite" '
      function flush() { if (deb && hit && uri != "") { print uri; found = 1 } deb = hit = 0; uri = "" }
      /^[ \t]*$/ { flush(); next }
      /^Types:/ { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
      /^URIs:/ { uri = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s) hit = 1 }
      END { if (!found) flush() }' "$f"
  done
}

mirror() {
  local m=${THAW_DEBIAN_MIRROR:-}
  [[ -n $m ]] || m=$(apt_mirror_for bookworm | head -n1)
  echo "${m:-http://deb.debian.org/debian}"
}
security_mirror() {
  local m=${THAW_DEBIAN_SECURITY_MIRROR:-}
  [[ -n $m ]] || m=$(apt_mirror_for bookworm-security | head -n1)
  echo "${m:-http://deb.debian.org/debian-security}"
}

recipe_line() { echo "recipe $RECIPE: bookworm + ${PACKAGES[*]}"; }

stamp_ok() { [[ -f $1/$STAMP_FILE ]] && [[ $(head -n1 "$1/$STAMP_FILE") == "$(recipe_line)" ]]; }

# Mounts that chroot apt-get needs, undone by build_cleanup.
CHROOT_MOUNTS=()
chroot_mount() {
  local root=$1
  mount -t proc proc "$root/proc" && CHROOT_MOUNTS+=("$root/proc")
  mount --bind /dev "$root/dev" && CHROOT_MOUNTS+=("$root/dev")
  mount -t sysfs sysfs "$root/sys" && CHROOT_MOUNTS+=("$root/sys")
}
build_cleanup() {
  local i
  for ((i = ${#CHROOT_MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${CHROOT_MOUNTS[i]}" 2>/dev/null || umount -l "${CHROOT_MOUNTS[i]}" || true
  done
  CHROOT_MOUNTS=()
  if [[ -n ${BUILD_TMP:-} && -d $BUILD_TMP ]]; then
    if findmnt -rn -o TARGET | awk -v d="$BUILD_TMP/" 'index($0, d) == 1 { f = 1 } END { exit !f }'; then
      say "mounts remain under $BUILD_TMP; not removing it"
    else
      rm -rf --one-file-system "$BUILD_TMP"
    fi
  fi
}

# Builds the root in $BUILD_TMP; exits 77 (through skip) where the machine cannot.
build_root() {
  local cache=$1 log=$1.log m sm t0=$SECONDS
  BUILD_TMP=$cache.tmp
  trap build_cleanup EXIT
  trap 'exit 130' INT TERM
  # What a run killed outright left (its chroot mounts, its half root) goes first.
  local m
  while read -r m; do umount "$m" || umount -l "$m"; done < <(findmnt -rn -o TARGET |
    awk -v d="$BUILD_TMP/" 'index($0, d) == 1' | sort -r)
  rm -rf --one-file-system "$BUILD_TMP"
  m=$(mirror)
  sm=$(security_mirror)
  : >"$log"
  if [[ -x $MINBASE/bin/bash && -x $MINBASE/usr/bin/apt-get && -f $MINBASE/etc/debian_version &&
    $(cat "$MINBASE/etc/debian_version") == 12.* ]]; then
    say "copying the minimal root $MINBASE to $BUILD_TMP"
    cp -a --reflink=auto "$MINBASE" "$BUILD_TMP"
  else
    command -v debootstrap >/dev/null ||
      skip "no cached root, no minimal root at $MINBASE and no debootstrap (apt-get install debootstrap)"
    say "debootstrap --variant=minbase bookworm $BUILD_TMP $m (several minutes, once; log $log)"
    debootstrap --variant=minbase bookworm "$BUILD_TMP" "$m" >>"$log" 2>&1 ||
      skip "debootstrap failed (mirror $m unreachable?); log: $log"
  fi
  say "$((SECONDS - t0)) s: base root ready; apt-get install ${PACKAGES[*]} (log $log)"
  cat >"$BUILD_TMP/etc/apt/sources.list" <<EOF
deb $m bookworm main
deb $m bookworm-updates main
deb $sm bookworm-security main
EOF
  rm -f "$BUILD_TMP"/etc/apt/sources.list.d/*
  cp /etc/resolv.conf "$BUILD_TMP/etc/resolv.conf" 2>/dev/null || true
  # No service may start inside the chroot.
  printf '#!/bin/sh\nexit 101\n' >"$BUILD_TMP/usr/sbin/policy-rc.d"
  chmod 755 "$BUILD_TMP/usr/sbin/policy-rc.d"
  chroot_mount "$BUILD_TMP"
  local apt=(env -i PATH="$INSIDE_PATH" DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
    chroot "$BUILD_TMP" apt-get -q -y -o Acquire::Retries=3 -o Acquire::http::Timeout=30)
  "${apt[@]}" update >>"$log" 2>&1 || skip "apt-get update failed in the new root (mirror $m unreachable?); log: $log"
  "${apt[@]}" install --no-install-recommends "${PACKAGES[@]}" >>"$log" 2>&1 ||
    skip "apt-get install failed in the new root (mirror $m unreachable?); log: $log"
  "${apt[@]}" clean >>"$log" 2>&1
  rm -f "$BUILD_TMP/usr/sbin/policy-rc.d"
  # Each boot gets its own machine id (systemd-nspawn makes one for an empty file), and
  # keeps the hostname nspawn gives it (the machine name), not the build host's that
  # debootstrap copied.
  : >"$BUILD_TMP/etc/machine-id"
  rm -f "$BUILD_TMP/etc/hostname"
  printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$BUILD_TMP/etc/hosts"
  rm -f "$BUILD_TMP/var/lib/dbus/machine-id"
  build_cleanup_mounts_only
  {
    recipe_line
    echo "built $(date -u +%FT%TZ) from $m"
    # shellcheck disable=SC2016 # dpkg-query's format, not the shell's
    chroot "$BUILD_TMP" dpkg-query -W -f '${Package} ${Version}\n' "${PACKAGES[@]}"
  } >"$BUILD_TMP/$STAMP_FILE"
  # Replace the old root (if any) by the new one: two renames under the exclusive lock.
  if [[ -e $cache ]]; then
    mv -T "$cache" "$cache.old.$$"
    mv -T "$BUILD_TMP" "$cache"
    rm -rf --one-file-system "$cache.old.$$"
  else
    mv -T "$BUILD_TMP" "$cache"
  fi
  BUILD_TMP=
  trap - EXIT INT TERM
  say "$((SECONDS - t0)) s: root ready at $cache"
}
build_cleanup_mounts_only() {
  local keep=$BUILD_TMP
  BUILD_TMP=
  build_cleanup
  BUILD_TMP=$keep
}

# The cache lock: shared while a container has the root as its overlay's lower layer (the
# nspawn process holds it), exclusive while the root is (re)built.
cmd_prepare() {
  local cache=${THAW_BOOTED_ROOT_CACHE:-$CACHE_DEFAULT} rebuild=0
  while [[ $# -gt 0 ]]; do
    case $1 in
      --cache) cache=${2:?--cache needs a directory}; shift 2 ;;
      --rebuild) rebuild=1; shift ;;
      *) die "prepare: unknown argument '$1' (see $PROG help)" ;;
    esac
  done
  need_root
  need_tool chroot coreutils
  cache=$(realpath -m "$cache")
  mkdir -p "$(dirname "$cache")"
  local fd
  exec {fd}>"$cache.lock"
  if [[ $rebuild -eq 0 ]]; then
    flock -s "$fd"
    if stamp_ok "$cache"; then
      exec {fd}>&-
      say "cached root $cache is current ($(recipe_line))"
      return 0
    fi
    flock -u "$fd"
  fi
  if ! flock -x -n "$fd"; then
    say "waiting for the lock on $cache (containers use it, or another build runs)"
    flock -x -w 1800 "$fd" || die "could not lock $cache.lock in 30 min"
  fi
  if [[ $rebuild -eq 1 ]] || ! stamp_ok "$cache"; then
    [[ -e $cache ]] && say "rebuilding $cache (stamp differs or --rebuild)"
    build_root "$cache"
  fi
  exec {fd}>&-
}

# The host PID of the container's PID 1 among the descendants of the nspawn process $1.
container_pid1() {
  local p k kids queue=("$1")
  while [[ ${#queue[@]} -gt 0 ]]; do
    p=${queue[0]}
    queue=("${queue[@]:1}")
    if [[ $p != "$1" ]] && awk '/^NSpid:/ { exit !(NF > 2 && $NF == 1) }' "/proc/$p/status" 2>/dev/null; then
      echo "$p"
      return 0
    fi
    kids=$(pgrep -P "$p" || true)
    for k in $kids; do queue+=("$k"); done
  done
  return 1
}

inside() { # inside PID CMD...: as root, clean environment
  local pid=$1
  shift
  nsenter -t "$pid" -a -r -w env -i PATH="$INSIDE_PATH" HOME=/root USER=root LOGNAME=root \
    LANG=C.UTF-8 TERM=dumb SYSTEMD_PAGER= SYSTEMD_COLORS=0 "$@"
}

cmd_boot() {
  local cache=${THAW_BOOTED_ROOT_CACHE:-$CACHE_DEFAULT} timeout=60 w nspawn_args=()
  while [[ $# -gt 0 ]]; do
    case $1 in
      --cache) cache=${2:?}; shift 2 ;;
      --nspawn-arg) nspawn_args+=("${2:?}"); shift 2 ;;
      --timeout) timeout=${2:?}; shift 2
        [[ $timeout =~ ^[0-9]+$ ]] || die "boot: --timeout takes whole seconds" ;;
      -*) die "boot: unknown option '$1' (see $PROG help)" ;;
      *) break ;;
    esac
  done
  [[ $# -eq 1 ]] || die "boot: needs WORKDIR (see $PROG help)"
  need_root
  need_tool systemd-nspawn systemd-container
  need_tool nsenter util-linux
  [[ -d /sys/fs/cgroup ]] || skip "no /sys/fs/cgroup: systemd cannot run as PID 1 here"
  cache=$(realpath -m "$cache")
  w=$(realpath -m "$1")
  [[ ! -e $w ]] || die "boot: $w exists (use a new path; stop removes it)"
  cmd_prepare --cache "$cache"

  mkdir -p "$w"
  BOOT_W=$w
  trap boot_failed EXIT
  echo "$cache" >"$w/cache"
  local root
  mkdir -p "$w/upper" "$w/work" "$w/root"
  if mount -t overlay overlay -o "lowerdir=$cache,upperdir=$w/upper,workdir=$w/work" "$w/root" 2>"$w/overlay.err"; then
    echo overlay >"$w/mode"
  else
    say "overlayfs not usable here ($(head -n1 "$w/overlay.err")); copying the root instead"
    rmdir "$w/root"
    cp -a --reflink=auto "$cache" "$w/root"
    echo copy >"$w/mode"
  fi
  root=$w/root
  # A unique machine name: nspawn keeps per-name state under /run/systemd/nspawn.
  local name
  name=thaw-$(basename "$w" | tr -c 'a-zA-Z0-9\n-' - | cut -c1-40)-$$
  echo "$name" >"$w/machine"
  # --register=no --keep-unit: no systemd-machined and no host systemd to ask for a scope.
  # --console=pipe: no tty here. The shared lock on the cache is held by nspawn (fd 9)
  # for as long as the container runs, so prepare --rebuild waits for it. setsid: a ^C
  # meant for the test does not reach the container; stop ends it.
  (
    exec 9>"$cache.lock"
    flock -s 9
    exec setsid systemd-nspawn -D "$root" --boot --register=no --keep-unit -q --console=pipe \
      --machine="$name" "${nspawn_args[@]}"
  ) </dev/null >"$w/console.log" 2>&1 &
  local npid=$!
  disown "$npid"
  echo "$npid" >"$w/nspawn.pid"
  say "booting $root (machine $name, nspawn pid $npid)"

  local t0=$SECONDS pid="" state=""
  while ((SECONDS - t0 < timeout)); do
    if ! kill -0 "$npid" 2>/dev/null; then
      local why
      why=$(grep -v '^$' "$w/console.log" | tail -n1)
      skip "the container could not boot: systemd-nspawn exited: ${why:-no output} (see $w/console.log)"
    fi
    if [[ -z $pid ]]; then
      pid=$(container_pid1 "$npid") || pid=""
      if [[ -n $pid ]]; then
        echo "$pid" >"$w/pid"
        readlink "/proc/$pid/ns/pid" >"$w/pidns"
      fi
    fi
    if [[ -n $pid ]]; then
      state=$(timeout 5 nsenter -t "$pid" -a -r -w env -i PATH="$INSIDE_PATH" \
        systemctl is-system-running 2>/dev/null) || true
      case $state in
        running)
          trap - EXIT
          say "booted in $((SECONDS - t0)) s: running"
          return 0
          ;;
        degraded)
          trap - EXIT
          say "booted in $((SECONDS - t0)) s: degraded; failed units:"
          inside "$pid" systemctl --failed --no-legend --plain >&2 || true
          return 0
          ;;
        maintenance | stopping | offline) ;;
      esac
    fi
    sleep 0.3
  done
  if [[ -z $pid || -z $state || $state == offline ]]; then
    skip "the container could not boot: its systemd did not answer in ${timeout} s (see $w/console.log)"
  fi
  say "the container did not finish booting in ${timeout} s (state: $state); jobs:"
  inside "$pid" systemctl list-jobs --no-legend >&2 || true
  exit 1
}

# A boot that did not come up: show the console's end, then take it all down again.
boot_failed() {
  local rc=$?
  trap - EXIT
  if [[ -s $BOOT_W/console.log ]]; then
    say "the container's console (last lines):"
    tail -n 15 "$BOOT_W/console.log" | sed 's/^/  | /' >&2
  fi
  cmd_stop "$BOOT_W" || say "stop $BOOT_W failed"
  exit "$rc"
}

# Reads WORKDIR/pid and checks the container is alive; sets PID.
container_of() {
  local w=$1
  [[ -f $w/pid ]] || die "$w: no booted container (no $w/pid)"
  PID=$(<"$w/pid")
  [[ -d /proc/$PID && $(readlink "/proc/$PID/ns/pid") == "$(<"$w/pidns")" ]] ||
    die "$w: the container (pid $PID) is not running"
}

cmd_exec() {
  local user="" envs=() w
  while [[ $# -gt 0 ]]; do
    case $1 in
      --user | -u) user=${2:?}; shift 2 ;;
      -e) envs+=("${2:?}"); shift 2 ;;
      --) die "exec: WORKDIR comes before -- (see $PROG help)" ;;
      -*) die "exec: unknown option '$1' (see $PROG help)" ;;
      *) break ;;
    esac
  done
  [[ $# -ge 3 && $2 == -- ]] || die "usage: $PROG exec [--user NAME] [-e VAR=VALUE]... WORKDIR -- CMD [ARG]..."
  w=$1
  shift 2
  need_root
  container_of "$w"
  if [[ -n $user ]]; then
    # runuser sets HOME, SHELL, USER and LOGNAME of NAME; -w keeps the chosen variables.
    local keep=PATH,LANG,TERM,SYSTEMD_PAGER,SYSTEMD_COLORS v
    for v in "${envs[@]}"; do keep+=,${v%%=*}; done
    exec nsenter -t "$PID" -a -r -w env -i PATH="$INSIDE_PATH" LANG=C.UTF-8 TERM=dumb \
      SYSTEMD_PAGER= SYSTEMD_COLORS=0 "${envs[@]}" runuser -u "$user" -w "$keep" -- "$@"
  fi
  exec nsenter -t "$PID" -a -r -w env -i PATH="$INSIDE_PATH" HOME=/root USER=root LOGNAME=root \
    LANG=C.UTF-8 TERM=dumb SYSTEMD_PAGER= SYSTEMD_COLORS=0 "${envs[@]}" "$@"
}

cmd_copy_in() {
  [[ $# -eq 3 ]] || die "usage: $PROG copy-in WORKDIR SRC DEST"
  local w=$1 src=$2 dest=$3
  need_root
  container_of "$w"
  [[ -e $src ]] || die "copy-in: no $src"
  src=$(realpath -s "$src")
  # Through a tar stream into the container, then cp -a there: paths resolve inside (an
  # absolute symlink in the root never points into the host).
  # shellcheck disable=SC2016 # expanded by the shell inside
  tar -C "$(dirname "$src")" --owner=0 --group=0 --numeric-owner -cf - "$(basename "$src")" |
    inside "$PID" sh -euc 't=$(mktemp -d); trap "rm -rf \"\$t\"" EXIT
      tar -C "$t" -xf -; cp -a "$t/$1" "$2"' sh "$(basename "$src")" "$dest"
}

cmd_stop() {
  [[ $# -eq 1 ]] || die "usage: $PROG stop WORKDIR"
  local w
  w=$(realpath -m "$1")
  [[ -d $w ]] || return 0
  need_root
  local npid="" pid="" pidns="" t0
  [[ -f $w/nspawn.pid ]] && npid=$(<"$w/nspawn.pid")
  [[ -f $w/pid ]] && pid=$(<"$w/pid")
  [[ -f $w/pidns ]] && pidns=$(<"$w/pidns")
  # A PID is ours only while it still is in the container's pid namespace, or is the
  # nspawn process that we started (checked by its command line).
  ours_nspawn() {
    [[ -n $npid && -r /proc/$npid/cmdline ]] &&
      tr '\0' ' ' <"/proc/$npid/cmdline" | grep -qF "systemd-nspawn -D $w/root "
  }
  mounts_under() { findmnt -rn -o TARGET | awk -v w="$w" '$0 == w || index($0, w "/") == 1'; }
  # A boot cut short may not have recorded the container's PID 1 yet.
  if [[ -z $pid ]] && ours_nspawn && pid=$(container_pid1 "$npid"); then
    pidns=$(readlink "/proc/$pid/ns/pid") || pid=""
  fi
  # Ask its systemd to power off; where that cannot be asked (no PID 1 yet, or not yet
  # listening early in boot), SIGTERM makes nspawn send PID 1 the halt signal.
  local asked=0
  if [[ -n $pid && -n $pidns && $(readlink "/proc/$pid/ns/pid" 2>/dev/null) == "$pidns" ]] &&
    timeout 10 nsenter -t "$pid" -a -r -w env -i PATH="$INSIDE_PATH" systemctl poweroff --no-block \
      >/dev/null 2>&1; then
    asked=1
  fi
  [[ $asked -eq 1 ]] || ! ours_nspawn || kill -TERM "$npid" 2>/dev/null || true
  t0=$SECONDS
  local last=$SECONDS
  while ours_nspawn && ((SECONDS - t0 < 30)); do
    # A halt signal sent before PID 1 has its handlers is lost, and so can be a poweroff
    # asked for early in the boot: insist, every 2 s (after 10 s for a poweroff asked).
    if ((SECONDS - last >= 2 && (asked != 1 || SECONDS - t0 >= 10))); then
      kill -TERM "$npid" 2>/dev/null || true
      last=$SECONDS
    fi
    sleep 0.2
  done
  if ours_nspawn; then
    say "the container did not power off in 30 s; killing it"
  fi
  # Whatever still lives in the container's pid namespace goes now.
  if [[ -n $pidns ]]; then
    local p left
    for p in /proc/[0-9]*; do
      if [[ $(readlink "$p/ns/pid" 2>/dev/null) == "$pidns" ]]; then
        kill -KILL "${p#/proc/}" 2>/dev/null || true
      fi
    done
    t0=$SECONDS
    while ((SECONDS - t0 < 10)); do
      left=0
      for p in /proc/[0-9]*; do
        [[ $(readlink "$p/ns/pid" 2>/dev/null) == "$pidns" ]] && left=1
      done
      [[ $left -eq 0 ]] && break
      sleep 0.2
    done
    [[ $left -eq 0 ]] || say "processes of the container remain after SIGKILL"
  fi
  if ours_nspawn; then kill -KILL "$npid" 2>/dev/null || true; fi
  t0=$SECONDS
  while ours_nspawn && ((SECONDS - t0 < 10)); do sleep 0.2; done
  ! ours_nspawn || die "systemd-nspawn (pid $npid) does not exit; $w left as it is"
  local m name=""
  while read -r m; do
    umount "$m" 2>/dev/null || { sleep 1; umount "$m"; } || umount -l "$m" ||
      say "could not unmount $m"
  done < <(mounts_under | sort -r)
  [[ -z $(mounts_under) ]] || die "mounts remain under $w; not removing it"
  [[ -f $w/machine ]] && name=$(<"$w/machine")
  rm -rf --one-file-system "$w"
  [[ -z $name ]] || rm -rf "/run/systemd/nspawn/propagate/$name" 2>/dev/null || true
}

main() {
  [[ $# -ge 1 ]] || {
    usage >&2
    exit 2
  }
  local c=$1
  shift
  case $c in
    prepare) cmd_prepare "$@" ;;
    boot) cmd_boot "$@" ;;
    exec) cmd_exec "$@" ;;
    copy-in) cmd_copy_in "$@" ;;
    stop) cmd_stop "$@" ;;
    help | -h | --help) usage ;;
    *)
      say "unknown command '$c'"
      usage >&2
      exit 2
      ;;
  esac
}

main "$@"
