#!/usr/bin/env python3
"""An ordinary PyTorch + transformers program: load a GPT-2 checkpoint onto the GPU, generate
greedily, and say how long each phase took from the moment the process started.

It knows nothing about thaw (the kit's step e runs it with and without thaw's shim and compares
what it prints). Only torch and transformers are used, the way a user's script would use them:

  --mode to_cuda      AutoModelForCausalLM.from_pretrained(DIR, dtype=...) then .to("cuda")
  --mode device_map   AutoModelForCausalLM.from_pretrained(DIR, dtype=..., device_map="cuda")
  --graph             also capture one decode step (a KV-cached GPT-2 step on static buffers)
                      with torch.cuda.CUDAGraph, after a warm-up on a side stream, replay it for
                      the whole sequence and check its logits and tokens against the same step
                      run eagerly

Timings are seconds since the process started: $TORCH_ENGINE_START (seconds since the epoch,
taken by whoever started the process) when set, else the kernel's start time of this process
(/proc/self/stat, 10 ms resolution).

Output: one JSON object (--json FILE, written atomically, and a summary on stdout). Exit
status: 0 done, 1 failed (the JSON says where: "phase", "error"), 2 bad usage, 3 a
prerequisite is missing (no torch, no CUDA device, no accelerate for device_map: "missing"),
124 --timeout passed (the JSON says in which phase; tracebacks of every thread on stderr).
"""

import argparse
import faulthandler
import json
import math
import os
import signal
import sys
import threading
import time
import traceback

T_INTERPRETER = time.time()

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_MISSING = 3
EXIT_TIMEOUT = 124


def process_start():
    """(seconds since the epoch when this process started, where that figure came from)."""
    given = os.environ.get("TORCH_ENGINE_START", "").strip()
    if given:
        try:
            return float(given), "TORCH_ENGINE_START"
        except ValueError:
            pass
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            stat = f.read()
        # Field 22 (starttime, clock ticks after boot); the command name (field 2) may hold
        # spaces and parentheses, so count from the last ')'.
        start_ticks = int(stat[stat.rindex(")") + 2:].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        now = time.time()
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        return now - max(age, 0.0), "/proc/self/stat"
    except (OSError, ValueError, IndexError):
        return T_INTERPRETER, "interpreter start"


START, START_SOURCE = process_start()


def since_start(t=None):
    return round((time.time() if t is None else t) - START, 4)


class Run:
    """What the program found so far; written out once, at the end, on error or on timeout."""

    def __init__(self, json_path):
        self.json_path = json_path
        self.lock = threading.Lock()
        self.written = False
        self.phase = "arguments"
        self.doc = {
            "program": "torch_engine",
            "start_source": START_SOURCE,
            "timings": {},
            "tokens": None,
            "error": None,
            "missing": None,
        }

    def enter(self, phase):
        self.phase = phase

    def mark(self, name):
        self.doc["timings"][name] = since_start()

    def finish(self, code, error=None, missing=None):
        with self.lock:
            if self.written:
                return False
            self.written = True
            self.doc["phase"] = self.phase if code != 0 else "done"
            self.doc["exit_code"] = code
            if error is not None:
                self.doc["error"] = error
            if missing is not None:
                self.doc["missing"] = missing
            text = json.dumps(self.doc, indent=1, sort_keys=True)
            if self.json_path:
                tmp = f"{self.json_path}.tmp.{os.getpid()}"
                try:
                    with open(tmp, "w", encoding="utf-8") as f:
                        f.write(text + "\n")
                    os.replace(tmp, self.json_path)
                except OSError as e:
                    print(f"torch_engine: cannot write {self.json_path}: {e}", file=sys.stderr)
            summary = {k: self.doc.get(k) for k in ("mode", "tokens", "error", "missing")}
            summary["first_token_s"] = self.doc["timings"].get("first_token")
            if "graph" in self.doc:
                summary["graph_ok"] = self.doc["graph"].get("ok")
            print("torch_engine: " + json.dumps(summary, sort_keys=True), flush=True)
            return True


def parse_ids(text):
    try:
        ids = [int(t) for t in text.split(",") if t.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of token ids: {text!r}")
    if not ids:
        raise argparse.ArgumentTypeError("at least one prompt token id is needed")
    if any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"token ids are non-negative: {text!r}")
    return ids


def positive_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}")
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return v


def positive_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}")
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be above 0: {text!r}")
    return v


def arguments(argv):
    p = argparse.ArgumentParser(
        prog="torch_engine.py",
        description="Load a GPT-2 checkpoint with transformers onto the GPU, generate greedily, "
        "report the tokens and the time from process start to the first token.",
    )
    p.add_argument("--model", required=True, metavar="DIR",
                   help="a transformers checkpoint directory (config.json + safetensors)")
    p.add_argument("--mode", required=True, choices=["to_cuda", "device_map"],
                   help='to_cuda: from_pretrained then .to("cuda"); '
                   'device_map: from_pretrained(..., device_map="cuda")')
    p.add_argument("--graph", action="store_true",
                   help="also capture a decode step with torch.cuda.CUDAGraph and replay it")
    p.add_argument("--prompt-ids", required=True, type=parse_ids, metavar="ID,ID,...",
                   help="the prompt as token ids, e.g. 464,2068,7586")
    p.add_argument("--max-new-tokens", type=positive_int, default=8, metavar="N",
                   help="tokens to generate (default 8; end-of-text does not stop it early)")
    p.add_argument("--json", metavar="OUT", help="write the result as JSON to OUT")
    p.add_argument("--dtype", default="auto", choices=["auto", "float16", "bfloat16", "float32"],
                   help="weights' dtype (default auto: the checkpoint's)")
    p.add_argument("--device", default="cuda", help="torch device (default cuda)")
    p.add_argument("--timeout", type=positive_float, default=300.0, metavar="S",
                   help="give up after S seconds (exit 124; default 300)")
    return p.parse_args(argv)


def read_config(model_dir):
    """config.json of the checkpoint, checked before torch is imported (clear errors, fast)."""
    if not os.path.isdir(model_dir):
        raise UsageError(f"--model {model_dir}: not a directory")
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"--model {model_dir}: no config.json (not a transformers checkpoint)")
    except (OSError, ValueError) as e:
        raise UsageError(f"--model {model_dir}: config.json unreadable: {e}")
    if not isinstance(config, dict):
        raise UsageError(f"{path}: not a JSON object")
    names = os.listdir(model_dir)
    if not any(n.endswith(".safetensors") or n.endswith(".bin") for n in names):
        raise UsageError(f"--model {model_dir}: no weights (*.safetensors) in it")
    return config


class UsageError(Exception):
    pass


class Missing(Exception):
    def __init__(self, what, message):
        super().__init__(message)
        self.what = what


def first_token_streamer():
    """A generate() streamer that only takes times: its first put() is the prompt, each later
    one a new token (already copied to the host, so the GPU has produced it)."""
    try:
        from transformers.generation.streamers import BaseStreamer
    except ImportError:
        BaseStreamer = object

    class FirstTokenStreamer(BaseStreamer):
        def __init__(self):
            self.calls = 0
            self.token_times = []

        def put(self, value):
            self.calls += 1
            if self.calls > 1:
                self.token_times.append(time.time())

        def end(self):
            pass

    return FirstTokenStreamer()


def load_model(args, run, torch, transformers):
    from transformers import AutoModelForCausalLM

    dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype)
    kwargs = {"dtype": dtype}
    if args.mode == "device_map":
        kwargs["device_map"] = args.device
    run.enter("from_pretrained")
    t0 = time.time()
    try:
        model = AutoModelForCausalLM.from_pretrained(args.model, **kwargs)
    except TypeError as e:
        # transformers 4.x before `dtype=`: the old keyword (the program supports both).
        if "dtype" not in str(e):
            raise
        kwargs["torch_dtype"] = kwargs.pop("dtype")
        model = AutoModelForCausalLM.from_pretrained(args.model, **kwargs)
    except (ImportError, ValueError) as e:
        if args.mode == "device_map" and "accelerate" in str(e):
            raise Missing("accelerate", f"device_map needs the accelerate package: {e}")
        raise
    run.doc["from_pretrained_s"] = round(time.time() - t0, 4)
    if args.mode == "to_cuda":
        run.enter("to_cuda")
        t1 = time.time()
        model = model.to(args.device)
        run.doc["to_device_s"] = round(time.time() - t1, 4)
    model.eval()
    return model


def generate(args, run, model, torch):
    run.enter("generate")
    device = model.device
    input_ids = torch.tensor([args.prompt_ids], dtype=torch.long, device=device)
    attention_mask = torch.ones_like(input_ids)
    eos = model.generation_config.eos_token_id
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = eos if eos is not None else 0
    streamer = first_token_streamer()
    t0 = time.time()
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=False,
            num_beams=1,
            max_new_tokens=args.max_new_tokens,
            min_new_tokens=args.max_new_tokens,  # the same length every run: no early stop
            pad_token_id=pad,
            streamer=streamer,
        )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t1 = time.time()
    tokens = out[0, input_ids.shape[1]:].tolist()
    if streamer.token_times:
        run.doc["timings"]["first_token"] = since_start(streamer.token_times[0])
        if len(streamer.token_times) > 1:
            steps = [b - a for a, b in zip(streamer.token_times, streamer.token_times[1:])]
            run.doc["decode_step_ms"] = round(1000 * sorted(steps)[len(steps) // 2], 3)
    else:
        # A transformers without streamer calls: the end of generate is the bound we have.
        run.doc["timings"]["first_token"] = since_start(t1)
        run.doc["first_token_note"] = "generate() never called the streamer: end of generate"
    run.doc["generate_s"] = round(t1 - t0, 4)
    run.mark("generated")
    return tokens


class DecodeStep:
    """One GPT-2 decode step on static buffers: the token and its position in, the logits of
    the next token out, keys and values written into a preallocated KV cache. Built from the
    loaded model's own modules (embeddings, layer norms, attention and MLP projections, head),
    so a replay of its CUDA graph runs the same weights as generate()."""

    def __init__(self, model, max_len, torch):
        import torch.nn.functional as F

        self.torch, self.F = torch, F
        config = model.config
        try:
            tr = model.transformer
            self.wte, self.wpe, self.ln_f = tr.wte, tr.wpe, tr.ln_f
            self.blocks = list(tr.h)
            self.head = model.lm_head
            for b in self.blocks:
                b.ln_1, b.attn.c_attn, b.attn.c_proj, b.ln_2, b.mlp  # noqa: B018
        except AttributeError as e:
            raise RuntimeError(f"the model is not laid out as transformers' GPT-2 ({e})")
        self.E = config.n_embd
        self.H = config.n_head
        self.D = self.E // self.H
        self.T = max_len
        device = self.wte.weight.device
        dtype = self.wte.weight.dtype
        shape = (len(self.blocks), 1, self.H, self.T, self.D)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.token = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.pos = torch.zeros((1,), dtype=torch.long, device=device)
        self.slots = torch.arange(self.T, device=device)
        scale = 1.0 / math.sqrt(self.D) if getattr(config, "scale_attn_weights", True) else 1.0
        by_layer = getattr(config, "scale_attn_by_inverse_layer_idx", False)
        self.scales = [scale / (i + 1) if by_layer else scale for i in range(len(self.blocks))]

    def reset(self):
        self.k_cache.zero_()
        self.v_cache.zero_()

    def __call__(self):
        E, H, D = self.E, self.H, self.D
        x = self.wte(self.token) + self.wpe(self.pos.view(1, 1))
        mask = (self.slots <= self.pos).view(1, 1, 1, self.T)
        for i, b in enumerate(self.blocks):
            q, k, v = b.attn.c_attn(b.ln_1(x)).split(E, dim=2)
            q = q.view(1, 1, H, D).transpose(1, 2)
            k = k.view(1, 1, H, D).transpose(1, 2)
            v = v.view(1, 1, H, D).transpose(1, 2)
            self.k_cache[i].index_copy_(2, self.pos, k)
            self.v_cache[i].index_copy_(2, self.pos, v)
            a = self.F.scaled_dot_product_attention(
                q, self.k_cache[i], self.v_cache[i], attn_mask=mask, scale=self.scales[i])
            x = x + b.attn.c_proj(a.transpose(1, 2).reshape(1, 1, E))
            x = x + b.mlp(b.ln_2(x))
        return self.head(self.ln_f(x))[:, -1, :]

    def decode(self, prompt, new_tokens, one_step):
        """Greedy decoding, one step per position: (tokens, logits of each generated token)."""
        self.reset()
        seq = list(prompt)
        tokens, logits = [], []
        for p in range(len(prompt) + new_tokens - 1):
            self.token.fill_(seq[p])
            self.pos.fill_(p)
            out = one_step()
            if p >= len(prompt) - 1:
                out = out.float().clone()
                nxt = int(out.argmax(dim=-1).item())
                logits.append(out)
                tokens.append(nxt)
                seq.append(nxt)
        return tokens, logits


def graph_check(args, run, model, torch, generated):
    """Capture one decode step as a CUDA graph and replay it for every position; its logits
    must be those of the same step run eagerly (the tokens equal, the logits within
    fp16 rounding; bitwise equality is reported)."""
    run.enter("graph: eager decode")
    g_doc = run.doc.setdefault("graph", {"ok": False})
    n = args.max_new_tokens
    with torch.inference_mode():  # the step's buffers too: they are updated in place in it
        step = DecodeStep(model, len(args.prompt_ids) + n, torch)
        device = step.token.device
        if device.type != "cuda":
            raise RuntimeError(f"--graph needs a CUDA device, the model is on {device}")
        t0 = time.time()
        eager_tokens, eager_logits = step.decode(args.prompt_ids, n, step)
        torch.cuda.synchronize(device)
        eager_s = time.time() - t0

        # Warm-up on a side stream before capture (PyTorch's CUDA graphs notes: lazy
        # initialisation — cuBLAS handles, workspaces, autotuning — must not happen in capture).
        run.enter("graph: warm-up on a side stream")
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                step.token.fill_(args.prompt_ids[0])
                step.pos.fill_(0)
                step()
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)

        run.enter("graph: capture")
        t1 = time.time()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_logits = step()
        torch.cuda.synchronize(device)
        capture_s = time.time() - t1

        run.enter("graph: replay")

        def replay():
            graph.replay()
            return static_logits

        t2 = time.time()
        graph_tokens, graph_logits = step.decode(args.prompt_ids, n, replay)
        torch.cuda.synchronize(device)
        replay_s = time.time() - t2

    bitwise = all(torch.equal(a, b) for a, b in zip(eager_logits, graph_logits))
    max_diff = max(float((a - b).abs().max()) for a, b in zip(eager_logits, graph_logits))
    finite = all(bool(torch.isfinite(a).all()) for a in eager_logits)
    positions = len(args.prompt_ids) + n - 1
    g_doc.update({
        "steps": positions,
        "eager_tokens": eager_tokens,
        "graph_tokens": graph_tokens,
        "tokens_equal_eager": graph_tokens == eager_tokens,
        "logits_bitwise_equal": bitwise,
        "logits_max_abs_diff": max_diff,
        "logits_finite": finite,
        # The static step computes attention its own way (SDPA on a static KV cache), so its
        # tokens may differ from generate()'s where two logits are nearly equal: reported only.
        "tokens_equal_generate": graph_tokens == generated,
        "eager_step_ms": round(1000 * eager_s / positions, 3),
        "replay_step_ms": round(1000 * replay_s / positions, 3),
        "capture_s": round(capture_s, 4),
    })
    g_doc["ok"] = bool(g_doc["tokens_equal_eager"] and finite and max_diff <= 1e-2)
    if not g_doc["ok"]:
        raise RuntimeError(
            f"the replayed graph disagrees with the eager step: tokens {graph_tokens} vs "
            f"{eager_tokens}, largest logit difference {max_diff:g}, finite {finite}")


def watchdog(run, seconds):
    def expire():
        if run.finish(EXIT_TIMEOUT, error=f"timed out after {seconds:g} s in phase: {run.phase}"):
            print(f"torch_engine: timed out after {seconds:g} s in phase {run.phase}; "
                  "every thread's stack:", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
            os._exit(EXIT_TIMEOUT)

    t = threading.Timer(seconds, expire)
    t.daemon = True
    t.start()
    return t


def main(argv):
    faulthandler.enable()  # a crash (say, inside a CUDA library) still shows where Python was
    # Killed from outside (a caller's timeout): every thread's stack first, then the default
    # action — even while the main thread is blocked inside a C call.
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    args = arguments(argv)
    run = Run(args.json)
    run.doc.update({
        "mode": args.mode,
        "graph_requested": args.graph,
        "model": os.path.abspath(args.model),
        "prompt_ids": args.prompt_ids,
        "max_new_tokens": args.max_new_tokens,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "pid": os.getpid(),
    })
    watchdog(run, args.timeout)
    try:
        config = read_config(args.model)
        vocab = config.get("vocab_size")
        positions = config.get("n_positions", config.get("max_position_embeddings"))
        if isinstance(vocab, int) and max(args.prompt_ids) >= vocab:
            raise UsageError(f"--prompt-ids: id {max(args.prompt_ids)} is not below the model's "
                             f"vocab_size {vocab}")
        if isinstance(positions, int) and len(args.prompt_ids) + args.max_new_tokens > positions:
            raise UsageError(f"prompt ({len(args.prompt_ids)}) + --max-new-tokens "
                             f"({args.max_new_tokens}) exceed the model's {positions} positions")

        run.enter("import torch")
        try:
            import torch
        except ImportError as e:
            raise Missing("torch", f"torch is not importable: {e}")
        run.mark("torch_imported")
        run.enter("import transformers")
        try:
            import transformers
        except ImportError as e:
            raise Missing("transformers", f"transformers is not importable: {e}")
        run.mark("transformers_imported")
        run.doc.update({"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                        "transformers": transformers.__version__})

        run.enter("CUDA init")
        if torch.device(args.device).type == "cuda":
            if not torch.cuda.is_available():
                raise Missing("cuda", "torch.cuda.is_available() is False (no GPU, no driver, or a "
                              "CPU-only torch)")
            torch.cuda.init()
            run.doc["device_name"] = torch.cuda.get_device_name(torch.device(args.device))
        run.mark("cuda_ready")

        model = load_model(args, run, torch, transformers)
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        run.mark("model_loaded")
        run.doc["dtype"] = str(next(model.parameters()).dtype).replace("torch.", "")
        run.doc["model_device"] = str(model.device)
        run.doc["parameters"] = sum(p.numel() for p in model.parameters())

        tokens = generate(args, run, model, torch)
        run.doc["tokens"] = tokens
        if args.graph:
            graph_check(args, run, model, torch, tokens)
            run.mark("graph_checked")
        if model.device.type == "cuda":
            run.doc["max_memory_allocated"] = torch.cuda.max_memory_allocated(model.device)
        run.mark("done")
    except UsageError as e:
        print(f"torch_engine: {e}", file=sys.stderr)
        run.finish(EXIT_USAGE, error=str(e))
        return EXIT_USAGE
    except Missing as e:
        print(f"torch_engine: {e}", file=sys.stderr)
        run.finish(EXIT_MISSING, error=str(e), missing=e.what)
        return EXIT_MISSING
    except Exception as e:  # noqa: BLE001 — every failure is reported with its phase
        traceback.print_exc()
        message = f"{type(e).__name__}: {e}".strip()
        print(f"torch_engine: failed in phase {run.phase}: {message}", file=sys.stderr)
        run.finish(EXIT_FAILED, error=message[:2000])
        return EXIT_FAILED
    run.finish(0)
    return 0


if __name__ == "__main__":
    # A normal exit (atexit handlers run, as in any program): only a timeout uses os._exit.
    sys.exit(main(sys.argv[1:]))
