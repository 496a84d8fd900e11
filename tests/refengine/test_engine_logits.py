#!/usr/bin/python3
"""The reference engine's logits against the independent NumPy GPT-2 (issue 4 acceptance).

Runs `refengine generate` on the real tiny GPT-2 of ../shared/data/models/tiny_gpt2 on the
emulator (kernels as host twins) with --logits-out --all-positions: the logits of every prompt
position and of every generated token. gpt2_numpy.py computes the same in float64 with its own
safetensors reader; they must agree within 1e-4, and the greedy tokens must be identical.
Several prompts in one run (batched prefill and decode, through the paged KV cache), in graph
and eager mode, and through both the dlopen and the -lcuda build.

Environment (set by tests/refengine/CMakeLists.txt): REFENGINE, REFENGINE_LINKED,
REFENGINE_LIBCUDA (the emulator), THAW_EMU_KERNELS (the twins), TINY_GPT2_DIR.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_numpy  # noqa: E402

import numpy as np  # noqa: E402

TOLERANCE = 1e-4
PROMPTS = [[1, 2, 3], [5, 6], [20, 0, 19, 7, 11], [4]]
GENERATE = 6


def env_path(name):
    value = os.environ.get(name)
    if not value:
        raise AssertionError(f"{name} is not set: run this test through ctest")
    return value


class EngineLogitsMatchNumpy(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model_dir = env_path("TINY_GPT2_DIR")
        if not os.path.exists(os.path.join(cls.model_dir, "model.safetensors")):
            raise AssertionError(f"{cls.model_dir}: the shared tiny GPT-2 is missing")
        cls.model = gpt2_numpy.load_model(cls.model_dir)
        cls.reference = []
        for toks in PROMPTS:
            logits, gen, step_logits = gpt2_numpy.generate(cls.model, toks, GENERATE)
            # Rows the engine reports: every prompt position, then one per later token.
            cls.reference.append((np.concatenate([logits, step_logits[1:]]), gen))

    def run_engine(self, binary, extra):
        with tempfile.TemporaryDirectory() as tmp:
            logits_path = os.path.join(tmp, "logits.json")
            env = dict(os.environ)
            env["THAW_EMU_STATE_DIR"] = tmp
            env["THAW_EMU_TIMING"] = "0"
            env["THAW_EMU_DEVICE_MEMORY"] = "2G"
            env["LD_LIBRARY_PATH"] = os.path.dirname(env_path("REFENGINE_LIBCUDA"))
            cmd = [binary, "generate", "--model", self.model_dir, "--max-tokens", str(GENERATE),
                   "--ignore-eos", "--json", "--all-positions", "--logits-out", logits_path,
                   "--max-num-seqs", "4", "--max-model-len", "64",
                   "--timeline", os.path.join(tmp, "timeline.jsonl")] + extra
            for toks in PROMPTS:
                cmd += ["--tokens", ",".join(map(str, toks))]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
            self.assertEqual(done.returncode, 0, done.stderr)
            lines = [json.loads(l) for l in done.stdout.splitlines() if l.strip()]
            with open(logits_path) as f:
                logits = json.load(f)
        return lines, logits

    def check(self, binary, extra):
        lines, logits = self.run_engine(binary, extra)
        self.assertEqual(len(lines), len(PROMPTS))
        for i, (ref_logits, ref_tokens) in enumerate(self.reference):
            self.assertEqual(lines[i]["prompt_tokens"], PROMPTS[i])
            self.assertEqual(lines[i]["tokens"], ref_tokens, f"prompt {i}: greedy tokens")
            got = np.array(logits[i]["logits"], dtype=np.float64)
            self.assertEqual(got.shape, ref_logits.shape, f"prompt {i}: rows x vocab")
            err = np.max(np.abs(got - ref_logits))
            self.assertLessEqual(err, TOLERANCE, f"prompt {i}: max |engine - numpy| = {err:.3g}")

    def test_graph_mode(self):
        self.check(env_path("REFENGINE"), [])

    def test_eager_mode(self):
        self.check(env_path("REFENGINE"), ["--enforce-eager"])

    def test_linked_build_with_expandable_segments(self):
        self.check(env_path("REFENGINE_LINKED"), ["--expandable-segments"])

    def test_a_wrong_weight_is_caught(self):
        # The comparison has teeth: perturbing one weight of the model moves the logits.
        with tempfile.TemporaryDirectory() as tmp:
            for name in os.listdir(self.model_dir):
                with open(os.path.join(self.model_dir, name), "rb") as src:
                    data = bytearray(src.read())
                if name == "model.safetensors":
                    header = json.loads(bytes(data[8:8 + int.from_bytes(data[:8], "little")]))
                    begin = header["ln_f.weight"]["data_offsets"][0]
                    pos = 8 + int.from_bytes(data[:8], "little") + begin
                    value = np.frombuffer(bytes(data[pos:pos + 4]), dtype="<f4")[0]
                    data[pos:pos + 4] = np.array([value * 1.5 + 0.1], dtype="<f4").tobytes()
                with open(os.path.join(tmp, name), "wb") as dst:
                    dst.write(data)
            original = self.model_dir
            self.model_dir = tmp
            try:
                _, logits = self.run_engine(env_path("REFENGINE"), ["--enforce-eager"])
            finally:
                self.model_dir = original
        got = np.array(logits[0]["logits"], dtype=np.float64)
        self.assertGreater(np.max(np.abs(got - self.reference[0][0])), TOLERANCE)


if __name__ == "__main__":
    unittest.main(verbosity=2)
