#!/usr/bin/env python3
"""An ordinary PyTorch program that captures a decode step as a CUDA graph and replays it.

The kit's step f runs it twice, each time in a fresh process under thaw's shim: the first run's
graph is recorded by the shim, the second run's capture is answered from that record
(transparently: this program does the same thing both times and knows nothing of thaw). Their
outputs must be bit-identical.

What it does: loads a GPT-2-layout checkpoint with transformers (from_pretrained, .to("cuda")),
builds one KV-cached GPT-2 decode step on static buffers from the model's own modules
(torch_engine.DecodeStep), warms it up on a side stream, captures it with torch.cuda.graph into
a torch.cuda.CUDAGraph, then decodes greedily by replaying the graph for every position of a
fixed prompt plus --steps new tokens. The same decode run eagerly is the check that the replay
computes the step at all (its tokens must match; logits within fp16 rounding).

Output (--json FILE, written atomically; a summary line on stdout): ok, tokens, eager_tokens,
logits_sha256 (SHA-256 of every replayed step's logits as float32 bytes, in order),
logits_head (the first 8 logits of the first generated token), capture_s, replay_step_ms,
error, phase. Exit status: 0 done, 1 failed (the JSON says where), 2 bad usage, 3 torch or
CUDA missing, 124 --timeout passed.
"""

import argparse
import faulthandler
import hashlib
import json
import os
import signal
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_engine import DecodeStep, parse_ids, positive_float, positive_int  # noqa: E402


def write_json(path, doc):
    if not path:
        return
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def logits_digest(torch, logits):
    """SHA-256 of the float32 bytes of every logits row, in order (numpy when torch has it)."""
    h = hashlib.sha256()
    for row in logits:
        t = row.detach().to("cpu", torch.float32).contiguous()
        try:
            data = t.numpy().tobytes()
        except (RuntimeError, TypeError, ImportError):
            # A torch built without numpy: the int32 view's values carry the same bits.
            data = json.dumps(t.view(torch.int32).flatten().tolist()).encode()
        h.update(data)
    return h.hexdigest()


def run(args, doc):
    doc["phase"] = "import torch"
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        doc["missing"] = str(e)
        return 3
    doc.update({"torch": torch.__version__, "transformers": transformers.__version__})
    if not torch.cuda.is_available():
        doc["missing"] = "torch.cuda.is_available() is False"
        return 3
    doc["phase"] = "load"
    dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    except TypeError as e:
        if "dtype" not in str(e):
            raise
        model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=dtype)
    model = model.to("cuda").eval()
    device = torch.device("cuda")
    n = args.steps
    with torch.inference_mode():
        step = DecodeStep(model, len(args.prompt_ids) + n, torch)
        doc["phase"] = "eager decode"
        eager_tokens, eager_logits = step.decode(args.prompt_ids, n, step)

        # Warm-up on a side stream (PyTorch's CUDA-graph notes: cuBLAS handles and workspaces
        # must exist before capture).
        doc["phase"] = "warm-up"
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                step.token.fill_(args.prompt_ids[0])
                step.pos.fill_(0)
                step()
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)

        doc["phase"] = "capture"
        t0 = time.time()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_logits = step()
        torch.cuda.synchronize(device)
        doc["capture_s"] = round(time.time() - t0, 4)

        doc["phase"] = "replay"

        def replay():
            graph.replay()
            return static_logits

        t1 = time.time()
        tokens, logits = step.decode(args.prompt_ids, n, replay)
        torch.cuda.synchronize(device)
        positions = len(args.prompt_ids) + n - 1
        doc["replay_step_ms"] = round(1000 * (time.time() - t1) / positions, 3)

    doc["phase"] = "report"
    max_diff = max(float((a - b).abs().max()) for a, b in zip(eager_logits, logits))
    doc.update({
        "tokens": tokens,
        "eager_tokens": eager_tokens,
        "logits_sha256": logits_digest(torch, logits),
        "logits_head": [float(v) for v in logits[0].flatten()[:8].tolist()],
        "logits_max_abs_diff_eager": max_diff,
        "steps": positions,
    })
    if tokens != eager_tokens or not max_diff <= 1e-2:
        doc["error"] = (f"the replayed graph disagrees with the eager step: tokens {tokens} vs "
                        f"{eager_tokens}, largest logit difference {max_diff:g}")
        return 1
    return 0


def main(argv):
    faulthandler.enable()
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    p = argparse.ArgumentParser(prog="torch_graph.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, metavar="DIR", help="a transformers GPT-2 checkpoint")
    p.add_argument("--prompt-ids", required=True, type=parse_ids, metavar="ID,ID,...")
    p.add_argument("--steps", type=positive_int, default=8, metavar="N",
                   help="tokens to generate by replaying the graph (default 8)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float16", "bfloat16", "float32"])
    p.add_argument("--json", metavar="OUT", help="write the result as JSON to OUT")
    p.add_argument("--timeout", type=positive_float, default=120.0, metavar="S",
                   help="give up after S seconds (exit 124; default 120)")
    args = p.parse_args(argv)
    doc = {"program": "torch_graph", "ok": False, "error": None, "missing": None,
           "pid": os.getpid(), "prompt_ids": args.prompt_ids}
    lock = threading.Lock()

    def finish(code):
        with lock:
            doc["exit_code"] = code
            doc["ok"] = code == 0
            try:
                write_json(args.json, doc)
            except OSError as e:
                print(f"torch_graph: cannot write {args.json}: {e}", file=sys.stderr)
            summary = {k: doc.get(k) for k in ("ok", "tokens", "logits_sha256", "error", "missing")}
            print("torch_graph: " + json.dumps(summary, sort_keys=True), flush=True)

    def expire():
        doc["error"] = f"timed out after {args.timeout:g} s in phase {doc.get('phase')}"
        finish(124)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(124)

    timer = threading.Timer(args.timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        code = run(args, doc)
    except Exception as e:  # noqa: BLE001 — every failure is reported with its phase
        traceback.print_exc()
        doc["error"] = f"{type(e).__name__}: {e}"[:2000]
        code = 1
    timer.cancel()
    finish(code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
