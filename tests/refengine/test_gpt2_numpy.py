#!/usr/bin/python3
"""Tests of the NumPy GPT-2 reference (gpt2_numpy.py). Run with Debian's python:
/usr/bin/python3 test_gpt2_numpy.py (ctest: refengine.gpt2_numpy)."""

import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpt2_numpy as g  # noqa: E402  (first: without NumPy it raises a clear ImportError)
import numpy as np  # noqa: E402

SCRIPT = os.path.join(HERE, "gpt2_numpy.py")
# The real tiny GPT-2 (GPT2Model naming, n_embd 2, 1 layer, vocab 21): $THAW_TINY_GPT2, else
# ../shared/data/models/tiny_gpt2 next to the checkout. Its tests fail without it: a
# reference that silently checks nothing would be worse than none.
TINY = os.environ.get("THAW_TINY_GPT2") or os.path.normpath(
    os.path.join(HERE, "..", "..", "..", "shared", "data", "models", "tiny_gpt2"))


# ---------------------------------------------------------------------------------------
# A safetensors writer of the test's own (struct + json, no numpy in the encoding).

def f32(v):
    """v rounded to float32, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def write_safetensors(path, tensors, header_hook=None):
    """tensors: {name: (dtype, shape, raw bytes)}; written in sorted name order."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if header_hook:
        header_hook(header)
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))


def f32_tensor(nested):
    """A nested Python list of floats -> ("F32", shape, bytes)."""
    shape, x = [], nested
    while isinstance(x, list):
        shape.append(len(x))
        x = x[0]
    flat = []

    def rec(v):
        if isinstance(v, list):
            for e in v:
                rec(e)
        else:
            flat.append(v)

    rec(nested)
    return ("F32", shape, struct.pack(f"<{len(flat)}f", *flat))


# ---------------------------------------------------------------------------------------
# A hand-built model with known weights and a pure-Python (lists and loops, no numpy)
# evaluation of the GPT-2 formula, coded separately from gpt2_numpy.


def weight(seed, i, j=0, scale=0.5):
    return f32(scale * math.sin(1.7 * seed + 0.31 * i + 0.57 * j + 0.1 * i * j))


def mat(seed, rows, cols, scale=0.5):
    return [[weight(seed, i, j, scale) for j in range(cols)] for i in range(rows)]


def vec(seed, n, scale=0.5, offset=0.0):
    return [f32(offset + scale * math.sin(2.3 * seed + 0.7 * i)) for i in range(n)]


def hand_model(E=4, H=2, L=1, V=7, P=8, inner=None, lm_head=False):
    """Returns (config dict, {GPT2Model-style name: nested list})."""
    I = inner or 4 * E
    cfg = {"n_embd": E, "n_head": H, "n_layer": L, "n_positions": P, "vocab_size": V,
           "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "n_inner": inner}
    w = {"wte.weight": mat(1, V, E), "wpe.weight": mat(2, P, E, 0.2),
         "ln_f.weight": vec(3, E, 0.3, 1.0), "ln_f.bias": vec(4, E, 0.1)}
    for l in range(L):
        s, p = 10 * (l + 1), f"h.{l}."
        w.update({
            p + "ln_1.weight": vec(s + 1, E, 0.3, 1.0), p + "ln_1.bias": vec(s + 2, E, 0.1),
            p + "attn.c_attn.weight": mat(s + 3, E, 3 * E, 0.8),
            p + "attn.c_attn.bias": vec(s + 4, 3 * E, 0.1),
            p + "attn.c_proj.weight": mat(s + 5, E, E), p + "attn.c_proj.bias": vec(s + 6, E, 0.1),
            p + "ln_2.weight": vec(s + 7, E, 0.3, 1.0), p + "ln_2.bias": vec(s + 8, E, 0.1),
            p + "mlp.c_fc.weight": mat(s + 9, E, I, 0.7), p + "mlp.c_fc.bias": vec(s + 10, I, 0.2),
            p + "mlp.c_proj.weight": mat(s + 11, I, E), p + "mlp.c_proj.bias": vec(s + 12, E, 0.1),
        })
    if lm_head:
        w["lm_head.weight"] = mat(99, V, E)
    return cfg, w


def write_model(d, cfg, w, prefix="", shards=0):
    """Writes config.json and the weights; names other than lm_head get `prefix`. With
    shards > 0, that many files plus model.safetensors.index.json."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    named = {(n if n == "lm_head.weight" else prefix + n): f32_tensor(v) for n, v in w.items()}
    if not shards:
        write_safetensors(os.path.join(d, "model.safetensors"), named)
        return
    names, wmap = sorted(named), {}
    for k in range(shards):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: named[n] for n in names[k::shards]}
        write_safetensors(os.path.join(d, fname), part)
        wmap.update({n: fname for n in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wmap}, f)


def py_reference(cfg, w, tokens, gelu="tanh"):
    """GPT-2 forward in plain Python floats: logits [T][V] for every position."""
    E, H, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    D, eps, T = E // H, cfg["layer_norm_epsilon"], len(tokens)

    def lnorm(x, gw, gb):
        mu = sum(x) / len(x)
        var = sum((a - mu) * (a - mu) for a in x) / len(x)
        return [(a - mu) / math.sqrt(var + eps) * gw[i] + gb[i] for i, a in enumerate(x)]

    def linear(x, W, b):  # Conv1D: W is [in][out]
        return [b[o] + sum(x[i] * W[i][o] for i in range(len(x))) for o in range(len(b))]

    def act(u):
        if gelu == "erf":
            return 0.5 * u * (1.0 + math.erf(u / math.sqrt(2.0)))
        return 0.5 * u * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))

    hs = [[w["wte.weight"][t][e] + w["wpe.weight"][pos][e] for e in range(E)]
          for pos, t in enumerate(tokens)]
    for l in range(L):
        p = f"h.{l}."
        qkv = [linear(lnorm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"]),
                      w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"]) for x in hs]
        attn_out = []
        for i in range(T):
            merged = []
            for h in range(H):
                q = qkv[i][h * D:(h + 1) * D]
                scores = []
                for j in range(i + 1):  # causal: keys 0..i only
                    k = qkv[j][E + h * D:E + (h + 1) * D]
                    scores.append(sum(a * b for a, b in zip(q, k)) / math.sqrt(D))
                m = max(scores)
                ex = [math.exp(s - m) for s in scores]
                z = sum(ex)
                for d in range(D):
                    merged.append(sum(ex[j] / z * qkv[j][2 * E + h * D + d] for j in range(i + 1)))
            attn_out.append(linear(merged, w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"]))
        hs = [[a + b for a, b in zip(x, y)] for x, y in zip(hs, attn_out)]
        new = []
        for x in hs:
            u = linear(lnorm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"]),
                       w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"])
            y = linear([act(a) for a in u], w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"])
            new.append([a + b for a, b in zip(x, y)])
        hs = new
    head = w.get("lm_head.weight", w["wte.weight"])
    out = []
    for x in hs:
        y = lnorm(x, w["ln_f.weight"], w["ln_f.bias"])
        out.append([sum(y[e] * head[v][e] for e in range(E)) for v in range(len(head))])
    return out


class TempDirTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="gpt2_numpy_test.")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def run_cli(self, *args, python=sys.executable):
        return subprocess.run([python, SCRIPT, *args], capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------------------------------


class TinyRealModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = g.load_model(TINY)

    def test_loads_with_config_values_and_gpt2model_naming(self):
        m = self.model
        self.assertEqual((m.n_embd, m.n_layer, m.n_head, m.vocab_size, m.n_positions), (2, 1, 1, 21, 1024))
        self.assertEqual(m.naming, "GPT2Model")
        self.assertTrue(m.tied)
        self.assertEqual(m.activation, "gelu_new")
        self.assertEqual(m.wte.dtype, np.float64)

    def test_logits_have_shape_tokens_by_vocab_and_are_finite(self):
        logits = g.forward(self.model, [0, 5, 20, 7, 3])
        self.assertEqual(logits.shape, (5, 21))
        self.assertEqual(logits.dtype, np.float64)
        self.assertTrue(np.all(np.isfinite(logits)))
        self.assertGreater(np.abs(logits).max(), 0.0)

    def test_kv_cache_decoding_equals_full_forward_at_every_step(self):
        seq = [3, 14, 15, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 20]
        full = g.forward(self.model, seq)
        for prefill in (1, 4):
            cache = g.new_cache(self.model)
            got = [g.forward_cached(self.model, seq[:prefill], cache)]
            for t in seq[prefill:]:
                got.append(g.forward_cached(self.model, [t], cache))
            inc = np.concatenate(got)
            self.assertEqual(cache.length, len(seq))
            np.testing.assert_allclose(inc, full, rtol=0, atol=1e-10)

    def test_greedy_generate_matches_argmax_of_full_forward(self):
        prompt = [1, 2, 3]
        _, gen, step_logits = g.generate(self.model, prompt, 6)
        self.assertEqual(len(gen), 6)
        seq = list(prompt)
        for i, tok in enumerate(gen):
            full = g.forward(self.model, seq)
            np.testing.assert_allclose(step_logits[i], full[-1], rtol=0, atol=1e-10)
            self.assertEqual(tok, int(np.argmax(full[-1])))
            seq.append(tok)

    def test_causal_mask_later_token_does_not_change_earlier_logits(self):
        a = g.forward(self.model, [4, 8, 15, 16, 2])
        b = g.forward(self.model, [4, 8, 15, 0, 19])
        np.testing.assert_array_equal(a[:3], b[:3])
        self.assertGreater(np.abs(a[3:] - b[3:]).max(), 1e-9)  # later positions do change

    def test_cli_json_reports_sequences_logits_and_generation(self):
        r = subprocess.run([sys.executable, SCRIPT, TINY, "--tokens", "0,1,2", "--tokens", "20",
                            "--generate", "3", "--all-positions", "--json"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        self.assertEqual([s["tokens"] for s in out["sequences"]], [[0, 1, 2], [20]])
        for s in out["sequences"]:
            full = g.forward(self.model, s["tokens"])
            np.testing.assert_array_equal(np.array(s["last_logits"]), full[-1])
            np.testing.assert_array_equal(np.array(s["logits"]), full)
            _, gen, _ = g.generate(self.model, s["tokens"], 3)
            self.assertEqual(s["generated"], gen)

    def test_cli_text_output(self):
        r = subprocess.run([sys.executable, SCRIPT, TINY, "--tokens", "1,2", "--generate", "2"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "sequence 0: tokens 1,2")
        vals = [float(v) for v in lines[1].split(":", 1)[1].split()]
        np.testing.assert_array_equal(vals, g.forward(self.model, [1, 2])[-1])
        self.assertTrue(lines[2].startswith("  generated: "))


class HandBuiltModel(TempDirTest):
    """gpt2_numpy against the pure-Python evaluation of the same formula."""

    def check(self, tokens, gelu="tanh", **kw):
        cfg, w = hand_model(**kw)
        if gelu == "erf":
            cfg["activation_function"] = "gelu"
        write_model(self.tmp, cfg, w)
        got = g.forward(g.load_model(self.tmp), tokens)
        want = np.array(py_reference(cfg, w, tokens, gelu))
        self.assertEqual(got.shape, want.shape)
        self.assertGreater(np.abs(want).max(), 0.1)  # the model is not degenerate
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)

    def test_one_layer_two_heads_matches_direct_computation(self):
        self.check([0, 3, 6, 1, 1, 5])

    def test_two_layers_untied_head_custom_inner_matches_direct_computation(self):
        self.check([2, 4, 6, 0, 1], L=2, inner=6, lm_head=True)

    def test_exact_erf_gelu_matches_direct_computation(self):
        self.check([5, 1, 2, 3], gelu="erf")

    def test_gelu_variants_differ(self):
        cfg, w = hand_model()
        tanh = np.array(py_reference(cfg, w, [1, 2, 3], "tanh"))
        erf = np.array(py_reference(cfg, w, [1, 2, 3], "erf"))
        self.assertGreater(np.abs(tanh - erf).max(), 1e-7)

    def test_untied_lm_head_is_used(self):
        cfg, w = hand_model(lm_head=True)
        write_model(self.tmp, cfg, w)
        m = g.load_model(self.tmp)
        self.assertFalse(m.tied)
        np.testing.assert_array_equal(m.lm_head, np.array(w["lm_head.weight"]))


class NamingAndSharding(TempDirTest):
    def logits(self, sub, **kw):
        cfg, w = hand_model(L=2)
        d = os.path.join(self.tmp, sub)
        write_model(d, cfg, w, **kw)
        m = g.load_model(d)
        return m, g.forward(m, [1, 2, 3, 4, 5, 6])

    def test_lmhead_and_plain_naming_give_identical_logits(self):
        m1, a = self.logits("plain")
        m2, b = self.logits("lmhead", prefix="transformer.")
        self.assertEqual((m1.naming, m2.naming), ("GPT2Model", "GPT2LMHeadModel"))
        np.testing.assert_array_equal(a, b)

    def test_sharded_checkpoint_gives_identical_logits(self):
        _, a = self.logits("single", prefix="transformer.")
        _, b = self.logits("sharded", prefix="transformer.", shards=3)
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "sharded", "model.safetensors.index.json")))
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "sharded", "model.safetensors")))
        np.testing.assert_array_equal(a, b)

    def test_shard_missing_a_listed_tensor_is_an_error(self):
        cfg, w = hand_model()
        write_model(self.tmp, cfg, w, shards=2)
        idx = os.path.join(self.tmp, "model.safetensors.index.json")
        with open(idx) as f:
            j = json.load(f)
        j["weight_map"]["h.0.extra"] = "model-00001-of-00002.safetensors"
        with open(idx, "w") as f:
            json.dump(j, f)
        with self.assertRaisesRegex(g.ModelError, r"'h\.0\.extra' listed in .* is missing"):
            g.load_model(self.tmp)


class Dtypes(TempDirTest):
    def test_f16_and_bf16_decode_to_expected_floats(self):
        # Bit patterns written by hand: F16 1.0=0x3C00, -2.5=0xC100, 65504=0x7BFF,
        # 2^-24 (smallest subnormal)=0x0001, 0.333251953125=0x3555; BF16 1.0=0x3F80,
        # -2.5=0xC020, 3.140625=0x4049, 2^-126=0x0080, -0.0=0x8000.
        f16 = struct.pack("<5H", 0x3C00, 0xC100, 0x7BFF, 0x0001, 0x3555)
        bf16 = struct.pack("<5H", 0x3F80, 0xC020, 0x4049, 0x0080, 0x8000)
        path = os.path.join(self.tmp, "d.safetensors")
        write_safetensors(path, {"a": ("F16", [5], f16), "b": ("BF16", [1, 5], bf16),
                                 "c": ("F32", [2], struct.pack("<2f", 0.1, -7.0))})
        t = g.read_safetensors(path)
        self.assertEqual(t["a"].tolist(), [1.0, -2.5, 65504.0, 2.0 ** -24, 0.333251953125])
        self.assertEqual(t["b"].shape, (1, 5))
        self.assertEqual(t["b"].tolist(), [[1.0, -2.5, 3.140625, 2.0 ** -126, -0.0]])
        self.assertEqual(math.copysign(1.0, float(t["b"][0, 4])), -1.0)
        self.assertEqual(t["c"].tolist(), [f32(0.1), -7.0])

    def test_bf16_model_equals_f32_model_with_bf16_rounded_weights(self):
        cfg, w = hand_model()
        bf = {}
        for n, v in w.items():
            _, shape, raw = f32_tensor(v)
            words = struct.unpack(f"<{len(raw) // 4}I", raw)
            bf[n] = ("BF16", shape, struct.pack(f"<{len(words)}H", *(x >> 16 for x in words)))
        a, b = os.path.join(self.tmp, "bf16"), os.path.join(self.tmp, "f32")
        os.makedirs(a)
        with open(os.path.join(a, "config.json"), "w") as f:
            json.dump(cfg, f)
        write_safetensors(os.path.join(a, "model.safetensors"), bf)

        def bf16_round(v):  # keeps the high 16 bits of the float32 (truncation)
            if isinstance(v, list):
                return [bf16_round(e) for e in v]
            bits = struct.unpack("<I", struct.pack("<f", v))[0] & 0xFFFF0000
            return struct.unpack("<f", struct.pack("<I", bits))[0]

        truncated = {n: bf16_round(v) for n, v in w.items()}
        self.assertNotEqual(truncated, w)  # rounding changed the weights
        write_model(b, cfg, truncated)
        np.testing.assert_array_equal(g.forward(g.load_model(a), [1, 2, 3]),
                                      g.forward(g.load_model(b), [1, 2, 3]))


class Malformed(TempDirTest):
    def good_file(self):
        path = os.path.join(self.tmp, "m.safetensors")
        write_safetensors(path, {"x": f32_tensor([1.0, 2.0, 3.0]), "y": f32_tensor([[4.0, 5.0]])})
        return path

    def assert_error(self, path, pattern):
        with self.assertRaises(g.ModelError) as cm:
            g.read_safetensors(path)
        msg = str(cm.exception)
        self.assertIn(path, msg)
        self.assertRegex(msg, pattern)

    def rewrite_header(self, hook):
        path = os.path.join(self.tmp, "m.safetensors")
        write_safetensors(path, {"x": f32_tensor([1.0, 2.0, 3.0]), "y": f32_tensor([[4.0, 5.0]])}, hook)
        return path

    def test_good_file_reads(self):
        t = g.read_safetensors(self.good_file())
        self.assertEqual(t["x"].tolist(), [1.0, 2.0, 3.0])
        self.assertEqual(t["y"].tolist(), [[4.0, 5.0]])

    def test_truncated_data(self):
        path = self.good_file()
        os.truncate(path, os.path.getsize(path) - 4)
        self.assert_error(path, r"'y'.*run past the end of the data.*truncated")

    def test_truncated_inside_header(self):
        path = self.good_file()
        os.truncate(path, 20)
        self.assert_error(path, r"truncated: header length \d+ runs past the end")

    def test_shorter_than_header_length_field(self):
        path = os.path.join(self.tmp, "m.safetensors")
        with open(path, "wb") as f:
            f.write(b"\x01\x02\x03")
        self.assert_error(path, r"too short")

    def test_offsets_beyond_data(self):
        path = self.rewrite_header(lambda h: h["y"].update(data_offsets=[12, 40]))
        self.assert_error(path, r"'y'.*\[12, 40\].*run past the end")

    def test_offsets_size_disagrees_with_shape(self):
        path = self.rewrite_header(lambda h: h["x"].update(shape=[2]))
        self.assert_error(path, r"'x'.*hold 12 bytes but F32 \[2\] needs 8")

    def test_reversed_and_negative_offsets(self):
        path = self.rewrite_header(lambda h: h["x"].update(data_offsets=[12, 0]))
        self.assert_error(path, r"'x'.*bad data_offsets")
        path = self.rewrite_header(lambda h: h["x"].update(data_offsets=[-4, 8]))
        self.assert_error(path, r"'x'.*bad data_offsets")

    def test_overlapping_tensors(self):
        def hook(h):
            h["y"]["data_offsets"] = [4, 12]
        path = self.rewrite_header(hook)
        self.assert_error(path, r"overlaps the previous tensor")

    def test_trailing_bytes_not_covered(self):
        path = self.good_file()
        with open(path, "ab") as f:
            f.write(b"\0" * 4)
        self.assert_error(path, r"cover 20 bytes of data but the file has 24")

    def test_bad_json_dtype_and_shape(self):
        path = os.path.join(self.tmp, "m.safetensors")
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", 6) + b"{nope}")
        self.assert_error(path, r"not valid JSON")
        self.assert_error(self.rewrite_header(lambda h: h["x"].update(dtype="F8_E4M3")),
                          r"'x'.*unsupported dtype 'F8_E4M3'")
        self.assert_error(self.rewrite_header(lambda h: h["x"].update(shape=[3, -1])),
                          r"'x'.*not a list of non-negative integers")
        self.assert_error(self.rewrite_header(lambda h: h["x"].pop("data_offsets")),
                          r"'x'.*missing 'data_offsets'")

    def test_missing_tensor_and_shape_mismatch_name_the_tensor(self):
        cfg, w = hand_model()
        del w["h.0.ln_2.bias"]
        write_model(self.tmp, cfg, w)
        with self.assertRaisesRegex(g.ModelError, r"missing tensor 'h\.0\.ln_2\.bias'"):
            g.load_model(self.tmp)
        cfg, w = hand_model()
        cfg["n_positions"] = 16
        write_model(self.tmp, cfg, w)
        with self.assertRaisesRegex(g.ModelError, r"'wpe\.weight' has shape \[8, 4\], config\.json implies \[16, 4\]"):
            g.load_model(self.tmp)

    def test_bad_tokens(self):
        cfg, w = hand_model(P=8, V=7)
        write_model(self.tmp, cfg, w)
        m = g.load_model(self.tmp)
        with self.assertRaisesRegex(g.ModelError, r"token id 7 out of range \[0, 7\)"):
            g.forward(m, [1, 7])
        with self.assertRaisesRegex(g.ModelError, r"9 positions exceeds n_positions 8"):
            g.forward(m, list(range(7)) + [0, 1])

    def test_cli_reports_malformed_file_in_one_line_and_exits_nonzero(self):
        cfg, w = hand_model()
        write_model(self.tmp, cfg, w)
        path = os.path.join(self.tmp, "model.safetensors")
        os.truncate(path, os.path.getsize(path) - 1)
        r = self.run_cli(self.tmp, "--tokens", "1,2")
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stdout, "")
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertRegex(r.stderr, r"^gpt2_numpy\.py: error: .*model\.safetensors.*truncated")

    def test_cli_without_numpy_fails_clearly(self):
        # Makes "import numpy" fail inside a real interpreter, then runs the script as main.
        code = ("import sys, runpy; sys.modules['numpy'] = None; sys.argv = [sys.argv[1], 'x', '--tokens', '1'];"
                "runpy.run_path(sys.argv[0], run_name='__main__')")
        r = subprocess.run([sys.executable, "-c", code, SCRIPT], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("NumPy is required", r.stderr)
        self.assertIn("python3-numpy", r.stderr)
        self.assertNotIn("Traceback", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
