#!/usr/bin/env python3
# N clients connecting to thaw-gateway at once (threads), each GET /health: connect+answer
# times. A listen queue that overflows shows as ~1 s (the SYN resend); docs/GATEWAY.md.
#   bench/gateway/connect_burst.py N PORT build/default/gateway/thaw-gateway
import socket, subprocess, sys, threading, time
N = int(sys.argv[1]); port = int(sys.argv[2]); binary = sys.argv[3]
gw = subprocess.Popen([binary, "--route", "m=http://127.0.0.1:9", "--listen", f"127.0.0.1:{port}"],
                      stderr=subprocess.DEVNULL)
for _ in range(100):
    try: socket.create_connection(("127.0.0.1", port)).close(); break
    except OSError: time.sleep(0.05)
times = []; go = threading.Event(); lock = threading.Lock()
def client():
    go.wait(); t = time.monotonic()
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=20)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        while s.recv(4096): pass
        s.close(); d = time.monotonic() - t
    except OSError as e: d = 99
    with lock: times.append(d)
ts = [threading.Thread(target=client) for _ in range(N)]
for t in ts: t.start()
time.sleep(0.5); go.set()
for t in ts: t.join()
gw.terminate(); gw.wait()
times.sort()
over1 = sum(1 for x in times if x > 0.9)
print(f"N={N}: median {1000*times[len(times)//2]:.1f} ms, p99 {1000*times[int(len(times)*0.99)-1]:.1f} ms, max {1000*times[-1]:.1f} ms, {over1} over 0.9 s")
