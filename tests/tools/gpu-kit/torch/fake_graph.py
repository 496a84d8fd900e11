#!/usr/bin/env python3
"""torch_graph.py's stand-in for test-graph-step.sh: the same arguments and JSON, no torch.

Through the CUDA driver API with ctypes (the driver from $THAW_LIBCUDA, thaw's emulator), the
way PyTorch reaches the driver: it loads the checkpoint's tensors (a private mmap of each
safetensors file in thawd's cache, cuMemAlloc + cuMemcpyHtoD per tensor, so the shim sees an
engine load a model and the run gets a layout identity), loads the reference engine's kernel
module ($FAKE_CUBIN, cuModuleLoadData; the emulator runs the kernels' CPU twins), then captures
a "decode step" on a stream — a chain of residual_add_f32 and gelu_new_f32 launches on a buffer
whose values depend on the prompt — instantiates the graph, replays it once per step and reads
the buffer back after each: the SHA-256 of those bytes and the first values are the run's
logits, its tokens are derived from them."""
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

doc["phase"] = "module"
with open(os.environ["FAKE_CUBIN"], "rb") as f:
    image = f.read()
module, add_fn, gelu_fn = vp(), vp(), vp()
check(fn("cuModuleLoadData", ctypes.POINTER(vp), ctypes.c_char_p)(ctypes.byref(module), image),
      "cuModuleLoadData")
get_fn = fn("cuModuleGetFunction", ctypes.POINTER(vp), vp, ctypes.c_char_p)
check(get_fn(ctypes.byref(add_fn), module, b"residual_add_f32"), "cuModuleGetFunction(residual_add_f32)")
check(get_fn(ctypes.byref(gelu_fn), module, b"gelu_new_f32"), "cuModuleGetFunction(gelu_new_f32)")

doc["phase"] = "capture"
N = 4096
buf, y = u64(), u64()
check(alloc(ctypes.byref(buf), N * 4), "cuMemAlloc(buf)")
check(alloc(ctypes.byref(y), N * 4), "cuMemAlloc(y)")
ids = [int(t) for t in a.prompt_ids.split(",")]
memset = fn("cuMemsetD32", u64, ctypes.c_uint, ctypes.c_size_t)
# Floats from the prompt, set before the capture (memset nodes are not what an engine's decode
# step is made of).
check(memset(buf.value, 0x3f000000 + sum(ids) % 4096, N), "cuMemsetD32(buf)")
check(memset(y.value, 0x3c000000 + len(ids), N), "cuMemsetD32(y)")
# The memsets run on the legacy stream, asynchronously to the host (as on CUDA), and the capture
# stream below is non-blocking: it does not wait for them. torch_graph.py synchronizes before
# it captures; so does this. Without it, a second run whose capture the shim restores at once
# launched the graph while buf was still being set (1 run in 6 under load: element 0's value
# a few ulps off after 24 contracting steps, tokens [47639, ...] instead of [47643, ...]).
check(fn("cuCtxSynchronize")(), "cuCtxSynchronize")
stream, graph, exe = vp(), vp(), vp()
check(fn("cuStreamCreate", ctypes.POINTER(vp), ctypes.c_uint)(ctypes.byref(stream), 1), "cuStreamCreate")
launch = fn("cuLaunchKernel", vp, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
            ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, vp, ctypes.POINTER(vp), ctypes.POINTER(vp))
p_buf, p_y, p_n = u64(buf.value), u64(y.value), ctypes.c_int(N)
add_args = (vp * 3)(ctypes.cast(ctypes.byref(p_buf), vp), ctypes.cast(ctypes.byref(p_y), vp),
                    ctypes.cast(ctypes.byref(p_n), vp))
gelu_args = (vp * 2)(ctypes.cast(ctypes.byref(p_buf), vp), ctypes.cast(ctypes.byref(p_n), vp))
check(fn("cuStreamBeginCapture", vp, ctypes.c_int)(stream, 0), "cuStreamBeginCapture")
for _ in range(3):
    check(launch(add_fn, N // 256, 1, 1, 256, 1, 1, 0, stream, add_args, None), "cuLaunchKernel(add)")
    check(launch(gelu_fn, N // 256, 1, 1, 256, 1, 1, 0, stream, gelu_args, None), "cuLaunchKernel(gelu)")
check(fn("cuStreamEndCapture", vp, ctypes.POINTER(vp))(stream, ctypes.byref(graph)), "cuStreamEndCapture")
check(fn("cuGraphInstantiateWithFlags", ctypes.POINTER(vp), vp, ctypes.c_ulonglong)(
    ctypes.byref(exe), graph, 1), "cuGraphInstantiateWithFlags")
doc["phase"] = "replay"
h = hashlib.sha256()
host = (ctypes.c_uint32 * N)()
for _ in range(a.steps):
    check(fn("cuGraphLaunch", vp, vp)(exe, stream), "cuGraphLaunch")
    check(fn("cuStreamSynchronize", vp)(stream), "cuStreamSynchronize")
    check(fn("cuMemcpyDtoH", vp, u64, ctypes.c_size_t)(ctypes.addressof(host), buf.value, N * 4),
          "cuMemcpyDtoH")
    h.update(bytes(host))
doc.update({"tokens": [int(host[0]) % 50000, int(host[N - 1]) % 50000],
            "logits_sha256": h.hexdigest(), "logits_head": [int(v) for v in host[:4]],
            "capture_s": 0.0, "phase": "done"})
finish(0)
