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
# Differences allowed (DELIBERATE below; a listed test may also pass under the shim):
# the deterministic layout serves cuMemAlloc with VMM memory (ARCHITECTURE.md), so
#   - range checks of copies and memsets see the whole 2 MiB mapping, not the allocation size;
#   - the allocation's context is not recorded with it: the CONTEXT attribute is NULL and
#     destroying the context does not free it;
#   - it is made with cuMemCreate/cuMemMap, which a global-mode stream capture does not refuse,
#     so cuMemAlloc during one succeeds where the driver answers STREAM_CAPTURE_UNSUPPORTED.
# These are known gaps to close, not intended behaviour: the list only keeps them from hiding
# new differences. KEEP=1 keeps both runs' JSON and logs.
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

# Deliberate (see the header): the layout's cuMemAlloc memory is VMM memory.
DELIBERATE = {
    # Range checks see the 2 MiB mapping, not the allocation's size.
    "MemoryTest.MemsetsPastTheEndOfAnAllocationAreInvalidValue",
    "MemoryTest.CopiesCrossingTheEndOfAnAllocationAreInvalidValue",
    # The allocation's context is not recorded with it.
    "MemoryTest.PointerAttributesOfDeviceMemory",
    "MemoryTest.PointerAttributesAgreeWithTheSingleQueries",
    "MemoryTest.DestroyingAContextFreesOnlyItsMemory",
    # cuMemCreate/cuMemMap are not refused during a global-mode capture.
    "Capture.MemAllocDuringAGlobalCaptureIsUnsupported",
    "Capture.UnsafeCallsOnAnotherThreadDuringAGlobalCaptureAreUnsupported",
    "Capture.ThreadLocalCaptureLetsOtherThreadsAllocate",
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
