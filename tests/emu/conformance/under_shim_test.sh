#!/bin/sh
# thaw-driver-conformance under libthaw-preload.so with no thawd (issue 22): the documented
# driver behaviour the emulator's suites pin must answer the same through the shim. Runs the
# program twice — on the driver alone and with LD_PRELOAD (THAW_SOCKET names a path where no
# thawd listens) — and fails when a test that passes on the driver alone does not pass, or is
# not skipped the same way, under the shim.
#
# Both runs set THAW_CONFORMANCE_DRIVER_ONLY=1, so the suites check what they check on a real
# driver: the emulator's own bookkeeping (its inspection calls: reservation and allocation
# counts, reserved bytes, legacy IPC mappings) also counts the shim's deliberate VA region and
# its translation of legacy IPC into VMM sharing, which is no driver answer.
#
# Differences allowed (DELIBERATE below; a listed test may also pass under the shim): the
# deterministic layout serves cuMemAlloc with VMM memory mapped in whole granules (2 MiB,
# ARCHITECTURE.md), so the driver's range checks of copies and memsets see the whole mapping,
# not the allocation's size: one that runs past the end of the allocation but stays inside its
# last granule is done where the driver refuses it. Closing that would mean hooking every copy
# and memset entry point (cuMemcpy*, cuMemsetD*, their Async, _ptds/_ptsz, 2D/3D and peer
# forms — a few dozen) to look each device pointer up in the layout: a lookup under the
# layout's lock on every copy an engine makes, for ranges only a buggy engine asks for. A known
# gap, not intended behaviour: the list only keeps it from hiding new differences.
#
# Closed earlier gaps, each with its own test here and in tests/preload/transparency
# (context-teardown, capture): the layout records each allocation's context (the CONTEXT
# attribute; cuCtxDestroy, the last cuDevicePrimaryCtxRelease and cuDevicePrimaryCtxReset free
# it), and a stream capture that forbids the caller to allocate gets the driver's own refusal
# (STREAM_CAPTURE_UNSUPPORTED, the capture invalidated). KEEP=1 keeps both runs' JSON and logs.
#
#   under_shim_test.sh <thaw-driver-conformance> <libcuda.so.1> <LD_PRELOAD value>
set -eu
runner=$1 libcuda=$2 preload=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/thaw-conformance-shim.XXXXXX")
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

export THAW_LIBCUDA="$libcuda" THAW_CONFORMANCE_DRIVER_ONLY=1
"$runner" --json "$work/driver.json" >"$work/driver.log" 2>&1 || true
env THAW_SOCKET="$work/no-thawd.sock" LD_PRELOAD="$preload" \
    "$runner" --json "$work/shim.json" >"$work/shim.log" 2>&1 || true

python3 - "$work/driver.json" "$work/shim.json" <<'PY'
import json, sys

# Deliberate (see the header): range checks see the layout's 2 MiB mapping, not the
# allocation's size.
DELIBERATE = {
    "MemoryTest.MemsetsPastTheEndOfAnAllocationAreInvalidValue",
    "MemoryTest.CopiesCrossingTheEndOfAnAllocationAreInvalidValue",
}
driver_json, shim_json = (json.load(open(p)) for p in sys.argv[1:3])
driver = {t["name"]: t for t in driver_json["tests"]}
shim = {t["name"]: t for t in shim_json["tests"]}
if not driver:
    sys.exit("the driver-alone run ran no tests")
bad, deliberate_seen = [], []
for name, t in sorted(driver.items()):
    if t["result"] not in ("passed", "skipped"):
        continue  # the driver's own failure: nothing to compare
    s = shim.get(name)
    got = s["result"] if s else "missing"
    if got == t["result"]:
        continue
    if name in DELIBERATE:
        deliberate_seen.append(name)
        continue
    bad.append(name)
    print(f"{name}: {t['result']} on the driver, {got} under the shim")
    if s:
        print("  " + (s.get("reason") or s.get("output", "")[-2000:]).replace("\n", "\n  "))
print(f"{len(driver)} tests; {len(deliberate_seen)} deliberate differences; {len(bad)} others")
sys.exit(1 if bad else 0)
PY
