#!/usr/bin/env python3
"""torch_graph.py's stand-in for test-graph-step.sh: the same arguments and JSON, no torch.

Through the CUDA driver API with ctypes (the driver from $THAW_LIBCUDA, thaw's emulator), the
way PyTorch reaches the driver: it loads the checkpoint's tensors (a private mmap of each
safetensors file in thawd's cache, cuMemAlloc + cuMemcpyHtoD per tensor, so the shim sees an
engine load a model and the run gets a layout identity), then captures a "decode step" on a
stream — memsets of a buffer whose values depend on the prompt and a device-to-device copy of
it — instantiates the graph, replays it once per step and reads the buffer back: its SHA-256
and the first values are the run's logits. Its tokens are derived from those bytes."""
import argparse, ctypes, hashlib, json, mmap, os, struct, sys

p = argparse.ArgumentParser()
p.add_argument("--model", required=True)
p.add_argument("--prompt-ids", required=True)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--dtype")
p.add_argument("--json")
p.add_argument("--timeout", type=float)
a = p.parse_args()
doc = {"program": "fake_graph", "ok": False, "error": None, "missing": None, "phase": "load"}


def finish(code):
    doc["ok"] = code == 0
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f)
    print("torch_graph: " + json.dumps({k: doc[k] for k in ("ok", "error")}))
    sys.exit(code)


lib = ctypes.CDLL(os.environ["THAW_LIBCUDA"], mode=ctypes.RTLD_LOCAL)
gpa = lib.cuGetProcAddress_v2
gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                ctypes.c_void_p]
vp, u64 = ctypes.c_void_p, ctypes.c_uint64


def fn(name, *argtypes):
    ptr, st = vp(), ctypes.c_int()
    r = gpa(name.encode(), ctypes.byref(ptr), 12000, 0, ctypes.byref(st))
    if r != 0 or not ptr.value:
        doc["error"] = f"no {name}: {r}"
        finish(1)
    return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(ptr.value)


def check(r, what):
    if r != 0:
        doc["error"] = f"{what} failed: CUDA error {r}"
        finish(1)


check(fn("cuInit", ctypes.c_uint)(0), "cuInit")
dev, ctx = ctypes.c_int(), vp()
check(fn("cuDeviceGet", ctypes.POINTER(ctypes.c_int), ctypes.c_int)(ctypes.byref(dev), 0), "cuDeviceGet")
check(fn("cuDevicePrimaryCtxRetain", ctypes.POINTER(vp), ctypes.c_int)(ctypes.byref(ctx), dev), "retain")
check(fn("cuCtxSetCurrent", vp)(ctx), "cuCtxSetCurrent")
alloc = fn("cuMemAlloc", ctypes.POINTER(u64), ctypes.c_size_t)
h2d = fn("cuMemcpyHtoD", u64, vp, ctypes.c_size_t)
for name in sorted(os.listdir(a.model)):
    if not name.endswith(".safetensors"):
        continue
    with open(os.path.join(a.model, name), "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    hl = struct.unpack("<Q", m[:8])[0]
    header = json.loads(m[8:8 + hl])
    for k, t in sorted((kv for kv in header.items() if kv[0] != "__metadata__"),
                       key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        d = u64()
        check(alloc(ctypes.byref(d), e - b), f"cuMemAlloc({k})")
        check(h2d(d.value, ctypes.addressof(ctypes.c_char.from_buffer(m, 8 + hl + b)), e - b),
              f"cuMemcpyHtoD({k})")

doc["phase"] = "capture"
N = 4096
buf, out = u64(), u64()
check(alloc(ctypes.byref(buf), N * 4), "cuMemAlloc(buf)")
check(alloc(ctypes.byref(out), N * 4), "cuMemAlloc(out)")
stream, graph, exe = vp(), vp(), vp()
check(fn("cuStreamCreate", ctypes.POINTER(vp), ctypes.c_uint)(ctypes.byref(stream), 1), "cuStreamCreate")
ids = [int(t) for t in a.prompt_ids.split(",")]
check(fn("cuStreamBeginCapture", vp, ctypes.c_int)(stream, 0), "cuStreamBeginCapture")
memset = fn("cuMemsetD32Async", u64, ctypes.c_uint, ctypes.c_size_t, vp)
check(memset(buf.value, sum(ids) * 2654435761 % 2**32, N, stream), "cuMemsetD32Async")
check(memset(buf.value, len(ids), N // 4, stream), "cuMemsetD32Async")
check(fn("cuMemcpyDtoDAsync", u64, u64, ctypes.c_size_t, vp)(out.value, buf.value, N * 4, stream),
      "cuMemcpyDtoDAsync")
check(fn("cuStreamEndCapture", vp, ctypes.POINTER(vp))(stream, ctypes.byref(graph)), "cuStreamEndCapture")
check(fn("cuGraphInstantiateWithFlags", ctypes.POINTER(vp), vp, ctypes.c_ulonglong)(
    ctypes.byref(exe), graph, 1), "cuGraphInstantiateWithFlags")
doc["phase"] = "replay"
h = hashlib.sha256()
host = (ctypes.c_uint32 * N)()
for _ in range(a.steps):
    check(fn("cuGraphLaunch", vp, vp)(exe, stream), "cuGraphLaunch")
    check(fn("cuStreamSynchronize", vp)(stream), "cuStreamSynchronize")
    check(fn("cuMemcpyDtoH", vp, u64, ctypes.c_size_t)(ctypes.addressof(host), out.value, N * 4),
          "cuMemcpyDtoH")
    h.update(bytes(host))
doc.update({"tokens": [int(host[0]) % 50000, int(host[N - 1]) % 50000],
            "logits_sha256": h.hexdigest(), "logits_head": [int(v) for v in host[:4]],
            "capture_s": 0.0, "phase": "done"})
finish(0)
