#!/usr/bin/python3
"""One streamed completion through the gateway; prints "STATUS TTFT TOTAL TOKENS".

TTFT is the time from sending the request to the first token's event (the reference engine
streams each token as it is decoded), TOTAL to the end of the stream; TOKENS are the token ids
joined by commas. Exit status 1 with the answer on stderr when it is not a whole answer.
usage: stream_ttft.py GATEWAY_URL MODEL PROMPT_JSON MAX_TOKENS [TIMEOUT_S]
"""
import http.client
import json
import sys
import time
import urllib.parse


def main():
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    url, model, prompt, max_tokens = sys.argv[1:5]
    timeout = float(sys.argv[5]) if len(sys.argv) == 6 else 150.0
    u = urllib.parse.urlsplit(url)
    body = {"model": model, "prompt": json.loads(prompt), "max_tokens": int(max_tokens),
            "ignore_eos": True, "stream": True}
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    conn.request("POST", "/v1/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        print(f"{resp.status} 0 0 -", flush=True)
        sys.exit(f"the gateway answered {resp.status}: {resp.read(2000).decode(errors='replace')}")
    tokens, first, done = [], None, False
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            break
        event = json.loads(data)
        if "error" in event:
            sys.exit(f"error event in the stream: {json.dumps(event['error'])[:2000]}")
        for c in event.get("choices", []):
            ids = c.get("token_ids", [])
            if ids and first is None:
                first = time.monotonic() - t0
            tokens += ids
    total = time.monotonic() - t0
    if not done or first is None:
        sys.exit(f"the stream ended without [DONE] or without a token ({len(tokens)} tokens)")
    print(f"200 {first:.3f} {total:.3f} {','.join(map(str, tokens))}")


if __name__ == "__main__":
    main()
