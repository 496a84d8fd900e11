#!/usr/bin/python3
"""The demo (tools/demo/run-demo.sh) in its reduced mode, checked by its table's invariants.

Runs `run-demo.sh --quick --json FILE --svg FILE --build BUILD --registry http` and checks
what must hold whatever the machine's speed (never its timings against numbers):
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

Then it runs the demo again as the real-GPU kit does on a minimal Debian root (issue 21, "bare"):
from a kit made of the build's outputs (KIT/bin, lib, emu; KIT/share holds copies of
run-demo.sh, lib.sh and thawd.toml, nothing else of the repository), with a PATH that has no
python3, nginx, busctl, curl or dbus-daemon (the kit's bin/dbus-daemon is used) and
`--registry dir`. It checks the same invariants, that the table says the registry was a local
directory, and that the busctl read was skipped with a reason.

usage: demo_test.py RUN_DEMO_SH BUILD_DIR [--only build|bare]
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


# The kit's layout (tools/gpu-kit): its file -> the build tree's.
KIT_FROM_BUILD = {
    "bin/thawd": "daemon/cli/thawd",
    "bin/thawctl": "tools/thawctl/thawctl",
    "bin/thaw-fetch": "tools/thaw-fetch/thaw-fetch",
    "bin/thaw-genmodel": "tools/genmodel/thaw-genmodel",
    "bin/refengine": "tools/refengine/refengine",
    "bin/thaw-demo-report": "tools/demo-report/thaw-demo-report",
    "lib/libthaw-preload.so": "preload/libthaw-preload.so",
    "emu/libcuda.so.1": "emu/libcuda.so.1",
    "emu/librefengine_kernels_twins.so": "tools/refengine/librefengine_kernels_twins.so",
}
# What a minimal Debian root lacks, hidden from the demo's PATH.
NOT_ON_BARE_PATH = re.compile(r"^(python.*|perl.*|nginx|busctl|curl|wget|dbus-daemon)$")


def make_kit(tmp, script, build):
    """A kit of links to the build's outputs; share/ has copies (run from there)."""
    kit = os.path.join(tmp, "kit")
    for sub in ("bin", "lib", "emu", "share"):
        os.makedirs(os.path.join(kit, sub))
    for dst, src in KIT_FROM_BUILD.items():
        os.symlink(os.path.join(build, src), os.path.join(kit, dst))
    os.symlink(shutil.which("dbus-daemon") or "/usr/bin/dbus-daemon",
               os.path.join(kit, "bin", "dbus-daemon"))
    demo_dir = os.path.dirname(os.path.abspath(script))
    repo = os.path.dirname(os.path.dirname(demo_dir))
    for src in (os.path.join(demo_dir, "run-demo.sh"), os.path.join(demo_dir, "lib.sh"),
                os.path.join(repo, "packaging", "thawd.toml")):
        shutil.copy2(src, os.path.join(kit, "share"))
    return kit


def bare_path(tmp):
    """A PATH directory: links to every command of the usual ones except NOT_ON_BARE_PATH."""
    bin_dir = os.path.join(tmp, "path")
    os.makedirs(bin_dir)
    for d in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin", "/sbin"):
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            link = os.path.join(bin_dir, name)
            if not NOT_ON_BARE_PATH.match(name) and not os.path.lexists(link):
                os.symlink(os.path.join(d, name), link)
    return bin_dir


def run_demo(script, build, bare):
    """One run of the demo (bare: from a kit, as on a minimal root) and its checks."""
    print("---- %s" % ("bare: a kit, --registry dir, no python3/nginx/busctl/curl on PATH"
                       if bare else "the build tree, --registry http"))
    with tempfile.TemporaryDirectory(prefix="thaw-demo-test.") as tmp:
        json_path = os.path.join(tmp, "demo.json")
        svg_path = os.path.join(tmp, "demo.svg")
        args = ["--quick", "--repeat", "3", "--json", json_path, "--svg", svg_path]
        env = dict(os.environ)
        if bare:
            kit = make_kit(tmp, script, build)
            command = [os.path.join(kit, "share", "run-demo.sh")] + args + [
                "--registry", "dir", "--work", os.path.join(build, "demo-kit")]
            env["PATH"] = bare_path(tmp)
            env.pop("DBUS_DAEMON", None)
            env["NGINX"] = "/nonexistent/nginx"
            for f in ("run-demo.sh", "lib.sh"):
                code = [l for l in open(os.path.join(kit, "share", f))
                        if not l.lstrip().startswith("#")]
                check(not any("python" in l or "curl " in l for l in code),
                      "%s calls no python3 nor curl" % f)
        else:
            command = [script] + args + ["--build", build, "--registry", "http"]
        p = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=140, env=env)
        sys.stdout.write(p.stdout)
        sys.stderr.write(p.stderr)
        check(p.returncode == 0, "run-demo.sh %s exits 0 (got %d)" % (
            "from a kit, --registry dir, bare PATH," if bare else "--quick", p.returncode))
        if p.returncode != 0:
            return 1
        check("timeline picture: " + svg_path in p.stdout, "the picture's path is printed")
        check("$ thawctl slots" in p.stdout and "SLOT" in p.stdout, "thawctl slots is shown")
        if bare:
            check("no busctl" in p.stderr and "$ busctl" not in p.stdout,
                  "the busctl read is skipped, saying why")
            check("fetch: thawd from a local directory registry" in p.stdout,
                  "the footnote says the registry was a local directory")
        else:
            check(".State" in p.stdout, "a busctl read of a slot is shown")

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
        check(meta.get("registry") == ("dir" if bare else "http"),
              "meta.registry: %s" % meta.get("registry"))
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
    want = 2 if bare else 3
    check(len(pids) >= want, "the demo logged the pids of thawd, dbus-daemon%s: %s" % (
        "" if bare else " and nginx", pids))
    left = [pid for pid in pids if os.path.exists("/proc/%d" % pid)
            and open("/proc/%d/stat" % pid).read().split(")")[-1].split()[0] != "Z"]
    check(not left, "no process left behind: %s" % left)
    return 0


def main():
    script, build = sys.argv[1], os.path.abspath(sys.argv[2])
    only = sys.argv[4] if sys.argv[3:4] == ["--only"] and len(sys.argv) > 4 else None
    for mode in ("build", "bare"):
        if only in (None, mode):
            run_demo(script, build, mode == "bare")
    print("%d check(s) failed" % len(failures) if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
