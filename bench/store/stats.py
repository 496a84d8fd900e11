#!/usr/bin/python3
"""Summaries for the model-store fetch benchmarks (issue 5).

The shell scripts append one line per run to a results file:

    <contender> <wall seconds> <payload bytes> <CPU seconds> <thaw-fetch JSON or ->

and this prints medians, goodput and the ratios against their targets. Goodput is
payload bytes (the model files' sizes) over the wall time of the fetching process, the
same clock for every contender. CPU seconds are the fetching processes' user + system
time (not the server's).
"""

import argparse
import json
import statistics
import sys


def load(path):
    runs = {}
    order = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            name, secs, nbytes, cpu, extra = line.rstrip("\n").split("\t", 4)
            if name not in runs:
                runs[name] = []
                order.append(name)
            runs[name].append(
                {
                    "s": float(secs),
                    "bytes": int(nbytes),
                    "cpu": float(cpu),
                    "thaw": json.loads(extra) if extra != "-" else None,
                }
            )
    return order, runs


def fmt_rate(bps):
    return f"{bps / 1e6:8.1f} MB/s {bps * 8 / 1e9:6.3f} Gbit/s"


def check(value, op, target):
    ok = value >= target if op == ">=" else value <= target
    return "meets" if ok else "MISSES"


def thaw_field(run, key):
    j = run["thaw"]
    if j is None or key not in j or j[key] is None:
        return None
    return float(j[key])


def cmd_goodput(a):
    order, runs = load(a.results)
    med = {}
    med_cpu = {}
    print(f"{'contender':<12} {'runs':>4} {'wall s (each run)':<28} {'median goodput':<32} "
          f"CPU s per GB")
    for name in order:
        rs = runs[name]
        goodputs = [r["bytes"] / r["s"] for r in rs]
        med[name] = statistics.median(goodputs)
        each = " ".join(f"{r['s']:.2f}" for r in rs)
        cpu_gb = med_cpu[name] = statistics.median(r["cpu"] / (r["bytes"] / 1e9) for r in rs)
        print(f"{name:<12} {len(rs):>4} {each:<28} {fmt_rate(med[name]):<32} {cpu_gb:.2f}")
        self_gp = [v for v in (thaw_field(r, "goodput_bytes_per_s") for r in rs) if v]
        if self_gp:
            print(f"{'':<12} {'':>4} {'  (self-reported by thaw-fetch)':<28} "
                  f"{fmt_rate(statistics.median(self_gp))}")
        ttft = [v for v in (thaw_field(r, "time_to_first_tensor_s") for r in rs) if v is not None]
        if ttft:
            print(f"{'':<12} {'':>4} {'  time to first tensor ready':<28} "
                  f"median {statistics.median(ttft) * 1e3:.1f} ms "
                  f"(runs: {', '.join(f'{t * 1e3:.1f}' for t in ttft)} ms)")
    if a.link_bps:
        mss = a.mtu - 40 - 12  # IPv4 + TCP + timestamp option
        ceiling = mss / (a.mtu + 14)  # HTB counts the Ethernet header of every frame
        print(f"shaped rate {a.link_bps / 1e9:g} Gbit/s = {a.link_bps / 8 / 1e6:.1f} MB/s; "
              f"TCP payload ceiling at MTU {a.mtu}: {ceiling * 100:.2f} % of it")
        for name in order:
            pct = med[name] * 8 / a.link_bps * 100
            line = (f"  {name:<11} goodput = {pct:6.2f} % of the shaped rate "
                    f"({pct / ceiling:6.2f} % of the payload ceiling)")
            if name == a.subject and a.link_target is not None:
                line += f"  target >= {a.link_target:g} %: {check(pct, '>=', a.link_target)}"
            print(line)
    for spec in a.ratio:
        pair, _, target = spec.partition(">=")
        num, den = pair.split("/")
        r = med[num] / med[den]
        verdict = (f"  (target >= {float(target):g}x: {check(r, '>=', float(target))})"
                   if target else "  (no target: for comparison)")
        print(f"goodput ratio {num}/{den} = {r:.2f}x{verdict}")
    for pair in a.cpu_ratio:
        num, den = pair.split("/")
        r = med_cpu[num] / med_cpu[den]
        print(f"CPU s per GB ratio {num}/{den} = {r:.2f}x ({med_cpu[num]:.2f} / {med_cpu[den]:.2f}; "
              f"below 1: {num} spends less CPU per byte)")


def cmd_pipeline(a):
    order, runs = load(a.results)
    med = {n: statistics.median(r["s"] for r in runs[n]) for n in order}
    if not a.peer:
        for n in order:
            each = " ".join(f"{r['s']:.2f}" for r in runs[n])
            cpu = statistics.median(r["cpu"] for r in runs[n])
            print(f"{n:<30} runs: {each:<24} median {med[n]:7.2f} s, "
                  f"CPU {cpu:6.2f} s (fetching processes)")
    r = med[a.staged] / med[a.full]
    if a.peer:
        print(f"peer: time ratio {a.staged} / {a.full} = {r:.3f}  "
              f"(largest shard: {a.largest_stage_share:.3f} of the model's bytes)")
    else:
        print(f"time ratio {a.staged} / {a.full} = {r:.3f}  "
              f"(target <= {a.target:g}: {check(r, '<=', a.target)}; ideal 0.25; "
              f"this model's largest stage is {a.largest_stage_share:.3f} of its bytes)")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("goodput")
    g.add_argument("results")
    g.add_argument("--ratio", action="append", default=[], help="A/B or A/B>=X")
    g.add_argument("--cpu-ratio", action="append", default=[],
                   help="A/B: ratio of median CPU seconds per GB, no target")
    g.add_argument("--link-bps", type=float)
    g.add_argument("--mtu", type=int, default=1500)
    g.add_argument("--subject", default="thaw")
    g.add_argument("--link-target", type=float)
    g.set_defaults(fn=cmd_goodput)
    q = sub.add_parser("pipeline")
    q.add_argument("results")
    q.add_argument("--full", required=True)
    q.add_argument("--staged", required=True)
    q.add_argument("--target", type=float, default=0.28)
    q.add_argument("--largest-stage-share", type=float, required=True)
    q.add_argument("--peer", action="store_true", help="a peer's ratio: no target, no table")
    q.set_defaults(fn=cmd_pipeline)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
