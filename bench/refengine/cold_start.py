#!/usr/bin/env python3
"""Cold-start breakdown of the reference engine on the emulator (issue 4; HydraServe Fig. 1).

Runs `refengine generate` on a synthetic gpt2-medium with the emulator's default timing model
(THAW_EMU_TIMING=1: PCIe 25 GB/s per direction, page and launch latencies), reads the phase
timeline the engine writes, and prints how long each phase took: process start -> driver
init -> allocator -> each weight file -> profile run + KV sizing -> KV cache -> CUDA graphs ->
ready -> first token. It runs twice in the same invocation, with CUDA graphs (vLLM's default)
and with --enforce-eager, and prints the ratio of their times to ready: what graph capture
costs a cold start (the overhead MEDUSA removes).

Kernels run as host twins on the CPU, so phases that execute kernels (profile run, graph
warm-ups, decoding) take this machine's CPU time rather than an H100's; copy phases follow the
timing model. Read the numbers as a breakdown of where a cold start spends its time here.

Usage: bench/refengine/cold_start.py [--build build/default] [--model-dir DIR] [--twins LIB]
                                     [--json]

--twins picks the kernel library (THAW_EMU_KERNELS; default the shipped
librefengine_kernels_twins.so): tools/refengine/librefengine_kernels_twins_reference.so is the
kernel-mirroring twins from before issue 20, for a before/after.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

PHASES = [
    ("driver_init", "CUDA driver init + context"),
    ("allocator_ready", "allocator + kernel module"),
    ("weights_loaded", "weights (all files)"),
    ("profile_done", "profile run + cuMemGetInfo"),
    ("kv_cache_ready", "KV cache allocation"),
    ("graphs_captured", "CUDA graph capture"),
    ("ready", "ready"),
    ("first_token", "first token (prefill)"),
]


def run_engine(build, model, extra, workdir, name, twins):
    timeline = os.path.join(workdir, f"{name}.timeline.jsonl")
    env = dict(os.environ)
    env.update({
        "REFENGINE_LIBCUDA": os.path.join(build, "emu", "libcuda.so.1"),
        "THAW_EMU_KERNELS": twins,
        "THAW_EMU_STATE_DIR": tempfile.mkdtemp(prefix="emu-state-", dir=workdir),
        "THAW_EMU_TIMING": "1",
        "THAW_EMU_DEVICE_MEMORY": "80G",
    })
    cmd = [os.path.join(build, "tools", "refengine", "refengine"), "generate", "--model", model,
           "--tokens", "464,2068,7586,21831,18045,625,262,16931,3290", "--max-tokens", "2",
           "--ignore-eos", "--max-num-seqs", "8", "--max-model-len", "64",
           "--gpu-memory-utilization", "0.9", "--timeline", timeline] + extra
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(timeline) as f:
        return [json.loads(line) for line in f if line.strip()]


def breakdown(events):
    by = {e["event"]: e for e in events}
    rows, prev = [], 0.0
    files = [e for e in events if e["event"] == "weights_file_loaded"]
    for key, label in PHASES:
        if key not in by:
            continue
        if key == "weights_loaded":
            for f in files:
                rows.append((f"  weights file {os.path.basename(f['file'])} "
                             f"({f['bytes'] / 1e6:.0f} MB)", f["since_start_ms"] - prev))
                prev = f["since_start_ms"]
        t = by[key]["since_start_ms"]
        rows.append((label, t - prev))
        prev = t
    return rows, by


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build/default")
    ap.add_argument("--model-dir", help="where the synthetic gpt2-medium is (or is written)")
    ap.add_argument("--twins", help="kernel library (default: the build's shipped twins)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    twins = os.path.abspath(args.twins) if args.twins else os.path.join(
        build, "tools", "refengine", "librefengine_kernels_twins.so")
    workdir = tempfile.mkdtemp(prefix="refengine-bench-")
    model = args.model_dir or os.path.join(build, "bench-models", "gpt2-medium-f32")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([os.path.join(build, "tools", "genmodel", "thaw-genmodel"), "--size", "medium",
                        "--dtype", "f32", "--shard-size", "500MB", "--out", model, "--quiet"],
                       check=True)
    results = {}
    for name, extra in (("graphs", []), ("eager", ["--enforce-eager"])):
        rows, by = breakdown(run_engine(build, model, extra, workdir, name, twins))
        results[name] = {"rows": rows, "ready_ms": by["ready"]["since_start_ms"],
                         "first_token_ms": by["first_token"]["since_start_ms"],
                         "weights_bytes": by["weights_loaded"]["bytes"]}
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        print()
        return
    for name, r in results.items():
        print(f"\n== gpt2-medium f32 ({r['weights_bytes'] / 1e9:.2f} GB), {name}, "
              f"{os.path.basename(twins)} ==")
        for label, ms in r["rows"]:
            print(f"  {label:<48} {ms:10.1f} ms")
        print(f"  {'time to ready':<48} {r['ready_ms']:10.1f} ms")
        print(f"  {'time to first token':<48} {r['first_token_ms']:10.1f} ms")
    g, e = results["graphs"], results["eager"]
    print(f"\ntime to ready, graphs / eager: {g['ready_ms'] / e['ready_ms']:.2f}x "
          f"({g['ready_ms']:.0f} ms vs {e['ready_ms']:.0f} ms)")


if __name__ == "__main__":
    main()
