#!/usr/bin/python3
"""Independent NumPy reference implementation of GPT-2 inference (issue 4).

The reference engine (tools/refengine) must produce logits that match this script within
1e-4. This file shares no code with thaw or the engine: it has its own safetensors reader,
reads the Hugging Face config.json and computes everything in float64, so its own rounding
error is negligible next to the engine's fp32 accumulation.

Model layout (Hugging Face GPT-2):
  - tensor names either GPT2LMHeadModel style ("transformer.h.0.attn.c_attn.weight",
    "transformer.wte.weight", optional "lm_head.weight") or GPT2Model style without the
    prefix ("h.0.attn.c_attn.weight", "wte.weight"); other tensors (e.g. the old causal
    mask buffers "h.N.attn.bias"/"attn.masked_bias") are ignored;
  - Conv1D weights are stored [in, out]: y = x @ W + b;
  - the LM head is tied to wte (logits = h @ wte.T) unless lm_head.weight exists;
  - activation_function "gelu_new" / "gelu_pytorch_tanh" is the tanh approximation
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); "gelu" is the exact erf form
    0.5 x (1 + erf(x / sqrt(2)));
  - attention scores are scaled by 1/sqrt(head_dim) (scale_attn_weights, default true)
    and additionally by 1/(layer_idx + 1) when scale_attn_by_inverse_layer_idx is true.

Usage (Debian's python, which has python3-numpy):
  /usr/bin/python3 gpt2_numpy.py MODEL_DIR --tokens 1,2,3 [--tokens 4,5] [--generate N]
                                 [--all-positions] [--json]
Greedy decoding picks the lowest token id among equal maxima (numpy.argmax).

Importable: load_model(dir) -> GPT2Model, forward(model, tokens) -> float64 [T, vocab],
new_cache(model), forward_cached(model, tokens, cache) (incremental decoding with a KV
cache), generate(model, tokens, n), read_safetensors(path).
"""

import json
import math
import mmap
import os
import struct
import sys

try:
    import numpy as np
except ImportError as _numpy_error:  # pragma: no cover - exercised by a subprocess test
    _MSG = (
        "gpt2_numpy.py: NumPy is required but cannot be imported with "
        f"{sys.executable} ({_numpy_error}). Install Debian's python3-numpy "
        "(scripts/install-deps does) and run this script with /usr/bin/python3."
    )
    if __name__ == "__main__":
        print(_MSG, file=sys.stderr)
        sys.exit(2)
    raise ImportError(_MSG) from _numpy_error


class ModelError(Exception):
    """A malformed, truncated or inconsistent checkpoint, config or input."""


# ---------------------------------------------------------------------------------------
# safetensors

# dtype name -> (numpy little-endian dtype of the stored element, element size in bytes)
_DTYPES = {
    "F64": ("<f8", 8),
    "F32": ("<f4", 4),
    "F16": ("<f2", 2),
    "BF16": ("<u2", 2),  # decoded by hand: the 16 bits are the high half of a float32
    "I64": ("<i8", 8),
    "I32": ("<i4", 4),
    "I16": ("<i2", 2),
    "I8": ("<i1", 1),
    "U8": ("<u1", 1),
    "BOOL": ("<u1", 1),
}

_MAX_HEADER = 100 * 1024 * 1024  # the limit the safetensors library applies


def _decode(raw, dtype, shape):
    """Decode bytes of one tensor; float dtypes come back as float32/float64 arrays."""
    npdt, _ = _DTYPES[dtype]
    arr = np.frombuffer(raw, dtype=npdt)
    if dtype == "BF16":
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    elif dtype == "F16":
        arr = arr.astype(np.float32)
    elif dtype == "BOOL":
        arr = arr.astype(bool)
    else:
        arr = arr.copy()  # detach from the mapping
    return arr.reshape(shape)


def read_safetensors(path):
    """Read one .safetensors file. Returns {name: numpy array}; raises ModelError with a
    message naming the file (and tensor) on any malformed or truncated input."""
    try:
        size = os.path.getsize(path)
        f = open(path, "rb")
    except OSError as e:
        raise ModelError(f"{path}: cannot open: {e.strerror}") from None
    with f:
        if size < 8:
            raise ModelError(f"{path}: file is {size} bytes, too short for the 8-byte header length")
        (hlen,) = struct.unpack("<Q", f.read(8))
        if hlen > _MAX_HEADER:
            raise ModelError(f"{path}: header length {hlen} exceeds the {_MAX_HEADER}-byte limit")
        if 8 + hlen > size:
            raise ModelError(
                f"{path}: truncated: header length {hlen} runs past the end of the {size}-byte file"
            )
        hbytes = f.read(hlen)
        try:
            header = json.loads(hbytes.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ModelError(f"{path}: header is not valid JSON: {e}") from None
        if not isinstance(header, dict):
            raise ModelError(f"{path}: header is not a JSON object")
        data_start = 8 + hlen
        data_len = size - data_start
        entries = []
        for name, info in header.items():
            if name == "__metadata__":
                if not isinstance(info, dict):
                    raise ModelError(f"{path}: __metadata__ is not a JSON object")
                continue
            where = f"{path}: tensor {name!r}"
            if not isinstance(info, dict):
                raise ModelError(f"{where}: entry is not a JSON object")
            for key in ("dtype", "shape", "data_offsets"):
                if key not in info:
                    raise ModelError(f"{where}: missing {key!r}")
            dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
            if dtype not in _DTYPES:
                raise ModelError(f"{where}: unsupported dtype {dtype!r}")
            if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
            ):
                raise ModelError(f"{where}: shape {shape!r} is not a list of non-negative integers")
            if (
                not isinstance(offs, list)
                or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
            ):
                raise ModelError(f"{where}: data_offsets {offs!r} is not a pair of integers")
            begin, end = offs
            if begin < 0 or end < begin:
                raise ModelError(f"{where}: bad data_offsets [{begin}, {end}]")
            if end > data_len:
                raise ModelError(
                    f"{where}: data_offsets [{begin}, {end}] run past the end of the data "
                    f"({data_len} bytes; file truncated?)"
                )
            nbytes = math.prod(shape) * _DTYPES[dtype][1]
            if end - begin != nbytes:
                raise ModelError(
                    f"{where}: data_offsets [{begin}, {end}] hold {end - begin} bytes but "
                    f"{dtype} {shape} needs {nbytes}"
                )
            entries.append((begin, end, name, dtype, shape))
        # As the safetensors library requires: tensors tile the data area exactly, in order
        # of their offsets, with no overlap and no gap.
        entries.sort()
        pos = 0
        for begin, end, name, _, _ in entries:
            if begin != pos:
                kind = "overlaps the previous tensor" if begin < pos else "leaves a gap"
                raise ModelError(
                    f"{path}: tensor {name!r}: data_offsets start at {begin}, expected {pos} ({kind})"
                )
            pos = end
        if pos != data_len:
            raise ModelError(
                f"{path}: tensors cover {pos} bytes of data but the file has {data_len} "
                "after the header"
            )
        tensors = {}
        if data_len == 0:
            for _, _, name, dtype, shape in entries:
                tensors[name] = _decode(b"", dtype, shape)
            return tensors
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            for begin, end, name, dtype, shape in entries:
                tensors[name] = _decode(mm[data_start + begin : data_start + end], dtype, shape)
        return tensors


def read_checkpoint(model_dir):
    """Read model.safetensors, or the shards listed by model.safetensors.index.json."""
    single = os.path.join(model_dir, "model.safetensors")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(single):
        return read_safetensors(single)
    if not os.path.exists(index):
        raise ModelError(f"{model_dir}: neither model.safetensors nor model.safetensors.index.json")
    try:
        with open(index, "rb") as f:
            idx = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"{index}: cannot read: {e}") from None
    wmap = idx.get("weight_map") if isinstance(idx, dict) else None
    if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
        raise ModelError(f"{index}: no 'weight_map' object of tensor name -> file name")
    tensors = {}
    for shard in sorted(set(wmap.values())):
        if os.path.basename(shard) != shard:
            raise ModelError(f"{index}: shard name {shard!r} is not a plain file name")
        shard_path = os.path.join(model_dir, shard)
        for name, arr in read_safetensors(shard_path).items():
            if name in tensors:
                raise ModelError(f"{shard_path}: tensor {name!r} also appears in another shard")
            if wmap.get(name) != shard:
                raise ModelError(
                    f"{shard_path}: tensor {name!r} is not mapped to this shard by {index}"
                )
            tensors[name] = arr
    for name, shard in wmap.items():
        if name not in tensors:
            raise ModelError(f"{os.path.join(model_dir, shard)}: tensor {name!r} listed in {index} is missing")
    return tensors


# ---------------------------------------------------------------------------------------
# model

ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh", "gelu")


class GPT2Model:
    """Config values and float64 weights. Layers are dicts with keys ln_1_w, ln_1_b,
    attn_w [E, 3E], attn_b, attn_proj_w [E, E], attn_proj_b, ln_2_w, ln_2_b,
    fc_w [E, I], fc_b, mlp_proj_w [I, E], mlp_proj_b."""

    def __init__(self, config, weights, naming):
        self.n_embd = config["n_embd"]
        self.n_layer = config["n_layer"]
        self.n_head = config["n_head"]
        self.n_positions = config["n_positions"]
        self.vocab_size = config["vocab_size"]
        self.n_inner = config["n_inner"]
        self.eps = config["layer_norm_epsilon"]
        self.activation = config["activation_function"]
        self.scale_attn_weights = config["scale_attn_weights"]
        self.scale_by_layer = config["scale_attn_by_inverse_layer_idx"]
        self.naming = naming  # "GPT2LMHeadModel" or "GPT2Model"
        self.wte = weights["wte"]
        self.wpe = weights["wpe"]
        self.ln_f_w = weights["ln_f_w"]
        self.ln_f_b = weights["ln_f_b"]
        self.lm_head = weights["lm_head"]  # [vocab, E]; wte itself when tied
        self.tied = weights["tied"]
        self.layers = weights["layers"]


def _int_field(cfg, path, key, default=None, minimum=1):
    v = cfg.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise ModelError(f"{path}: {key} must be an integer >= {minimum}, got {v!r}")
    return v


def read_config(model_dir):
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path, "rb") as f:
            cfg = json.loads(f.read().decode("utf-8"))
    except OSError as e:
        raise ModelError(f"{path}: cannot open: {e.strerror}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"{path}: not a JSON object")
    out = {}
    out["n_embd"] = _int_field(cfg, path, "n_embd")
    out["n_layer"] = _int_field(cfg, path, "n_layer")
    out["n_head"] = _int_field(cfg, path, "n_head")
    out["n_positions"] = _int_field(cfg, path, "n_positions", cfg.get("n_ctx"))
    out["vocab_size"] = _int_field(cfg, path, "vocab_size")
    if out["n_embd"] % out["n_head"]:
        raise ModelError(f"{path}: n_embd {out['n_embd']} is not a multiple of n_head {out['n_head']}")
    inner = cfg.get("n_inner")
    out["n_inner"] = 4 * out["n_embd"] if inner is None else _int_field(cfg, path, "n_inner")
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0:
        raise ModelError(f"{path}: layer_norm_epsilon must be a positive number, got {eps!r}")
    out["layer_norm_epsilon"] = float(eps)
    act = cfg.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise ModelError(
            f"{path}: activation_function {act!r} not supported (gelu_new, gelu_pytorch_tanh: "
            "tanh approximation; gelu: exact erf)"
        )
    out["activation_function"] = act
    out["scale_attn_weights"] = bool(cfg.get("scale_attn_weights", True))
    out["scale_attn_by_inverse_layer_idx"] = bool(cfg.get("scale_attn_by_inverse_layer_idx", False))
    return out


def _take(tensors, name, shape, where):
    if name not in tensors:
        raise ModelError(f"{where}: missing tensor {name!r}")
    t = tensors[name]
    if list(t.shape) != list(shape):
        raise ModelError(
            f"{where}: tensor {name!r} has shape {list(t.shape)}, config.json implies {list(shape)}"
        )
    if t.dtype.kind != "f":
        raise ModelError(f"{where}: tensor {name!r} is not floating point ({t.dtype})")
    return np.asarray(t, dtype=np.float64)


def load_model(model_dir):
    """Load config.json and the safetensors checkpoint of a GPT-2 model directory."""
    cfg = read_config(model_dir)
    tensors = read_checkpoint(model_dir)
    where = model_dir
    if "transformer.wte.weight" in tensors:
        prefix, naming = "transformer.", "GPT2LMHeadModel"
    elif "wte.weight" in tensors:
        prefix, naming = "", "GPT2Model"
    else:
        raise ModelError(f"{where}: no 'transformer.wte.weight' or 'wte.weight' tensor: not a GPT-2 checkpoint")
    E, V, P, I = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg["n_inner"]
    w = {}
    w["wte"] = _take(tensors, prefix + "wte.weight", [V, E], where)
    w["wpe"] = _take(tensors, prefix + "wpe.weight", [P, E], where)
    w["ln_f_w"] = _take(tensors, prefix + "ln_f.weight", [E], where)
    w["ln_f_b"] = _take(tensors, prefix + "ln_f.bias", [E], where)
    if "lm_head.weight" in tensors:
        w["lm_head"], w["tied"] = _take(tensors, "lm_head.weight", [V, E], where), False
    else:
        w["lm_head"], w["tied"] = w["wte"], True
    layers = []
    for i in range(cfg["n_layer"]):
        p = f"{prefix}h.{i}."
        layers.append(
            {
                "ln_1_w": _take(tensors, p + "ln_1.weight", [E], where),
                "ln_1_b": _take(tensors, p + "ln_1.bias", [E], where),
                "attn_w": _take(tensors, p + "attn.c_attn.weight", [E, 3 * E], where),
                "attn_b": _take(tensors, p + "attn.c_attn.bias", [3 * E], where),
                "attn_proj_w": _take(tensors, p + "attn.c_proj.weight", [E, E], where),
                "attn_proj_b": _take(tensors, p + "attn.c_proj.bias", [E], where),
                "ln_2_w": _take(tensors, p + "ln_2.weight", [E], where),
                "ln_2_b": _take(tensors, p + "ln_2.bias", [E], where),
                "fc_w": _take(tensors, p + "mlp.c_fc.weight", [E, I], where),
                "fc_b": _take(tensors, p + "mlp.c_fc.bias", [I], where),
                "mlp_proj_w": _take(tensors, p + "mlp.c_proj.weight", [I, E], where),
                "mlp_proj_b": _take(tensors, p + "mlp.c_proj.bias", [E], where),
            }
        )
    extra = f"{prefix}h.{cfg['n_layer']}.ln_1.weight"
    if extra in tensors:
        raise ModelError(f"{where}: tensor {extra!r} exists but config.json has n_layer {cfg['n_layer']}")
    w["layers"] = layers
    return GPT2Model(cfg, w, naming)


# ---------------------------------------------------------------------------------------
# forward

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _gelu(x, kind):
    if kind == "gelu":
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _layer_norm(x, w, b, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # biased, as torch
    return (x - mean) / np.sqrt(var + eps) * w + b


class KVCache:
    """Per-layer keys and values of all positions processed so far, each [H, T, D]."""

    def __init__(self, model):
        H, D = model.n_head, model.n_embd // model.n_head
        self.k = [np.zeros((H, 0, D)) for _ in range(model.n_layer)]
        self.v = [np.zeros((H, 0, D)) for _ in range(model.n_layer)]

    @property
    def length(self):
        return self.k[0].shape[1] if self.k else 0


def new_cache(model):
    return KVCache(model)


def _check_tokens(model, tokens, start):
    toks = list(tokens)
    if not toks:
        raise ModelError("empty token sequence")
    for t in toks:
        if not isinstance(t, (int, np.integer)) or isinstance(t, bool) or not 0 <= t < model.vocab_size:
            raise ModelError(f"token id {t!r} out of range [0, {model.vocab_size})")
    if start + len(toks) > model.n_positions:
        raise ModelError(
            f"sequence of {start + len(toks)} positions exceeds n_positions {model.n_positions}"
        )
    return np.asarray(toks, dtype=np.int64)


def forward_cached(model, tokens, cache):
    """Run `tokens` at positions cache.length .. cache.length+T-1, appending their keys and
    values to `cache`. Returns float64 logits [T, vocab]. With an empty cache this is the
    full causal forward; with T == 1 it is one decode step."""
    start = cache.length
    toks = _check_tokens(model, tokens, start)
    T, E, H = len(toks), model.n_embd, model.n_head
    D = E // H
    x = model.wte[toks] + model.wpe[start : start + T]
    # Query i (absolute position start+i) may attend key j iff j <= start+i.
    allowed = np.arange(start + T)[None, :] <= (start + np.arange(T))[:, None]  # [T, start+T]
    for li, L in enumerate(model.layers):
        a = _layer_norm(x, L["ln_1_w"], L["ln_1_b"], model.eps)
        qkv = a @ L["attn_w"] + L["attn_b"]  # [T, 3E]
        q, k, v = (qkv[:, i * E : (i + 1) * E].reshape(T, H, D).transpose(1, 0, 2) for i in range(3))
        cache.k[li] = np.concatenate([cache.k[li], k], axis=1)
        cache.v[li] = np.concatenate([cache.v[li], v], axis=1)
        scores = q @ cache.k[li].transpose(0, 2, 1)  # [H, T, start+T]
        if model.scale_attn_weights:
            scores = scores / math.sqrt(D)
        if model.scale_by_layer:
            scores = scores / float(li + 1)
        scores = np.where(allowed[None], scores, -np.inf)
        scores = scores - scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p = p / p.sum(axis=-1, keepdims=True)
        o = (p @ cache.v[li]).transpose(1, 0, 2).reshape(T, E)
        x = x + (o @ L["attn_proj_w"] + L["attn_proj_b"])
        m = _layer_norm(x, L["ln_2_w"], L["ln_2_b"], model.eps)
        m = _gelu(m @ L["fc_w"] + L["fc_b"], model.activation)
        x = x + (m @ L["mlp_proj_w"] + L["mlp_proj_b"])
    x = _layer_norm(x, model.ln_f_w, model.ln_f_b, model.eps)
    return x @ model.lm_head.T


def forward(model, tokens):
    """Full causal forward of one sequence: float64 logits [T, vocab]."""
    return forward_cached(model, tokens, KVCache(model))


def generate(model, tokens, n):
    """Greedy decoding: prefill `tokens`, then n-1 single-token decode steps through the KV
    cache. Returns (prefill logits [T, vocab], generated token ids (n of them), the logits
    each generated token was chosen from ([n, vocab]; row 0 is the prefill's last row))."""
    cache = KVCache(model)
    prefill = forward_cached(model, tokens, cache)
    generated, step_logits = [], []
    last = prefill[-1]
    for i in range(n):
        nxt = int(np.argmax(last))
        generated.append(nxt)
        step_logits.append(last)
        if i + 1 < n:
            last = forward_cached(model, [nxt], cache)[-1]
    return prefill, generated, np.array(step_logits).reshape(len(step_logits), model.vocab_size)


# ---------------------------------------------------------------------------------------
# CLI


def _parse_tokens(s):
    try:
        toks = [int(p) for p in s.split(",") if p.strip() != ""]
    except ValueError:
        raise ModelError(f"--tokens {s!r}: expected comma-separated integers") from None
    if not toks:
        raise ModelError(f"--tokens {s!r}: no token ids")
    return toks


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(
        description="Independent float64 NumPy GPT-2 reference: logits and greedy decoding."
    )
    ap.add_argument("model_dir", help="directory with config.json and model.safetensors (or shards + index)")
    ap.add_argument("--tokens", action="append", required=True, metavar="IDS",
                    help="comma-separated token ids of one sequence; repeat for a batch")
    ap.add_argument("--generate", type=int, default=0, metavar="N",
                    help="greedily generate N tokens per sequence through the KV cache")
    ap.add_argument("--all-positions", action="store_true", help="print the logits of every position")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    try:
        if args.generate < 0:
            raise ModelError("--generate must be >= 0")
        seqs = [_parse_tokens(s) for s in args.tokens]
        model = load_model(args.model_dir)
        out = []
        for toks in seqs:
            if args.generate:
                logits, gen, step_logits = generate(model, toks, args.generate)
            else:
                logits, gen, step_logits = forward(model, toks), [], None
            rec = {"tokens": toks, "last_logits": logits[-1].tolist()}
            if args.all_positions:
                rec["logits"] = logits.tolist()
            if args.generate:
                rec["generated"] = gen
                rec["generated_logits"] = step_logits.tolist()
            out.append(rec)
    except ModelError as e:
        print(f"gpt2_numpy.py: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        json.dump({"model": os.path.abspath(args.model_dir), "naming": model.naming,
                   "activation": model.activation, "sequences": out}, sys.stdout)
        sys.stdout.write("\n")
        return 0
    fmt = lambda row: " ".join(repr(float(v)) for v in row)  # noqa: E731 - shortest round-trip
    for i, rec in enumerate(out):
        print(f"sequence {i}: tokens {','.join(map(str, rec['tokens']))}")
        if args.all_positions:
            for pos, row in enumerate(rec["logits"]):
                print(f"  logits[{pos}]: {fmt(row)}")
        else:
            print(f"  last_logits: {fmt(rec['last_logits'])}")
        if args.generate:
            print(f"  generated: {','.join(map(str, rec['generated']))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
