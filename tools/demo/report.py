#!/usr/bin/python3
"""The demo's report: one table, a JSON copy of it, and a timeline picture (SVG).

tools/demo/run-demo.sh runs the reference engine four ways and writes one line per run to a
TSV file (id, label, timeline file, stdout file, run start, fetch end, engine start; times
are wall-clock seconds, "-" where a run has no fetch). Each engine run wrote its phase
timeline (--timeline: one JSON object per event, seconds since the process started) and its
tokens (--json: one object per prompt on stdout). This turns them into

  * the table on stdout: per run, fetch, engine init, weights, profile/KV sizing, graphs,
    first token, total (run start to the first token), speed-up against the first run, and
    whether its tokens equal the first run's;
  * --json FILE: the same numbers, machine-readable (tests/tools/demo_test.py reads it);
  * --svg FILE: one lane per run, one colour per phase (HydraServe's Fig. 6), the fetch
    drawn above the engine's phases so that overlap shows.

Standard library only (Debian's /usr/bin/python3).

usage: report.py RUNS.tsv [--json FILE] [--svg FILE] [--title TEXT] [--note TEXT]...
"""

import argparse
import html
import json
import sys

# Engine phases, in order: (key, table heading, colour, timeline event that ends it).
PHASES = [
    ("init", "engine init", "#8c8c8c", "allocator_ready"),
    ("weights", "weights", "#d62728", "weights_loaded"),
    ("profile_kv", "profile/KV", "#ff7f0e", "kv_cache_ready"),
    ("graphs", "graphs", "#9467bd", "graphs_captured"),
    ("first_token", "first token", "#2ca02c", "first_token"),
]
FETCH_COLOUR = "#1f77b4"


def load_timeline(path):
    """Seconds since the engine's process start of each event's first occurrence."""
    events = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            e = json.loads(line)
            events.setdefault(e["event"], e["since_start_ms"] / 1000.0)
    return events


def load_tokens(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line)["tokens"])
    return out


def phases_of(events):
    """Durations of PHASES from one timeline; a phase whose event is absent (graphs in eager
    mode) lasts 0 and the next phase starts where the previous one ended."""
    missing = [e for e in ("allocator_ready", "weights_loaded", "kv_cache_ready", "first_token")
               if e not in events]
    if missing:
        raise ValueError("timeline lacks " + ", ".join(missing))
    out = {}
    prev = 0.0
    for key, _, _, event in PHASES:
        end = events.get(event, prev)
        out[key] = max(0.0, end - prev)
        prev = max(prev, end)
    return out


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def read_runs(tsv):
    runs = []
    with open(tsv) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            rid, label, timeline, out, start, fetch_end, engine_start = line.split("\t")[:7]
            start = float(start)
            engine_at = float(engine_start) - start
            fetch = None if fetch_end == "-" else float(fetch_end) - start
            # Several engine runs (--repeat): each phase's median; every run's tokens count.
            timelines = [load_timeline(t) for t in timeline.split(",")]
            phases = [phases_of(ev) for ev in timelines]
            tokens = [load_tokens(o) for o in out.split(",")]
            first_token = median([ev["first_token"] for ev in timelines])
            run = {
                "id": rid,
                "label": label,
                "engine_runs": len(timelines),
                "fetch_s": fetch,
                "engine_start_s": engine_at,
                **{k + "_s": median([ph[k] for ph in phases]) for k, _, _, _ in PHASES},
                **{k + "_all_s": [ph[k] for ph in phases] for k in ("weights",)},
                "engine_to_first_token_s": first_token,
                "total_s": engine_at + first_token,
                "tokens": tokens[0],
                "tokens_all_runs_equal": all(t == tokens[0] for t in tokens),
            }
            runs.append(run)
    if not runs:
        raise ValueError(tsv + ": no runs")
    base = runs[0]
    for r in runs:
        r["speedup"] = base["total_s"] / r["total_s"] if r["total_s"] > 0 else None
        r["tokens_equal_first"] = r["tokens"] == base["tokens"] and r["tokens_all_runs_equal"]
    return runs


def fmt_s(v):
    return "—" if v is None else "%.2f" % v


def table(runs):
    cols = ["run", "fetch", "engine init", "weights", "profile/KV", "graphs", "first token",
            "total", "speed-up", "tokens = (a)"]
    rows = []
    for r in runs:
        rows.append([
            "(%s) %s" % (r["id"], r["label"]),
            fmt_s(r["fetch_s"]),
            fmt_s(r["init_s"]),
            fmt_s(r["weights_s"]),
            fmt_s(r["profile_kv_s"]),
            fmt_s(r["graphs_s"]),
            fmt_s(r["first_token_s"]),
            fmt_s(r["total_s"]),
            "%.2fx" % r["speedup"] if r["speedup"] else "—",
            "yes" if r["tokens_equal_first"] else "NO",
        ])
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
    lines = []
    fmt_row = lambda cells: "  ".join(
        c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cells))
    lines.append(fmt_row(cols))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(fmt_row(row) for row in rows)
    return "\n".join(lines)


def svg(runs, title, notes):
    """One lane per run: the fetch (thin bar above) and the engine's phases (below), from the
    run's start; a shared seconds axis."""
    left, right, top, lane_h = 230, 30, 60, 56
    width = 1000
    span = max(max(r["total_s"], r["fetch_s"] or 0.0) for r in runs) or 1.0
    # A round axis step: 1, 2 or 5 times a power of ten, about 8 ticks.
    step = 10 ** 9
    for m in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500):
        if span / m <= 10:
            step = m
            break
    ticks = int(span / step) + 1
    span = ticks * step
    scale = (width - left - right) / span
    legend_y = top + lane_h * len(runs) + 40
    height = legend_y + 40 + 18 * len(notes)
    x = lambda t: left + t * scale
    out = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
        'font-family="sans-serif" font-size="13">' % (width, height),
        '<rect width="100%" height="100%" fill="white"/>',
        '<text x="%d" y="24" font-size="16" font-weight="bold">%s</text>'
        % (left, html.escape(title)),
    ]
    axis_y = top + lane_h * len(runs) + 6
    for i in range(ticks + 1):
        t = i * step
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>'
                   % (x(t), top - 6, x(t), axis_y))
        out.append('<text x="%.1f" y="%d" text-anchor="middle" fill="#444">%g s</text>'
                   % (x(t), axis_y + 16, round(t, 6)))
    for i, r in enumerate(runs):
        y = top + i * lane_h
        out.append('<text class="lane" x="%d" y="%d" text-anchor="end">(%s) %s</text>'
                   % (left - 10, y + 28, r["id"], html.escape(r["label"])))
        if r["fetch_s"] is not None:
            out.append('<rect x="%.1f" y="%d" width="%.1f" height="12" fill="%s">'
                       '<title>fetch %.3f s</title></rect>'
                       % (x(0), y + 4, max(1.0, r["fetch_s"] * scale), FETCH_COLOUR, r["fetch_s"]))
        t = r["engine_start_s"]
        for key, name, colour, _ in PHASES:
            d = r[key + "_s"]
            if d > 0:
                out.append('<rect x="%.1f" y="%d" width="%.1f" height="24" fill="%s">'
                           '<title>%s %.3f s</title></rect>'
                           % (x(t), y + 20, max(1.0, d * scale), colour, name, d))
            t += d
        out.append('<text x="%.1f" y="%d" fill="#222">%.2f s</text>'
                   % (x(r["total_s"]) + 5, y + 37, r["total_s"]))
    lx = left
    for name, colour in [("fetch", FETCH_COLOUR)] + [(n, c) for _, n, c, _ in PHASES]:
        out.append('<rect x="%d" y="%d" width="14" height="14" fill="%s"/>' % (lx, legend_y, colour))
        out.append('<text x="%d" y="%d">%s</text>' % (lx + 19, legend_y + 12, name))
        lx += 30 + 8 * len(name)
    for j, n in enumerate(notes):
        out.append('<text x="%d" y="%d" fill="#444" font-size="12">%s</text>'
                   % (left, legend_y + 38 + 18 * j, html.escape(n)))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs")
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--svg")
    ap.add_argument("--title", default="thaw: four ways to the first token")
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--meta", default="{}", help="JSON object stored as 'meta' in --json")
    a = ap.parse_args()
    try:
        runs = read_runs(a.runs)
    except (OSError, ValueError, KeyError) as e:
        sys.exit("report.py: %s" % e)
    print(table(runs))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"meta": json.loads(a.meta), "notes": a.note, "svg": a.svg, "runs": runs},
                      f, indent=1)
            f.write("\n")
    if a.svg:
        with open(a.svg, "w") as f:
            f.write(svg(runs, a.title, a.note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
