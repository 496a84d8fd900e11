#!/usr/bin/env python3
"""The verdict of the kit's step f (transparent CUDA-graph restore under a real PyTorch), from
what its two runs left: no torch needed, so it is tested on any machine.

  graph_verdict.py --first R1.json --second R2.json --first-log L1 --second-log L2
                   --artifacts A.json [--out V.json]

R1, R2: torch_graph.py's outputs (first run: records; second run: restores); L1, L2: each run's
shim log (THAW_PRELOAD_LOG) or stderr, where the shim writes at exit
  thaw: graph restore summary: captures=M transparent=N fallbacks=K[ reasons...]
A: `thawctl --json artifacts` after the first run.

The step passes when both runs completed, their tokens and logits (SHA-256 of the float32
bytes) are bit-identical, thawd holds a readable "graphs" artifact, the second run's summary
says transparent >= 1 and fallbacks = 0. Every unmet condition is listed in "problems" (the
fallback reasons verbatim). Prints the verdict as JSON (and writes --out); exit status 0 when
it passed, 1 when not, 2 on bad usage.
"""

import argparse
import json
import re
import sys

SUMMARY = re.compile(
    r"thaw: graph restore summary: captures=(\d+) transparent=(\d+) fallbacks=(\d+)(.*)$")


def load_json(path, what, problems):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        problems.append(f"{what}: no file {path}")
    except (OSError, ValueError) as e:
        problems.append(f"{what}: {path} unreadable: {e}")
    return None


def summary_of(path):
    """(captures, transparent, fallbacks, reasons) of the last summary line, or None."""
    found = None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = SUMMARY.search(line.rstrip("\n"))
                if m:
                    found = (int(m[1]), int(m[2]), int(m[3]), m[4].strip())
    except OSError:
        return None
    return found


def verdict(first, second, first_log, second_log, artifacts):
    problems = []
    figures = {}
    runs = {}
    for name, path in (("first run", first), ("second run", second)):
        doc = load_json(path, name, problems)
        if doc is None:
            continue
        runs[name] = doc
        if doc.get("missing"):
            problems.append(f"{name}: missing {doc['missing']}")
        elif not doc.get("ok"):
            problems.append(f"{name} failed in phase {doc.get('phase')}: {doc.get('error')}")
    r1, r2 = runs.get("first run"), runs.get("second run")
    if r1 and r2 and r1.get("ok") and r2.get("ok"):
        if r1.get("tokens") != r2.get("tokens"):
            problems.append(f"tokens differ: {r1.get('tokens')} then {r2.get('tokens')}")
        if not r1.get("logits_sha256") or r1.get("logits_sha256") != r2.get("logits_sha256"):
            problems.append(
                f"logits differ: sha256 {r1.get('logits_sha256')} then {r2.get('logits_sha256')} "
                f"(first values {r1.get('logits_head')} then {r2.get('logits_head')})")
        figures["capture_s_first"] = r1.get("capture_s")
        figures["capture_s_second"] = r2.get("capture_s")

    arts = load_json(artifacts, "thawctl --json artifacts", problems)
    if arts is not None:
        graphs = [a for a in arts if isinstance(a, dict) and a.get("kind") == "graphs"]
        figures["graphs_artifacts"] = len(graphs)
        if not graphs:
            problems.append("the first run left no graphs artifact in thawd (thawctl artifacts: "
                            f"{sorted({a.get('kind') for a in arts if isinstance(a, dict)})})")
        elif not any(a.get("readable") for a in graphs):
            problems.append(f"thawd's graphs artifact is unreadable: {graphs[0].get('summary')}")
        else:
            figures["graphs_artifact"] = next(a for a in graphs if a.get("readable")).get("summary")

    for name, path, key in (("first run", first_log, "first"), ("second run", second_log, "second")):
        s = summary_of(path)
        if s is None:
            if key == "second":
                problems.append(f"the second run's shim wrote no 'thaw: graph restore summary' line "
                                f"(in {path}): a shim without transparent graph restore?")
            continue
        figures[f"{key}_captures"], figures[f"{key}_transparent"] = s[0], s[1]
        figures[f"{key}_fallbacks"] = s[2]
        if key == "second":
            if s[2] > 0:
                problems.append(f"the second run fell back {s[2]} time(s): {s[3] or '(no reason given)'}")
            if s[1] < 1:
                problems.append(f"the second run restored no graph transparently "
                                f"(captures={s[0]} transparent={s[1]} fallbacks={s[2]})")
    return {"passed": not problems, "problems": problems, "figures": figures}


def main(argv):
    p = argparse.ArgumentParser(prog="graph_verdict.py", description=__doc__.split("\n\n")[0])
    for flag in ("--first", "--second", "--first-log", "--second-log", "--artifacts"):
        p.add_argument(flag, required=True)
    p.add_argument("--out")
    a = p.parse_args(argv)
    v = verdict(a.first, a.second, a.first_log, a.second_log, a.artifacts)
    text = json.dumps(v, indent=1, sort_keys=True)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)
    return 0 if v["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
