#!/bin/sh
# Runs a driver client once on the driver alone and once under libthaw-preload.so with no
# thawd (THAW_SOCKET names a path where none listens), and fails when any answer differs:
# transparency is the shim's first promise (issue 22).
#
#   transparency_test.sh <client> <libcuda.so.1> <LD_PRELOAD value> <client args...>
set -eu
client=$1 libcuda=$2 preload=$3
shift 3
work=$(mktemp -d "${TMPDIR:-/tmp}/thaw-transparency.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Each run gets its own emulator state (memory ledger), a small device and no timing model.
run() {
  name=$1
  shift
  mkdir -p "$work/$name-state"
  rc=0
  env THAW_EMU_STATE_DIR="$work/$name-state" THAW_EMU_DEVICE_MEMORY=1G THAW_EMU_TIMING=0 \
      THAW_SOCKET="$work/no-thawd.sock" "$@" >"$work/$name.out" 2>"$work/$name.err" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "the $name run exited $rc:" >&2
    cat "$work/$name.out" "$work/$name.err" >&2
    exit 1
  fi
}
run driver "$client" "$libcuda" "$@"
run shim env LD_PRELOAD="$preload" "$client" "$libcuda" "$@"
# The shim's own notices go to stderr; only the client's answers (stdout) are compared.
if ! diff -u --label driver --label shim "$work/driver.out" "$work/shim.out"; then
  echo "answers differ under the shim (stderr of the shim run follows)" >&2
  cat "$work/shim.err" >&2
  exit 1
fi
echo "$(wc -l <"$work/driver.out") answers, the same with and without the shim"
