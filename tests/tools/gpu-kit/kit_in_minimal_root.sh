#!/bin/bash
# The real-GPU kit is self-contained: `run --quick` passes steps a-d on the emulator inside a
# minimal Debian 12 root (debootstrap --variant=minbase: bash, coreutils, mawk; none of thaw's
# build or run dependencies), where nothing of this machine's /usr is visible. Steps e and f
# are skipped there (no python3, no GPU) and must say so.
#
# The root is made once and kept (THAW_MINBASE_ROOT, default /var/cache/thaw/bookworm-minbase);
# each run sees it through an overlay, so nothing a run writes stays. Needs root (mount
# namespaces, chroot).
# usage: kit_in_minimal_root.sh KIT_DIR
set -euo pipefail
KIT=$(cd "$1" && pwd)
ROOT=${THAW_MINBASE_ROOT:-/var/cache/thaw/bookworm-minbase}
MIRROR=${THAW_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# On failure the kit's whole report (every step's log) is kept beside the kit for a look.
KEEP=$(dirname "$KIT")/gpu-kit-minimal-root-report
fail() {
  [[ -n ${OUT:-} && -d $OUT ]] && { rm -rf "$KEEP"; cp -r "$OUT" "$KEEP"; echo "the kit's report and logs: $KEEP"; }
  echo "FAIL: $*"
  exit 1
}
[[ $(id -u) -eq 0 ]] || { echo "SKIP: needs root (mount namespace, chroot)"; exit 77; }
[[ -x $KIT/run ]] || fail "no kit at $KIT (cmake --build <tree> --target gpu-kit)"

if [[ ! -x $ROOT/bin/bash ]]; then
  command -v debootstrap >/dev/null || fail "debootstrap is missing: apt-get install debootstrap (scripts/install-deps)"
  mkdir -p "$(dirname "$ROOT")"
  exec 9>"$ROOT.lock"
  flock 9
  if [[ ! -x $ROOT/bin/bash ]]; then
    echo "making the minimal Debian 12 root once: debootstrap --variant=minbase bookworm $ROOT ($MIRROR)"
    rm -rf "$ROOT.new"
    debootstrap --variant=minbase bookworm "$ROOT.new" "$MIRROR" >"$ROOT.log" 2>&1 ||
      fail "debootstrap failed (log: $ROOT.log); set THAW_DEBIAN_MIRROR or THAW_MINBASE_ROOT to an existing root"
    mv -T "$ROOT.new" "$ROOT"
  fi
  exec 9>&-
fi
# The point of the test: the root really lacks what the kit must not need.
for p in usr/bin/python3 usr/sbin/nginx usr/bin/busctl usr/bin/dbus-daemon usr/bin/curl; do
  [[ ! -e $ROOT/$p ]] || fail "$ROOT has /$p: not a minimal root; remove it or point THAW_MINBASE_ROOT elsewhere"
done
for lib in libfmt.so.9 libprotobuf.so.32 libzmq.so.5 libcurl.so.4 libdbus-1.so.3 libsystemd.so.0; do
  [[ ! -e $ROOT/usr/lib/x86_64-linux-gnu/$lib ]] || echo "note: $ROOT has $lib (minbase may); the kit must not use it"
done

W=$(mktemp -d /tmp/thaw-kit-root.XXXXXX)
OUT=$W/out
mkdir -p "$W"/{upper,work,merged} "$OUT"
cleanup() { rm -rf "$W"; }
trap cleanup EXIT
# A new mount and pid namespace: every mount goes away with it, and every process the kit
# leaves behind is killed when its pid 1 (the chroot's shell) exits.
set +e
unshare --mount --pid --fork --kill-child bash -euo pipefail -c '
  W=$1 ROOT=$2 KIT=$3
  mount --make-rprivate /
  mount -t overlay overlay -o "lowerdir=$ROOT,upperdir=$W/upper,workdir=$W/work" "$W/merged"
  M=$W/merged
  mkdir -p "$M/kit" "$M/out"
  mount --bind "$KIT" "$M/kit"
  mount -o remount,bind,ro "$M/kit"
  mount --bind "$W/out" "$M/out"
  mount -t proc proc "$M/proc"
  mount --bind /dev "$M/dev"
  mount -t tmpfs -o mode=1777 tmpfs "$M/dev/shm"
  mount -t tmpfs -o mode=1777 tmpfs "$M/tmp"
  mount -t sysfs sysfs "$M/sys"
  exec chroot "$M" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    /bin/bash -c "cd /tmp && /kit/run --quick --out /out"
' bash "$W" "$ROOT" "$KIT"
rc=$?
set -e
echo "--- report.md"
cat "$OUT/report.md" 2>/dev/null || fail "the kit wrote no report (exit $rc)"
for s in a b c d; do
  status=$(sed -n 's/^status=//p' "$OUT/$s/result" | tail -1)
  if [[ $status != passed ]]; then
    echo "--- $s/log (last 30 lines)"
    tail -30 "$OUT/$s/log" 2>/dev/null || true
    fail "step $s: ${status:-no result}: $(sed -n 's/^reason=//p' "$OUT/$s/result" | tail -1)"
  fi
done
for s in e f; do
  status=$(sed -n 's/^status=//p' "$OUT/$s/result" | tail -1)
  [[ $status == skipped ]] || fail "step $s should be skipped without python3 and a GPU, got: $status"
done
grep -q '"steps":\[' "$OUT/report.json" || fail "report.json has no steps"
((rc == 0)) || fail "run exited $rc although a-d passed"
echo "ok: a-d passed inside $ROOT (overlay), e and f skipped: $(sed -n 's/^reason=//p' "$OUT/e/result" | tail -1)"
