#!/usr/bin/env python3
"""torch_engine.py's stand-in for test-orchestration.sh: the same arguments and JSON, but no torch.
It loads the checkpoint through the CUDA driver API with ctypes (a private mmap of each
safetensors file, one cuMemAlloc and one cuMemcpyHtoD per tensor, the driver from
$FAKE_LIBCUDA), the way PyTorch's loader reaches the driver, so the shim sees an engine load
its weights and copy mode and zero-copy really happen on thaw's emulator. Its tokens are fixed.
$FAKE_FAIL_MODE=MODE makes runs of that --mode fail."""
import argparse, ctypes, json, mmap, os, struct, sys, time

start = float(os.environ.get("TORCH_ENGINE_START") or time.time())
p = argparse.ArgumentParser()
p.add_argument("--model", required=True)
p.add_argument("--mode", required=True)
p.add_argument("--graph", action="store_true")
p.add_argument("--prompt-ids", required=True)
p.add_argument("--max-new-tokens", type=int, default=8)
p.add_argument("--json")
p.add_argument("--dtype")
p.add_argument("--timeout", type=float)
a = p.parse_args()
lib = ctypes.CDLL(os.environ["FAKE_LIBCUDA"], mode=ctypes.RTLD_LOCAL)
gpa = lib.cuGetProcAddress_v2
gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p]
def fn(name, *argtypes):
    ptr = ctypes.c_void_p()
    st = ctypes.c_int()
    r = gpa(name.encode(), ctypes.byref(ptr), 12000, 0, ctypes.byref(st))
    if r != 0 or not ptr.value:
        sys.exit(f"no {name}: {r}")
    return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(ptr.value)
def check(r, what):
    if r != 0:
        raise SystemExit(f"{what} failed: CUDA error {r}")
vp = ctypes.c_void_p
check(fn("cuInit", ctypes.c_uint)(0), "cuInit")
dev = ctypes.c_int()
check(fn("cuDeviceGet", ctypes.POINTER(ctypes.c_int), ctypes.c_int)(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = vp()
check(fn("cuDevicePrimaryCtxRetain", ctypes.POINTER(vp), ctypes.c_int)(ctypes.byref(ctx), dev), "retain")
check(fn("cuCtxSetCurrent", vp)(ctx), "cuCtxSetCurrent")
alloc = fn("cuMemAlloc", ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)
h2d = fn("cuMemcpyHtoD", ctypes.c_uint64, vp, ctypes.c_size_t)
n = 0
for name in sorted(os.listdir(a.model)):
    if not name.endswith(".safetensors"):
        continue
    with open(os.path.join(a.model, name), "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    hl = struct.unpack("<Q", m[:8])[0]
    header = json.loads(m[8:8 + hl])
    for k, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0] if kv[0] != "__metadata__" else -1):
        if k == "__metadata__":
            continue
        b, e = t["data_offsets"]
        d = ctypes.c_uint64()
        check(alloc(ctypes.byref(d), e - b), f"cuMemAlloc({k})")
        src = ctypes.addressof(ctypes.c_char.from_buffer(m, 8 + hl + b))
        check(h2d(d.value, src, e - b), f"cuMemcpyHtoD({k})")
        n += 1
check(fn("cuCtxSynchronize")(), "sync")
now = time.time()
doc = {"mode": a.mode, "tokens": [11, 22, 33], "timings": {"model_loaded": now - start, "first_token": now - start + 0.01},
       "graph": {"ok": True} if a.graph else None, "tensors": n, "error": None}
if os.environ.get("FAKE_FAIL_MODE") == a.mode:
    print("fake failure", file=sys.stderr)
    sys.exit(1)
if a.json:
    with open(a.json, "w") as f:
        json.dump(doc, f)
print(json.dumps(doc))
