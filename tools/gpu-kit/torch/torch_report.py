#!/usr/bin/env python3
"""Builds torch.json for run_torch_step.sh from what its runs left (standard library only).

  torch_report.py --work DIR --out FILE

DIR holds plan.tsv (one line per planned run: name, kind, description, reference runs,
requirements), status.tsv (name, exit status, skipped reason; the last line of a name wins),
notes.tsv (name, key, value), and per run NAME.json (torch_engine.py's result) and
NAME.shim.log (the shim's THAW_PRELOAD_LOG). FILE gets a JSON list, one entry per planned run:

  name, description, passed (true/false; null when skipped), skipped_reason,
  tokens_equal_baseline, first_token_s, baseline_first_token_s, baseline (which run),
  speedup (baseline_first_token_s / first_token_s), shim_log_summary (one line),
  shim_log (the parsed figures), checks ({requirement: true/false}), tokens, timings,
  graph (the --graph check), error, exit_code, notes, logs

Requirements (plan.tsv, comma-separated): shim (the shim loaded and reached thawd), attach (it
attached to a prewarmed slot), copy (bytes were injected from the slot: copy mode worked),
zero_copy (the shim says zero-copy on), graph (the engine's CUDA-graph check passed).
"""

import argparse
import json
import os
import re
import sys

PREFIX = re.compile(r"^thaw-preload\[(\d+)\]: (.*)$")
INJECTED = re.compile(
    r"slot (\S+): (\d+) bytes injected, (\d+) skipped \(zero-copy (on|off)\), (\d+) copied from "
    r"files, (\d+) pages mapped, (\d+) freed; (.*)$")


def read_tsv(path, columns):
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            parts = line.split("\t")
            parts += [""] * (columns - len(parts))
            rows.append(parts[:columns])
    return rows


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def mib(n):
    return f"{int(n) / 2**20:.1f} MiB"


def parse_shim_log(path):
    """The shim's log lines, boiled down to what tells whether thaw did its job."""
    if not os.path.exists(path):
        return None
    s = {
        "lines": 0, "pids": [], "loaded": False, "connected": False, "thawd_unreachable": None,
        "attached_slot": None, "attach_budget_bytes": None, "slot_layout": None,
        "no_slot": False, "injection": None, "no_zero_copy": None, "divergence": None,
        "layout_off": None, "record_compared": False, "record_stored": False,
        "deterministic_allocations": 0, "out_of_memory": 0, "streamed_mappings": 0,
        "notices": [],
    }
    pids = set()
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            raw = raw.rstrip("\n")
            m = PREFIX.match(raw)
            if not m:
                continue
            s["lines"] += 1
            pids.add(int(m.group(1)))
            line = m.group(2)
            if line.startswith("loaded ("):
                s["loaded"] = True
            elif line.startswith("connected to thawd"):
                s["connected"] = True
            elif line.startswith("thawd not reachable"):
                s["thawd_unreachable"] = line
            elif line.startswith("attached to slot "):
                m2 = re.match(r"attached to slot (\S+) of .*budget of (\d+) bytes", line)
                if m2:
                    s["attached_slot"] = m2.group(1)
                    s["attach_budget_bytes"] = int(m2.group(2))
            elif re.match(r"slot \S+ holds \d+ of its layout's bytes in a", line):
                m2 = re.search(r"in an? (\S+) layout", line)
                if m2:
                    s["slot_layout"] = m2.group(1)
            elif line.startswith("THAW_PRELOAD_ATTACH: no prewarmed slot"):
                s["no_slot"] = True
                s["notices"].append(line)
            elif INJECTED.match(line):
                g = INJECTED.match(line).groups()
                s["injection"] = {
                    "slot": g[0], "bytes_injected": int(g[1]), "bytes_skipped": int(g[2]),
                    "zero_copy": g[3] == "on", "bytes_copied_from_files": int(g[4]),
                    "pages_mapped": int(g[5]), "pages_freed": int(g[6]), "handback": g[7],
                }
            elif "no zero-copy (" in line:
                s["no_zero_copy"] = line
                s["notices"].append(line)
            elif "diverged from its recorded layout" in line:
                s["divergence"] = line
                s["notices"].append(line)
            elif line.startswith("deterministic layout off"):
                s["layout_off"] = line
            elif line.startswith("thawd has a layout record"):
                s["record_compared"] = True
            elif line.startswith("stored this run's layout record"):
                s["record_stored"] = True
            elif "(deterministic #" in line:
                s["deterministic_allocations"] += 1
            elif "OUT_OF_MEMORY" in line:
                s["out_of_memory"] += 1
            elif "served by userfaultfd" in line:
                s["streamed_mappings"] += 1
            elif "UnknownArtifact" in line:
                pass  # a first run: thawd has no record yet ("layout recorded" says the rest)
            elif any(w in line for w in ("failed", "error", "cannot", "refused", "lost thawd")):
                s["notices"].append(line)
    s["pids"] = sorted(pids)
    s["notices"] = s["notices"][:8]
    return s


def shim_summary(s):
    if s is None:
        return "no shim log (the shim did not load, or this run had no shim)"
    parts = []
    if not s["loaded"]:
        parts.append("shim log without the 'loaded' line")
    if s["thawd_unreachable"]:
        parts.append("thawd NOT reachable")
    elif s["connected"]:
        parts.append("connected to thawd")
    if s["attached_slot"]:
        parts.append(f"attached to {s['attached_slot']} ({s['slot_layout'] or '?'} layout)")
    elif s["no_slot"]:
        parts.append("no prewarmed slot to attach to")
    inj = s["injection"]
    if inj:
        parts.append(f"zero-copy {'on' if inj['zero_copy'] else 'off'}: {mib(inj['bytes_injected'])} "
                     f"injected, {mib(inj['bytes_skipped'])} skipped, "
                     f"{mib(inj['bytes_copied_from_files'])} copied from files; {inj['handback']}")
    if s["no_zero_copy"]:
        parts.append(s["no_zero_copy"])
    parts.append(f"{s['deterministic_allocations']} deterministic allocations")
    if s["divergence"]:
        parts.append(s["divergence"])
    elif s["record_compared"]:
        parts.append("layout compared with its record, no divergence")
    elif s["record_stored"]:
        parts.append("layout recorded")
    if s["out_of_memory"]:
        parts.append(f"{s['out_of_memory']} allocations refused (OUT_OF_MEMORY)")
    if s["streamed_mappings"]:
        parts.append(f"{s['streamed_mappings']} mappings streamed by userfaultfd")
    return "; ".join(parts)


def check(requirement, shim, engine):
    """(passed, why not) for one requirement of a run."""
    if requirement == "graph":
        g = (engine or {}).get("graph") or {}
        return bool(g.get("ok")), "the CUDA-graph replay did not match the eager step"
    if shim is None:
        return False, "no shim log: the shim did not load"
    if requirement == "shim":
        ok = shim["loaded"] and shim["connected"] and not shim["thawd_unreachable"]
        return ok, "the shim did not reach thawd"
    if requirement == "attach":
        return bool(shim["attached_slot"]), "the run did not attach to a prewarmed slot"
    if requirement == "copy":
        inj = shim["injection"]
        return bool(inj and inj["bytes_injected"] > 0), \
            "no weight bytes were injected from the slot (copy mode moved nothing)"
    if requirement == "zero_copy":
        inj = shim["injection"]
        return bool(inj and inj["zero_copy"]), "the shim did not run zero-copy"
    return False, f"unknown requirement {requirement}"


def build(work):
    plan = read_tsv(os.path.join(work, "plan.tsv"), 5)
    status = {}
    for name, rc, reason in read_tsv(os.path.join(work, "status.tsv"), 3):
        status[name] = (rc, reason)
    notes = {}
    for name, key, value in read_tsv(os.path.join(work, "notes.tsv"), 3):
        notes.setdefault(name, {})[key] = value
    engines = {name: read_json(os.path.join(work, f"{name}.json")) for name, *_ in plan}

    def good(name):
        st = status.get(name)
        e = engines.get(name)
        return st is not None and st[0] == "0" and e and e.get("tokens")

    entries = []
    for name, kind, description, refs, requires in plan:
        e = engines.get(name) or {}
        rc, skipped = status.get(name, ("", "not run"))
        ref = next((r for r in refs.split(",") if r and good(r)), None)
        shim = parse_shim_log(os.path.join(work, f"{name}.shim.log")) if kind == "shim" else None
        entry = {
            "name": name,
            "description": description,
            "passed": None,
            "skipped_reason": None,
            "tokens_equal_baseline": None,
            "first_token_s": e.get("timings", {}).get("first_token"),
            "baseline_first_token_s": None,
            "baseline": ref,
            "speedup": None,
            "shim_log_summary": shim_summary(shim) if kind == "shim" else "no shim (baseline)",
            "shim_log": shim,
            "checks": {},
            "tokens": e.get("tokens"),
            "timings": e.get("timings"),
            "graph": e.get("graph"),
            "error": e.get("error"),
            "exit_code": int(rc) if rc.lstrip("-").isdigit() else None,
            "notes": notes.get(name, {}),
            "logs": {k: f"{name}.{k}" for k in ("out", "err", "json", "shim.log")
                     if os.path.exists(os.path.join(work, f"{name}.{k}"))},
        }
        for key in ("mode", "alloc_conf", "dtype", "torch", "transformers", "device_name",
                    "from_pretrained_s", "to_device_s", "generate_s", "decode_step_ms", "missing"):
            if key in e:
                entry[key] = e[key]
        entries.append(entry)
        if rc == "":
            entry["skipped_reason"] = skipped or "not run"
            continue
        if rc in ("3", "skip"):
            entry["skipped_reason"] = skipped or e.get("error") or "a prerequisite is missing"
            continue
        if ref is not None and e.get("tokens") is not None:
            entry["tokens_equal_baseline"] = e["tokens"] == engines[ref]["tokens"]
            if kind == "shim":
                entry["baseline_first_token_s"] = engines[ref]["timings"].get("first_token")
                if entry["baseline_first_token_s"] and entry["first_token_s"]:
                    entry["speedup"] = round(entry["baseline_first_token_s"]
                                             / entry["first_token_s"], 3)
        failures = []
        if rc != "0":
            why = e.get("error") or skipped or "no result"
            failures.append(f"exited {rc}: {why}")
        if not e.get("tokens"):
            failures.append("no tokens")
        if refs and ref is None:
            failures.append(f"no baseline run to compare with ({refs} did not succeed)")
        elif entry["tokens_equal_baseline"] is False:
            failures.append(f"tokens differ from {ref}'s")
        for req in filter(None, requires.split(",")):
            ok, why = check(req, shim, e)
            entry["checks"][req] = ok
            if not ok:
                failures.append(why)
        entry["passed"] = not failures
        if failures:
            entry["error"] = "; ".join(dict.fromkeys(failures))
    return entries


def main(argv):
    p = argparse.ArgumentParser(prog="torch_report.py")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--print-summary", action="store_true",
                   help="also print 'N passed, N failed, N skipped' and one line per run")
    args = p.parse_args(argv)
    entries = build(args.work)
    tmp = f"{args.out}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(entries, f, indent=1)
        f.write("\n")
    os.replace(tmp, args.out)
    if args.print_summary:
        for x in entries:
            state = ("skipped" if x["passed"] is None else "passed" if x["passed"] else "FAILED")
            extra = x["skipped_reason"] or x["error"] or ""
            ft = x["first_token_s"]
            bt = x["baseline_first_token_s"]
            times = f" first token {ft:.2f} s" if ft is not None else ""
            times += f" (baseline {bt:.2f} s)" if bt is not None else ""
            print(f"  {x['name']:<22} {state:<8}{times}  {extra}".rstrip())
        n_pass = sum(1 for x in entries if x["passed"] is True)
        n_fail = sum(1 for x in entries if x["passed"] is False)
        n_skip = sum(1 for x in entries if x["passed"] is None)
        print(f"torch: {n_pass} passed, {n_fail} failed, {n_skip} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
