#!/usr/bin/python3
"""ctest cluster.report (no root): the cluster demo's report and trace client on made-up runs.

report.py: per-mode answered counts, each model's cold-start TTFT, TTFT SLO attainment against
each model's deployed TTFT SLO, SLO attainment against the warm latency (k x (warm TTFT + (n - 1) x warm TPOT)), and the worker timeline built from the
engine's monotonic timeline, the worker's wall-clock marks and thawd's log.
trace_client.py: against a local stand-in gateway that streams SSE, the scaled arrivals,
prompt and output sizes, model round-robin and the tokens of every event.
"""
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import xml.dom.minidom

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.join(HERE, "..", "..", "tools", "demo-cluster")


def write_jsonl(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


class ReportTest(unittest.TestCase):
    def make_run(self, out):
        t0 = 1_800_000_000.0
        # warm: m1 1 token 0.1 s, 8 tokens 0.8 s -> TPOT 0.1 s
        for mode in ("thaw", "baseline"):
            write_jsonl(os.path.join(out, mode, "warm.jsonl"),
                        [{"model": "m1", "max_tokens": 1, "status": 200, "e2e_s": 0.1},
                         {"model": "m1", "max_tokens": 8, "status": 200, "e2e_s": 0.8}])
        # The model's TTFT SLO as deployed: 1.8 s (thaw's pass wrote it).
        write_jsonl(os.path.join(out, "thaw", "slo.jsonl"), [{"model": "m1", "ttft_slo_s": 1.8}])
        # SLO (k = 5) for n = 3 tokens: 5 x (0.1 + 2 x 0.1) = 1.5 s
        reqs = {"thaw": [2.0, 0.5, 1.4], "baseline": [4.0, 1.6, None]}
        for mode, ttfts in reqs.items():
            rows = []
            for i, ttft in enumerate(ttfts):
                r = {"id": i, "model": "m1" + ("-baseline" if mode == "baseline" else ""),
                     "arrival_s": float(i), "prompt_tokens": 4, "max_tokens": 3,
                     "sent_s": float(i), "t_sent": t0 + i, "t_end": t0 + i + (ttft or 1.0)}
                if ttft is None:
                    r.update(status=503, error="held past its deadline")
                else:
                    r.update(status=200, ttft_s=ttft, e2e_s=ttft, tpot_s=0.0)
                rows.append(r)
            write_jsonl(os.path.join(out, mode, "requests.jsonl"), rows)
        state = {"plans": [{"id": "p1", "model": "m1", "stages": 2, "phase": "PHASE_CONSOLIDATED",
                            "placement": [{"stage": 0, "node_id": "n0"}, {"stage": 1, "node_id": "n1"}]}]}
        with open(os.path.join(out, "thaw", "state.json"), "w") as f:
            json.dump(state, f)
        # Worker p1/0 on n0: launched at t0 + 0.5, exec at + 0.6; the engine's clock starts
        # at 1000 s monotonic; CUDA init 0.2 s, weights until + 0.5 s, serving at + 0.7 s.
        wdir = os.path.join(out, "thaw", "workers", "n0")
        write_jsonl(os.path.join(wdir, "thaw-worker-p1-0.timeline.box"),
                    [{"phase": "launch", "t": t0 + 0.5}, {"phase": "exec", "t": t0 + 0.6}])
        base = 1000 * 10**9
        write_jsonl(os.path.join(wdir, "thaw-worker-p1-0.timeline"),
                    [{"event": "process_start", "t_ns": base},
                     {"event": "driver_init", "t_ns": base + 200_000_000},
                     {"event": "allocator_ready", "t_ns": base + 210_000_000},
                     {"event": "weights_loaded", "t_ns": base + 500_000_000},
                     {"event": "serving", "t_ns": base + 700_000_000}])
        os.makedirs(os.path.join(out, "thaw", "logs"))
        iso = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%03d+0000" % round((t % 1) * 1000)
        with open(os.path.join(out, "thaw", "logs", "thawd-n0.log"), "w") as f:
            f.write(f"{iso(t0 + 0.25)} thawd: info: fetching m1 (stage 1 of 2) from http directory x MODEL=m1\n")
            f.write(f"{iso(t0 + 1.25)} thawd: info: fetched m1: 100 bytes in 1.00 s (0 already cached)\n")

    def test_report(self):
        with tempfile.TemporaryDirectory() as out:
            self.make_run(out)
            r = subprocess.run([sys.executable, os.path.join(TOOLS, "report.py"), out, "--slo-scale", "5"],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(out, "summary.json")) as f:
                s = json.load(f)
            thaw, base = s["modes"]["thaw"], s["modes"]["baseline"]
            self.assertAlmostEqual(s["warm"]["m1"]["tpot_s"], 0.1)
            self.assertEqual((thaw["answered"], base["answered"]), (3, 2))
            self.assertAlmostEqual(thaw["cold_start_ttft_s"]["m1"], 2.0)
            self.assertAlmostEqual(base["cold_start_ttft_s"]["m1"], 4.0)
            self.assertAlmostEqual(thaw["slo_attainment"], 2 / 3)   # 0.5 and 1.4 <= 1.5
            self.assertAlmostEqual(base["slo_attainment"], 0 / 3)   # 4.0, 1.6 late, one 503
            # Against the deployed TTFT SLO of 1.8 s, in both modes.
            self.assertAlmostEqual(thaw["ttft_slo_attainment"], 2 / 3)   # 0.5 and 1.4 <= 1.8
            self.assertAlmostEqual(base["ttft_slo_attainment"], 1 / 3)   # 1.6; 4.0 late, one 503
            self.assertEqual(s["ttft_slo"], {"m1": 1.8})
            self.assertEqual(thaw["plans"][0]["stages"], 2)
            (w,) = thaw["workers"]
            self.assertEqual(w["label"], "m1 1/2 @n0")
            segs = {name: (a, b) for name, a, b in w["segments"]}
            self.assertAlmostEqual(segs["thawd fetch (node link)"][0], 0.25, places=2)
            self.assertAlmostEqual(segs["thawd fetch (node link)"][1], 1.25, places=2)
            self.assertAlmostEqual(segs["CUDA init"][0], 0.6, places=3)
            self.assertAlmostEqual(segs["CUDA init"][1], 0.8, places=3)
            self.assertAlmostEqual(segs["weights (stream/load)"][1], 1.1, places=3)
            self.assertAlmostEqual(segs["engine init (profile, KV)"][1], 1.3, places=3)
            xml.dom.minidom.parse(os.path.join(out, "timeline.svg"))
            with open(os.path.join(out, "summary.md")) as f:
                md = f.read()
            self.assertIn("| thaw | 3 | 3 |", md)
            self.assertIn("67 % of 3", md)
            self.assertIn("| 0 % of 3 | 33 % of 3 |", md)


class StandInGateway(http.server.BaseHTTPRequestHandler):
    seen = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StandInGateway.seen.append((time.time(), body))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        # One event per token, 50 ms apart, after an event with no token (as a worker's role
        # or keep-alive event would be): TTFT is the first token's, TPOT the gap between tokens.
        self.wfile.write(b"data: " + json.dumps({"choices": [{"token_ids": []}]}).encode() + b"\n\n")
        self.wfile.flush()
        for t in range(body["max_tokens"]):
            time.sleep(0.05)
            self.wfile.write(b"data: " + json.dumps({"choices": [{"token_ids": [t]}]}).encode() + b"\n\n")
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


class TraceClientTest(unittest.TestCase):
    def test_replay(self):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandInGateway)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        with tempfile.TemporaryDirectory() as d:
            trace = os.path.join(d, "t.csv")
            with open(trace, "w") as f:
                f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
                f.write("2023-11-16 18:00:00.0000000,100,10\n")   # skipped (--start-row 1)
                f.write("2023-11-16 18:00:10.0000000,650,80\n")
                f.write("2023-11-16 18:00:12.0000000,1,1\n")
                f.write("2023-11-16 18:00:14.5000000,100000,1000\n")
            out = os.path.join(d, "r.jsonl")
            r = subprocess.run([sys.executable, os.path.join(TOOLS, "trace_client.py"),
                                "--gateway", "http://127.0.0.1:%d" % server.server_address[1],
                                "--trace", trace, "--models", "a,b", "--model-suffix=-baseline",
                                "--start-row", "1", "--count", "3", "--time-scale", "10",
                                "--prompt-scale", "64", "--output-scale", "8", "--max-prompt", "48",
                                "--max-output", "8", "--vocab", "4096", "--out", out],
                               capture_output=True, text=True, timeout=30)
            server.shutdown()
            server.server_close()
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out) as f:
                rows = [json.loads(line) for line in f]
            self.assertEqual([x["model"] for x in rows], ["a-baseline", "b-baseline", "a-baseline"])
            self.assertEqual([round(x["arrival_s"], 3) for x in rows], [0.0, 0.2, 0.45])
            self.assertEqual([x["prompt_tokens"] for x in rows], [11, 1, 48])   # ceil(650/64), 1, clamped
            self.assertEqual([x["max_tokens"] for x in rows], [8, 1, 8])         # ceil(80/8)=10 -> 8
            for x in rows:
                self.assertEqual(x["status"], 200)
                self.assertEqual(len(x["tokens"]), x["max_tokens"])
                self.assertTrue(x["complete"])
                self.assertGreaterEqual(x["ttft_s"], 0.04)   # the first token, not the first event
                if x["max_tokens"] > 1:
                    self.assertAlmostEqual(x["tpot_s"], 0.05, delta=0.03)
                    self.assertGreaterEqual(x["e2e_s"] - x["ttft_s"], 0.04 * (x["max_tokens"] - 1))
                else:
                    self.assertEqual(x["tpot_s"], 0.0)
            sent = sorted(t for t, _ in StandInGateway.seen)
            self.assertAlmostEqual(sent[2] - sent[0], 0.45, delta=0.1)
            bodies = [b for _, b in sorted(StandInGateway.seen, key=lambda s: s[0])]
            self.assertTrue(all(b["stream"] and b["ignore_eos"] for b in bodies))
            self.assertTrue(all(0 < t < 4096 for b in bodies for t in b["prompt"]))


if __name__ == "__main__":
    unittest.main()
