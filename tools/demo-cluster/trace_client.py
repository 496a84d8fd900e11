#!/usr/bin/python3
"""Replays a slice of an Azure LLM inference trace against an OpenAI-compatible front door.

Each trace row (TIMESTAMP, ContextTokens, GeneratedTokens) becomes one /v1/completions
request, sent at its scaled arrival time on its own thread, with stream=true; the client
records when each streamed token arrived (the reference engine and the gateway stream one event
per token as it is decoded): TTFT is the first token's arrival, TPOT the mean gap between the
first and the last token's, max_gap_s the longest gap (a stream moved mid-answer by KV migration
with forwarding shows one: docs/KV-TRANSFER.md). A stream that ends without [DONE] (the worker
died mid-stream: the gateway sends an error event) is recorded with "error" and
"complete": false. Scaling, so that the CPU-run
emulator can serve the trace:
  arrival   (t - t_first) / --time-scale        (e.g. 10: ten trace seconds in one)
  prompt    ceil(ContextTokens / --prompt-scale), clamped to [1, --max-prompt]
  output    ceil(GeneratedTokens / --output-scale), clamped to [1, --max-output]
  model     the row's index modulo the number of --models (every model gets every n-th row)
Prompts are token ids (the synthetic models have no tokenizer), deterministic per row.
Writes one JSON object per request (JSON lines) to --out; stdlib only.
"""
import argparse
import csv
import datetime
import http.client
import json
import math
import sys
import threading
import time
import urllib.parse


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gateway", required=True, help="base URL, e.g. http://10.211.0.3:8000")
    p.add_argument("--trace", required=True, help="AzureLLMInferenceTrace_*.csv")
    p.add_argument("--models", required=True, help="comma-separated model names")
    p.add_argument("--model-suffix", default="", help="appended to every model name (-baseline)")
    p.add_argument("--start-row", type=int, default=0)
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--time-scale", type=float, default=10.0)
    p.add_argument("--prompt-scale", type=float, default=64.0)
    p.add_argument("--output-scale", type=float, default=8.0)
    p.add_argument("--max-prompt", type=int, default=48)
    p.add_argument("--max-output", type=int, default=8)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--timeout", type=float, default=120.0, help="per request, seconds")
    p.add_argument("--out", required=True)
    return p.parse_args()


def read_slice(path, start, count):
    rows = []
    with open(path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if i < start:
                continue
            if len(rows) == count:
                break
            t = datetime.datetime.strptime(row["TIMESTAMP"][:26], "%Y-%m-%d %H:%M:%S.%f")
            rows.append((t.timestamp(), int(row["ContextTokens"]), int(row["GeneratedTokens"])))
    if not rows:
        sys.exit(f"trace_client: no rows {start}..{start + count} in {path}")
    return rows


def clamp(v, lo, hi):
    return max(lo, min(hi, v))


def one_request(url, body, timeout, record):
    u = urllib.parse.urlsplit(url)
    record["sent"] = time.time()
    try:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        record["status"] = resp.status
        if resp.status != 200:
            record["error"] = resp.read(2000).decode(errors="replace")
            record["retry_after"] = resp.getheader("Retry-After")
            return
        tokens, token_times = [], []
        record["complete"] = False
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                record["complete"] = True
                break
            event = json.loads(data)
            if "error" in event:  # the worker failed: before its first token, or mid-stream
                record["error"] = json.dumps(event["error"])[:2000]
                continue
            now = time.time()
            for c in event.get("choices", []):
                ids = c.get("token_ids", [])
                tokens += ids
                token_times += [now] * len(ids)
        if token_times:
            record["first"], record["last_token"] = token_times[0], token_times[-1]
            gaps = [b - a for a, b in zip(token_times, token_times[1:])]
            record["max_gap_s"] = max(gaps) if gaps else 0.0
        record["end"] = time.time()
        record["tokens"] = tokens
    except Exception as e:  # noqa: BLE001 — any failure is the request's outcome
        record["status"] = record.get("status", 0)
        record["error"] = f"{type(e).__name__}: {e}"
    finally:
        record.setdefault("end", time.time())


def main():
    a = parse_args()
    models = [m for m in a.models.split(",") if m]
    rows = read_slice(a.trace, a.start_row, a.count)
    t_first = rows[0][0]
    records, threads = [], []
    t0 = time.time()
    for i, (t, ctx, gen) in enumerate(rows):
        n_prompt = clamp(math.ceil(ctx / a.prompt_scale), 1, a.max_prompt)
        n_out = clamp(math.ceil(gen / a.output_scale), 1, a.max_output)
        model = models[i % len(models)] + a.model_suffix
        prompt = [(a.start_row + i) * 7919 % (a.vocab - 1) + 1]
        prompt += [(prompt[0] + j * 104729) % (a.vocab - 1) + 1 for j in range(1, n_prompt)]
        rec = {"id": i, "model": model, "arrival_s": (t - t_first) / a.time_scale,
               "trace_context_tokens": ctx, "trace_generated_tokens": gen,
               "prompt_tokens": n_prompt, "max_tokens": n_out}
        records.append(rec)
        delay = t0 + rec["arrival_s"] - time.time()
        if delay > 0:
            time.sleep(delay)
        body = {"model": model, "prompt": prompt, "max_tokens": n_out, "ignore_eos": True,
                "stream": True}
        th = threading.Thread(target=one_request, args=(a.gateway, body, a.timeout, rec))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    with open(a.out, "w") as f:
        for r in records:
            r["sent_s"] = r["sent"] - t0
            if "first" in r:
                r["ttft_s"] = r["first"] - r["sent"]
                r["e2e_s"] = r["end"] - r["sent"]
                n = len(r.get("tokens", []))
                r["tpot_s"] = (r["last_token"] - r["first"]) / (n - 1) if n > 1 else 0.0
            r["t_sent"], r["t_end"] = r.pop("sent"), r.pop("end")
            r.pop("first", None)
            r.pop("last_token", None)
            f.write(json.dumps(r) + "\n")
    ok = sum(1 for r in records if r.get("status") == 200 and "ttft_s" in r and r.get("complete"))
    print(f"trace_client: {ok}/{len(records)} answered ({a.out})", file=sys.stderr)


if __name__ == "__main__":
    main()
