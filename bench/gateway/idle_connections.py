#!/usr/bin/env python3
# thaw-gateway holding N idle keep-alive connections (each answered once, then silent, with
# --keep-alive-timeout 60s): its CPU use over 5 s, RSS, threads, and the worst of 5 new requests
# meanwhile. cpp-httplib 0.11 polls each waiting connection every ~11 ms (docs/GATEWAY.md).
#   bench/gateway/idle_connections.py N PORT build/default/gateway/thaw-gateway
import os, socket, subprocess, sys, time
N = int(sys.argv[1]); port = int(sys.argv[2]); binary = sys.argv[3]
gw = subprocess.Popen([binary, "--route", "m=http://127.0.0.1:9", "--listen", f"127.0.0.1:{port}",
                       "--keep-alive-timeout", "60s", "--max-connections", str(N + 64),
                       "--threads", "16"], stderr=subprocess.DEVNULL)
def stat():
    f = open(f"/proc/{gw.pid}/stat").read().split(") ")[1].split()
    ticks = int(f[11]) + int(f[12])
    rss = int(open(f"/proc/{gw.pid}/statm").read().split()[1]) * 4096
    threads = int(f[17])
    return ticks / os.sysconf("SC_CLK_TCK"), rss, threads
def get(s):
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while b"}" not in data: data += s.recv(4096)
try:
    for _ in range(100):
        try: socket.create_connection(("127.0.0.1", port)).close(); break
        except OSError: time.sleep(0.05)
    c0, r0, t0 = stat()
    conns = []
    for i in range(N):
        s = socket.create_connection(("127.0.0.1", port)); get(s); conns.append(s)
    time.sleep(1)
    c1, r1, t1 = stat(); time.sleep(5); c2, r2, t2 = stat()
    lat = []
    for i in range(5):
        st = time.monotonic(); s = socket.create_connection(("127.0.0.1", port)); get(s); s.close()
        lat.append((time.monotonic() - st) * 1000)
    print(f"N={N}: gateway CPU while they sit idle {100*(c2-c1)/5:.1f}% of a core; RSS {r0>>20} MiB -> {r2>>20} MiB; "
          f"threads {t0} -> {t2}; a new request meanwhile: worst {max(lat):.1f} ms of 5")
finally:
    gw.terminate(); gw.wait()
