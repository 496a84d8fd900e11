#!/usr/bin/python3
"""The cluster demo's report: per-request TTFT/TPOT, SLO attainment of thaw and the baseline,
and a timeline of every worker's phases (HydraServe Fig. 6 style) as SVG. Stdlib only.

  report.py OUT [--slo-scale 5]

OUT holds thaw/ and baseline/ as tools/demo-cluster/phase.sh leaves them. Writes
OUT/summary.json, OUT/summary.md and OUT/timeline.svg; prints the markdown.

Two SLOs. The model's TTFT SLO, as phase.sh deployed it for Alg. 1 (OUT/<mode>/slo.jsonl):
a request meets it when its first token arrives within it (HydraServe's TTFT SLO attainment).
And the warm yardstick: a request meets it when its time to first token is at most --slo-scale
times what the
same request takes on a warm worker of its model: warm_ttft + (n - 1) * warm_tpot, from the
two warm requests phase.sh sends after the replay (1 and 8 tokens; thaw's pass, else the
baseline's). TTFT and TPOT per request are the trace client's, from the stream: the first
token's arrival, and the mean gap between the first and the last token (the reference engine
and the gateway stream each token as it is decoded). The yardstick stays the warm latency of n
tokens, measured the same way in both passes.
"""
import argparse
import datetime
import glob
import html
import json
import os
import re
import statistics
import sys


def load_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def warm_costs(out):
    costs = {}
    for mode in ("baseline", "thaw"):  # thaw's last: it wins where both have one
        by = {}
        for w in load_jsonl(os.path.join(out, mode, "warm.jsonl")):
            if w.get("status") == 200:
                by.setdefault(w["model"], {})[w["max_tokens"]] = w["e2e_s"]
        for m, d in by.items():
            if 1 in d and 8 in d:
                costs[m] = {"ttft_s": d[1], "tpot_s": max(0.0, (d[8] - d[1]) / 7), "from": mode}
    return costs


def deployed_slos(out):
    """Each model's TTFT SLO as phase.sh deployed it (the same in both modes)."""
    slos = {}
    for mode in ("baseline", "thaw"):
        for row in load_jsonl(os.path.join(out, mode, "slo.jsonl")) or []:
            slos[row["model"]] = row["ttft_slo_s"]
    return slos


def base_model(name):
    return name[: -len("-baseline")] if name.endswith("-baseline") else name


def pct(values, q):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def mode_summary(out, mode, costs, scale, slos=None):
    slos = slos or {}
    reqs = load_jsonl(os.path.join(out, mode, "requests.jsonl"))
    rows, met, judged = [], 0, 0
    ttft_met, ttft_judged = 0, 0
    first_seen = set()
    for r in reqs:
        m = base_model(r["model"])
        # A stream cut short (no [DONE]: its worker died mid-answer) is not an answer.
        ok = r.get("status") == 200 and "ttft_s" in r and r.get("complete", True)
        cold = m not in first_seen
        first_seen.add(m)
        slo = None
        if m in costs:
            c = costs[m]
            slo = scale * (c["ttft_s"] + (r["max_tokens"] - 1) * c["tpot_s"])
        meets = bool(ok and slo is not None and r["ttft_s"] <= slo)
        if slo is not None:
            judged += 1
            met += meets
        # HydraServe's metric: the first token within the model's TTFT SLO (the one Alg. 1
        # planned for); a failed request misses it.
        meets_ttft = None
        if m in slos:
            meets_ttft = bool(ok and r["ttft_s"] <= slos[m])
            ttft_judged += 1
            ttft_met += meets_ttft
        rows.append({"id": r["id"], "model": m, "arrival_s": round(r["arrival_s"], 3),
                     "prompt_tokens": r["prompt_tokens"], "max_tokens": r["max_tokens"],
                     "status": r.get("status"), "ttft_s": r.get("ttft_s"), "tpot_s": r.get("tpot_s"),
                     "slo_s": slo, "meets_slo": meets, "ttft_slo_s": slos.get(m),
                     "meets_ttft_slo": meets_ttft, "first_of_model": cold,
                     "error": r.get("error")})
    ttfts = [x["ttft_s"] for x in rows if x["ttft_s"] is not None]
    cold = [x["ttft_s"] for x in rows if x["first_of_model"] and x["ttft_s"] is not None]
    state = {}
    p = os.path.join(out, mode, "state.json")
    if os.path.exists(p):
        try:
            state = json.load(open(p))
        except json.JSONDecodeError:
            state = {}
    plans = [{"model": base_model(pl.get("model", "")), "stages": pl.get("stages"),
              "nodes": [s.get("node_id") for s in pl.get("placement", [])],
              "phase": pl.get("phase"), "predicted_ttft_s": pl.get("predicted_ttft_s")}
             for pl in state.get("plans", [])]
    return {"requests": len(rows), "answered": sum(1 for x in rows if x["status"] == 200),
            "ttft_p50_s": pct(ttfts, 0.5), "ttft_p90_s": pct(ttfts, 0.9),
            "ttft_max_s": max(ttfts) if ttfts else None,
            "cold_start_ttft_s": {x["model"]: x["ttft_s"] for x in rows if x["first_of_model"]},
            "cold_start_ttft_mean_s": statistics.mean(cold) if cold else None,
            "slo_attainment": (met / judged) if judged else None, "slo_judged": judged,
            "ttft_slo_attainment": (ttft_met / ttft_judged) if ttft_judged else None,
            "ttft_slo_judged": ttft_judged,
            "plans": plans, "per_request": rows}


# ------------------------------------------------------------------------------- timeline
PHASE_COLORS = {"thawd fetch (node link)": "#bbbbbb", "wait for the whole model": "#d62728", "process start": "#8c564b",
                "CUDA init": "#9467bd", "weights (stream/load)": "#1f77b4",
                "engine init (profile, KV)": "#ff7f0e", "serving": "#2ca02c"}


def worker_rows(out, mode, state):
    units = {}
    for pl in state.get("plans", []):
        for s in pl.get("placement", []):
            unit = "thaw-worker-{}-{}".format(pl["id"], s["stage"]).replace(".", "_")
            units[unit + "-full"] = "{} full worker (consolidation) @{}".format(
                base_model(pl.get("model", "?")), s.get("node_id", "?"))
            units[unit] = "{} {}/{} @{}".format(base_model(pl.get("model", "?")), s["stage"] + 1,
                                                 pl.get("stages", "?"), s.get("node_id", "?"))
    reqs = load_jsonl(os.path.join(out, mode, "requests.jsonl"))
    if not reqs:
        return [], 0, 0
    t0 = min(r["t_sent"] - r["sent_s"] for r in reqs)
    t_end = max(r["t_end"] for r in reqs) - t0
    rows = []
    for box in sorted(glob.glob(os.path.join(out, mode, "workers", "*", "*.timeline.box"))):
        marks = {m["phase"]: m["t"] for m in load_jsonl(box)}
        events = {}
        for e in load_jsonl(box[: -len(".box")]):
            events.setdefault(e["event"], e["t_ns"])
        unit = os.path.basename(box)[: -len(".timeline.box")]
        node = os.path.basename(os.path.dirname(box))
        label = units.get(unit, "{} @{}".format(unit, node))
        if "launch" not in marks:
            continue
        segs = []
        launch = marks["launch"] - t0
        exec_t = marks.get("exec", marks["launch"]) - t0
        if "fetched" in marks:
            segs.append(("wait for the whole model", launch, marks["fetched"] - t0))
        if "process_start" in events:
            def at(ev):
                return exec_t + (events[ev] - events["process_start"]) / 1e9
            segs.append(("process start", segs[-1][2] if segs else launch, exec_t))
            if "driver_init" in events:
                segs.append(("CUDA init", exec_t, at("driver_init")))
            if "weights_loaded" in events:
                segs.append(("weights (stream/load)", at("allocator_ready") if "allocator_ready" in events
                             else at("driver_init"), at("weights_loaded")))
                end_init = at("serving") if "serving" in events else at("ready") if "ready" in events else None
                if end_init is not None:
                    segs.append(("engine init (profile, KV)", at("weights_loaded"), end_init))
                    segs.append(("serving", end_init, max(end_init, t_end)))
        model = label.split(" ")[0]
        fetch = node_fetches(out, mode, node).get(model + ("-baseline" if mode == "baseline" else ""))
        if fetch:
            segs.insert(0, ("thawd fetch (node link)", fetch[0] - t0, fetch[1] - t0))
        rows.append({"label": label, "segments": segs})
    return rows, t_end, t0


def node_fetches(out, mode, node):
    """{model: (start, end)} of thawd's first fetch of each model on a node, wall clock, from
    its log ('fetching M (...' and 'fetched M: N bytes in T s')."""
    path = os.path.join(out, mode, "logs", "thawd-{}.log".format(node))
    found = {}
    if not os.path.exists(path):
        return found
    for line in open(path, errors="replace"):
        m = re.match(r"(\S+) thawd: \w+: (fetching|fetched) ([^ :]+)", line)
        if not m:
            continue
        try:
            t = datetime.datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
        except ValueError:
            continue
        start, end = found.get(m[3], (None, None))
        if m[2] == "fetching" and start is None:
            start = t
        if m[2] == "fetched" and end is None and start is not None:
            end = t
        found[m[3]] = (start, end)
    return {k: v for k, v in found.items() if v[0] is not None and v[1] is not None}


def svg_timeline(panels, path):
    width, left, row_h, top = 1100, 260, 18, 40
    total_rows = sum(len(p["rows"]) + 2 for p in panels)
    height = top + total_rows * row_h + 60
    t_max = max([p["t_end"] for p in panels] + [1.0])
    scale = (width - left - 20) / t_max
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" '
           'font-size="11">'.format(width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="10" y="20" font-size="14">Cluster in a box: every worker\'s phases, seconds since the '
           'trace replay began (HydraServe Fig. 6 style)</text>']
    y = top
    for p in panels:
        out.append('<text x="10" y="{}" font-weight="bold">{}</text>'.format(y + 12, html.escape(p["title"])))
        y += row_h
        for r in p["rows"]:
            out.append('<text x="10" y="{}">{}</text>'.format(y + 12, html.escape(r["label"])))
            for name, a, b in r["segments"]:
                if b <= a:
                    b = a + 0.002
                # thawd's fetch: a thin bar on top, the worker's own phases below it
                fetch = name.startswith("thawd fetch")
                out.append('<rect x="{:.1f}" y="{}" width="{:.1f}" height="{}" fill="{}"><title>{}: {:.3f}-{:.3f} s'
                           '</title></rect>'.format(left + a * scale, y + 1 if fetch else y + 6,
                                                    max(0.5, (b - a) * scale), 4 if fetch else row_h - 8,
                                                    PHASE_COLORS[name], html.escape(name), a, b))
            y += row_h
        y += row_h
    # axis
    step = max(1, int(t_max / 10))
    for s in range(0, int(t_max) + 1, step):
        x = left + s * scale
        out.append('<line x1="{0:.1f}" y1="{1}" x2="{0:.1f}" y2="{2}" stroke="#ccc"/>'.format(x, top, y))
        out.append('<text x="{:.1f}" y="{}" text-anchor="middle">{} s</text>'.format(x, y + 12, s))
    lx = left
    for name, color in PHASE_COLORS.items():
        out.append('<rect x="{}" y="{}" width="10" height="10" fill="{}"/>'.format(lx, y + 22, color))
        out.append('<text x="{}" y="{}">{}</text>'.format(lx + 14, y + 31, html.escape(name)))
        lx += 14 + 7 * len(name) + 16
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def fmt(v, unit="s"):
    return "—" if v is None else "{:.2f} {}".format(v, unit) if unit else "{:.2f}".format(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--slo-scale", type=float, default=5.0)
    ap.add_argument("--note", action="append", default=[])
    a = ap.parse_args()
    costs = warm_costs(a.out)
    slos = deployed_slos(a.out)
    summary = {"slo_scale": a.slo_scale, "warm": costs, "ttft_slo": slos, "notes": a.note, "modes": {}}
    panels = []
    for mode, title in (("thaw", "thaw: streamed stages (PP as Alg. 1 plans), under the shim"),
                        ("baseline", "baseline: one worker per cold start, whole download then start")):
        if not os.path.isdir(os.path.join(a.out, mode)):
            continue
        s = mode_summary(a.out, mode, costs, a.slo_scale, slos)
        state = {}
        try:
            state = json.load(open(os.path.join(a.out, mode, "state.json")))
        except (OSError, json.JSONDecodeError):
            pass
        rows, t_end, _ = worker_rows(a.out, mode, state)
        s["workers"] = rows
        summary["modes"][mode] = s
        panels.append({"title": title, "rows": rows, "t_end": t_end})
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    svg_timeline(panels, os.path.join(a.out, "timeline.svg"))

    md = ["# Cluster in a box: thaw vs the baseline on one trace slice", ""]
    md += ["- " + n for n in a.note]
    md += ["- SLO: TTFT <= {} x the warm latency of the same request (warm TTFT + (n-1) x warm TPOT)".format(
        a.slo_scale)]
    if slos:
        md += ["- TTFT SLO (HydraServe's attainment): TTFT <= the model's TTFT SLO as deployed for Alg. 1 "
               "(" + ", ".join("{} {:.2f} s".format(m, v) for m, v in sorted(slos.items())) + ")"]
    md += ["", "| | requests | answered | cold-start TTFT (mean of each model's first) | TTFT p50 | TTFT p90 | "
           "TTFT max | SLO attainment | TTFT SLO attainment |", "|---|---|---|---|---|---|---|---|---|"]

    def attainment(value, judged):
        return "—" if value is None else "{:.0f} % of {}".format(100 * value, judged)

    for mode, s in summary["modes"].items():
        md.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            mode, s["requests"], s["answered"], fmt(s["cold_start_ttft_mean_s"]), fmt(s["ttft_p50_s"]),
            fmt(s["ttft_p90_s"]), fmt(s["ttft_max_s"]), attainment(s["slo_attainment"], s["slo_judged"]),
            attainment(s["ttft_slo_attainment"], s["ttft_slo_judged"])))
    md += ["", "| model | warm TTFT | warm TPOT | " + " | ".join(
        "{} cold-start TTFT".format(m) for m in summary["modes"]) + " | thaw plan |",
           "|---|---|---|" + "---|" * len(summary["modes"]) + "---|"]
    for m, c in sorted(costs.items()):
        colds = [fmt(s["cold_start_ttft_s"].get(m)) for s in summary["modes"].values()]
        plan = next((p for p in summary["modes"].get("thaw", {}).get("plans", []) if p["model"] == m), None)
        plan_text = "PP={} on {}".format(plan["stages"], ",".join(plan["nodes"])) if plan else "—"
        md.append("| {} | {} | {} | {} | {} |".format(m, fmt(c["ttft_s"]), fmt(c["tpot_s"] * 1000, "ms"),
                                                     " | ".join(colds), plan_text))
    md += ["", "Per request (TTFT = the first streamed token's arrival; TPOT = mean gap to the last token):", "",
           "| mode | id | model | arrival | prompt/out | status | TTFT | TPOT | SLO | met |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for mode, s in summary["modes"].items():
        for r in s["per_request"]:
            tpot = r.get("tpot_s")
            md.append("| {} | {} | {} | {:.2f} | {}/{} | {} | {} | {} | {} | {} |".format(
                mode, r["id"], r["model"], r["arrival_s"], r["prompt_tokens"], r["max_tokens"], r["status"],
                fmt(r["ttft_s"]), fmt(tpot * 1000, "ms") if tpot is not None else "—", fmt(r["slo_s"]),
                "yes" if r["meets_slo"] else "no"))
    text = "\n".join(md) + "\n"
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
