#!/usr/bin/python3
"""The demo (tools/demo/run-demo.sh) in its reduced mode, checked by its table's invariants.

Runs `run-demo.sh --quick --json FILE --svg FILE --build BUILD` and checks what must hold
whatever the machine's speed (never its timings against numbers):
  * it exits 0 and prints the table, `thawctl slots`, a busctl read of a slot and the
    picture's path;
  * the JSON has the four runs (a)..(d), and all four token lists are equal (and not empty);
  * the weight phase of (d) zero-copy < (c) copy mode < (a) cold (medians of 3 engine runs).
    (c) < (a) holds because the demo scales the emulated links below this host's memcpy
    speed (run-demo.sh, LINK_PCIE_GBPS): cold pays the modelled PCIe upload, copy mode the
    modelled HBM copy. At the emulator's full H100 speeds both would be host memcpy time;
  * (d) ran zero-copy and (c) was served from a slot (the shim's own lines);
  * the SVG is well-formed XML with one lane per run;
  * thawd, dbus-daemon and nginx it started are gone afterwards.

usage: demo_test.py RUN_DEMO_SH BUILD_DIR
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def main():
    script, build = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="thaw-demo-test.") as tmp:
        json_path = os.path.join(tmp, "demo.json")
        svg_path = os.path.join(tmp, "demo.svg")
        p = subprocess.run([script, "--quick", "--repeat", "3", "--json", json_path,
                            "--svg", svg_path, "--build", build], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=280)
        sys.stdout.write(p.stdout)
        sys.stderr.write(p.stderr)
        check(p.returncode == 0, "run-demo.sh --quick exits 0 (got %d)" % p.returncode)
        if p.returncode != 0:
            return 1
        check("timeline picture: " + svg_path in p.stdout, "the picture's path is printed")
        check("$ thawctl slots" in p.stdout and "SLOT" in p.stdout, "thawctl slots is shown")
        check(".State" in p.stdout or "State" in p.stdout, "a busctl read of a slot is shown")

        with open(json_path) as f:
            report = json.load(f)
        runs = {r["id"]: r for r in report["runs"]}
        check(sorted(runs) == ["a", "b", "c", "d"], "the four runs (a)..(d): %s" % sorted(runs))
        if sorted(runs) != ["a", "b", "c", "d"]:
            return 1
        first = runs["a"]["tokens"]
        check(bool(first) and all(first), "(a) generated tokens: %s" % first)
        for rid in "bcd":
            check(runs[rid]["tokens"] == first and runs[rid]["tokens_equal_first"],
                  "(%s)'s tokens equal (a)'s" % rid)
        w = {rid: runs[rid]["weights_s"] for rid in runs}
        check(w["d"] < w["c"], "weight phase (d) %.4f s < (c) %.4f s" % (w["d"], w["c"]))
        check(w["c"] < w["a"], "weight phase (c) %.4f s < (a) %.4f s" % (w["c"], w["a"]))
        for r in runs.values():
            check(r["total_s"] > 0 and r["speedup"] is not None, "(%s) has a total" % r["id"])
        meta = report.get("meta", {})
        check("zero-copy on" in meta.get("zero_slot", ""),
              "(d) ran zero-copy: %s" % meta.get("zero_slot"))
        check(meta.get("copy_slot", "").startswith("slot g"),
              "(c) was served from a slot: %s" % meta.get("copy_slot"))

        try:
            root = ET.parse(svg_path).getroot()
            lanes = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")
                     if t.get("class") == "lane"]
            check(len(lanes) == 4, "the SVG has one lane per run (%d)" % len(lanes))
        except ET.ParseError as e:
            check(False, "the SVG parses: %s" % e)

    # Everything the demo started is gone (it logs each one's pid).
    pids = [int(x) for x in re.findall(r"(?:thawd|dbus-daemon|nginx) (\d+)", p.stderr)]
    check(len(pids) >= 3, "the demo logged the pids of thawd, dbus-daemon and nginx: %s" % pids)
    left = [pid for pid in pids if os.path.exists("/proc/%d" % pid)
            and open("/proc/%d/stat" % pid).read().split(")")[-1].split()[0] != "Z"]
    check(not left, "no process left behind: %s" % left)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
