#!/bin/bash
# shellcheck disable=SC2016  # $ORIGIN is for the dynamic loader, literally: single quotes
# Assembles the real-GPU kit (issue 21): one self-contained directory that runs thaw's checks on
# a machine that has only bash and the NVIDIA driver (or, without a GPU, thaw's emulator).
# Called by the gpu-kit target (tools/gpu-kit/CMakeLists.txt; `make gpu-kit`), which passes
# every built file as NAME=PATH.
#
#   KIT/run     the entry point (tools/gpu-kit/run)
#   KIT/bin/    thawd thawctl thaw-fetch refengine thaw-genmodel thaw-vmm-bench
#               thaw-demo-report dbus-daemon
#   KIT/conformance/  the driver-conformance program with its suites, peer, test kernels and
#               module images (tests/emu/conformance; its --help)
#   KIT/lib/    libthaw-preload.so and every shared library the binaries need that is not
#               glibc, libstdc++ or libgcc_s (each binary's RUNPATH is $ORIGIN/../lib)
#   KIT/emu/    libcuda.so.1 (thaw's emulator) and the reference engine's kernel twins
#   KIT/share/  scripts and data the steps use, and the emulator's answers for step b
#
# usage: make-kit.sh --out DIR NAME=PATH...
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
die() { echo "make-kit: $*" >&2; exit 1; }
log() { echo "make-kit: $*" >&2; }

OUT=
declare -A FILE=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    *=*) FILE[${1%%=*}]=${1#*=}; shift ;;
    *) die "usage: make-kit.sh --out DIR NAME=PATH..." ;;
  esac
done
[[ -n $OUT ]] || die "--out DIR is required"
for tool in patchelf readelf strip ldd; do
  command -v "$tool" >/dev/null || die "$tool is missing: install Debian's ${tool/readelf/binutils}" \
    "(scripts/install-deps installs what thaw needs)"
done
need() { [[ -n ${FILE[$1]:-} && -f ${FILE[$1]} ]] || die "$1 was not built (${FILE[$1]:-no path given})"; }

# Built aside and renamed into place: an interrupted build never leaves half a kit.
NEW=$(mktemp -d "$(dirname "$OUT")/.gpu-kit.new.XXXXXX")
trap 'rm -rf "$NEW"' EXIT
mkdir -p "$NEW"/{bin,lib,emu,share}

# ---------------------------------------------------------------------------- binaries
for name in thawd thawctl thaw-fetch refengine thaw-genmodel thaw-vmm-bench thaw-demo-report; do
  need "$name"
  install -m 0755 "${FILE[$name]}" "$NEW/bin/$name"
done
# The conformance program finds its suites, peer and images next to itself.
[[ -x ${FILE[conformance-dir]:-}/thaw-driver-conformance ]] ||
  die "the driver-conformance program was not built (${FILE[conformance-dir]:-no path given})"
cp -r "${FILE[conformance-dir]}" "$NEW/conformance"

DBUS_DAEMON=$(command -v dbus-daemon || true)
[[ -n $DBUS_DAEMON ]] || die "dbus-daemon is missing: install Debian's dbus-daemon"
install -m 0755 "$DBUS_DAEMON" "$NEW/bin/dbus-daemon"
need preload
install -m 0755 "${FILE[preload]}" "$NEW/lib/libthaw-preload.so"
need libcuda
install -m 0755 "${FILE[libcuda]}" "$NEW/emu/libcuda.so.1"
need twins
install -m 0755 "${FILE[twins]}" "$NEW/emu/librefengine_kernels_twins.so"

# ------------------------------------------------------------------- shared libraries
# What the target machine is assumed to have: glibc and the GCC runtime (any distribution
# from 2022 on; the kit is built against Debian 12's glibc 2.36 and GCC 12's libstdc++).
system_lib() {
  # libcuda.so.1 is the driver under test: the machine's own, never a copy in the kit (the
  # emulator's lives in emu/ and is chosen with THAW_LIBCUDA).
  [[ $1 == libcuda.so.1 ]] && return 0
  [[ $1 =~ ^(libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libnss_[a-z]+|ld-linux-x86-64)\.so|^libstdc\+\+\.so|^libgcc_s\.so|^linux-vdso ]]
}
copy_deps() {  # copy_deps ELF: copy what ELF needs into lib/ (ldd lists the whole closure)
  local line name path
  while read -r line; do
    name=${line%% *}
    path=$(sed -n 's/.* => \(\/[^ ]*\) .*/\1/p' <<<"$line")
    [[ $line == *"not found"* ]] && die "$1 needs $name, which this machine does not have"
    system_lib "$name" && continue
    [[ -n $path ]] || continue
    [[ -f $NEW/lib/$name ]] || install -m 0644 "$(readlink -f "$path")" "$NEW/lib/$name"
  done < <(ldd "$1" | sed 's/^[[:space:]]*//')
}
elf() { [[ $(head -c 4 "$1" 2>/dev/null | od -An -c | tr -d ' ') == 177ELF ]]; }
for f in "$NEW"/bin/* "$NEW"/emu/* "$NEW"/conformance/*; do elf "$f" && copy_deps "$f"; done
# The shim is loaded into engines: it may bring nothing but the C/C++ runtime.
extra=$(readelf -d "$NEW/lib/libthaw-preload.so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' |
  while read -r n; do system_lib "$n" || echo "$n"; done)
[[ -z $extra ]] || die "libthaw-preload.so needs $extra: an engine would inherit it (see preload/CMakeLists.txt)"

for f in "$NEW"/bin/* "$NEW"/lib/*.so* "$NEW"/emu/*.so* "$NEW"/conformance/*; do
  if elf "$f"; then strip --strip-unneeded "$f" || die "strip failed on $f"; fi
done
for f in "$NEW"/bin/* "$NEW"/conformance/*; do
  elf "$f" || continue
  patchelf --set-rpath '$ORIGIN/../lib' "$f" || die "patchelf failed on $f"
done
for f in "$NEW"/lib/*.so*; do patchelf --set-rpath '$ORIGIN' "$f" || die "patchelf failed on $f"; done
for f in "$NEW"/emu/*.so*; do patchelf --set-rpath '$ORIGIN/../lib' "$f"; done

# ---------------------------------------------------------------------------- scripts
install -m 0755 "$SRC/tools/gpu-kit/run" "$NEW/run"
cp -r "$SRC/tools/gpu-kit/steps" "$NEW/share/steps"
install -m 0644 "$SRC/packaging/thawd.toml" "$NEW/share/thawd.toml"
install -m 0755 "$SRC/tools/demo/run-demo.sh" "$NEW/share/run-demo.sh"
install -m 0644 "$SRC/tools/demo/lib.sh" "$NEW/share/lib.sh"
install -m 0755 "$SRC/bench/vmm/run.sh" "$NEW/share/vmm-run.sh"
[[ -d $SRC/tools/gpu-kit/torch ]] && cp -r "$SRC/tools/gpu-kit/torch" "$NEW/share/torch"
git -C "$SRC" rev-parse --short=12 HEAD >"$NEW/share/commit" 2>/dev/null || echo unknown >"$NEW/share/commit"
git -C "$SRC" diff --quiet HEAD 2>/dev/null || echo "+local changes" >>"$NEW/share/commit"

# ------------------------------------------------------- the emulator's answers (step b)
# The kit carries what the reference engine generates on the emulator for the step-b model,
# so a real GPU's tokens are compared with them (the model is regenerated there from its seed).
log "recording the emulator's answers for step b"
"$NEW/share/steps/refengine.sh" --kit "$NEW" --emulator --record "$NEW/share/expected-tokens.txt" \
  --work "$NEW/.record" || die "could not record the emulator's answers (see above)"
rm -rf "$NEW/.record"

# ------------------------------------------------------------------------------ checks
# Every binary resolves inside the kit or to the system's C/C++ runtime.
for f in "$NEW"/bin/* "$NEW"/lib/*.so* "$NEW"/emu/*.so* "$NEW"/conformance/*; do
  elf "$f" || continue
  missing=$(ldd "$f" 2>/dev/null | grep "not found" | grep -v '^[[:space:]]*libcuda\.so\.1 ' || true)
  [[ -z $missing ]] || die "$f has an unresolved library: $missing"
  while read -r name path; do
    system_lib "$name" && continue
    [[ $path == "$NEW"/* ]] || die "$f resolves $name outside the kit ($path)"
  done < <(ldd "$f" 2>/dev/null | sed -n 's/^[[:space:]]*\([^ ]*\) => \([^ ]*\) .*/\1 \2/p')
done
SIZE_MIB=$(du -sm "$NEW" | cut -f1)
((SIZE_MIB <= 48)) || die "the kit is $SIZE_MIB MiB, over the 48 MiB a device run may carry"

rm -rf "$OUT"
mv -T "$NEW" "$OUT"
trap - EXIT
log "$OUT: $SIZE_MIB MiB, $(find "$OUT" -type f | wc -l) files; run: $OUT/run --out DIR [--quick]"
