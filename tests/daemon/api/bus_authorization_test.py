#!/usr/bin/env python3
"""Who may call what on org.thaw.Node1, on real buses, with the real thawd (issue 22).

Usage: bus_authorization_test.py SOURCE_DIR THAWD LIBCUDA GENMODEL THAW_FETCH CALL_AFTER_SETGROUPS

1. A system-style bus: a private dbus-daemon with the system bus's default policy (Debian's
   /usr/share/dbus-1/system.conf) and packaging/org.thaw.Node1.conf installed into the
   directory it includes, as the package installs it. thawd (root) owns the name there; as
   user nobody (setpriv, no groups) every read method and property is allowed and every
   mutating method is refused with AccessDenied; as root every mutating method gets through.
2. An open bus that lets everyone call everything: thawd refuses nobody's mutating calls
   itself, from the bus's record of the caller, and lets in a member of shim.allow_groups, by
   primary or by supplementary group. A caller that joins the allowed group after connecting
   (call_after_setgroups, with CAP_SETGID) is still refused: the bus recorded its groups at
   connect time, and /proc's newer ones (what SD_BUS_CREDS_AUGMENT would read) do not count.

The methods come from introspecting every object thawd exports, so a method that is in
neither MUTATING nor READ below fails the test until someone decides which it is (and
updates the policy file to match).

Needs root (to become nobody and back), setpriv, dbus-daemon, dbus-send and busctl; exits
77 (skipped) without them.
"""

import grp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

SKIP = 77
NAME = "org.thaw.Node1"
MANAGER_PATH = "/org/thaw/Node1"
MANAGER = "org.thaw.Node1.Manager"
PROPS = "org.freedesktop.DBus.Properties"

# Methods that change what thawd holds: root and shim.allow_groups only.
MUTATING = {
    f"{MANAGER}.Fetch",
    f"{MANAGER}.Prewarm",
    f"{MANAGER}.PrewarmLayers",
    f"{MANAGER}.Activate",
    f"{MANAGER}.Deactivate",
    f"{MANAGER}.Evict",
    f"{PROPS}.Set",  # every property is read-only; the bus still must not pass it to thawd
}
# Methods anyone the bus lets in may call.
READ = {
    f"{MANAGER}.ListGpus",
    f"{MANAGER}.ListSlots",
    f"{MANAGER}.ListModels",
    f"{MANAGER}.ListArtifacts",
    f"{MANAGER}.GetNetwork",
    f"{PROPS}.Get",
    f"{PROPS}.GetAll",
    "org.freedesktop.DBus.Introspectable.Introspect",
    "org.freedesktop.DBus.Peer.Ping",
    "org.freedesktop.DBus.Peer.GetMachineId",
    "org.freedesktop.DBus.ObjectManager.GetManagedObjects",
}
NOBODY = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
ACCESS_DENIED = "org.freedesktop.DBus.Error.AccessDenied"

# The system bus's default context, as Debian's dbus 1.14 ships it in system.conf.
SYSTEM_DEFAULT_POLICY = """
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Properties"/>
    <deny send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"
          send_member="UpdateActivationEnvironment"/>
    <deny send_destination="org.freedesktop.DBus"
          send_interface="org.freedesktop.DBus.Debug.Stats"/>
    <deny send_destination="org.freedesktop.DBus"
          send_interface="org.freedesktop.systemd1.Activator"/>
  </policy>
  <policy user="root">
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.systemd1.Activator"/>
  </policy>
"""
OPEN_POLICY = """
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
"""

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print(f"FAIL: {what}", flush=True)
    return ok


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


def run(argv, timeout=30):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout


# dbus-send's typed arguments for a D-Bus signature of basic types, with harmless values: a
# refused call must be refused before its arguments matter, and thawd reads them first.
DBUS_SEND_TYPES = {"s": "string:none", "o": "objpath:/", "i": "int32:0", "u": "uint32:0",
                   "t": "uint64:0", "x": "int64:0", "b": "boolean:false", "d": "double:0",
                   "y": "byte:0", "n": "int16:0", "q": "uint16:0", "v": "variant:string:none"}


def placeholder_args(signature, method):
    args = []
    for code in signature:
        if code not in DBUS_SEND_TYPES:
            raise SystemExit(f"{method} takes '{signature}': give bus_authorization_test.py "
                             f"a placeholder for '{code}'")
        args.append(DBUS_SEND_TYPES[code])
    return args


class Node:
    """A dbus-daemon and a thawd on it, in `work`."""

    def __init__(self, work, args, policy, allow_groups, tag):
        self.work, self.args, self.tag = work, args, tag
        self.address = f"unix:path={work}/{tag}_bus_socket"
        system_d = os.path.join(work, f"{tag}.system.d")
        os.makedirs(system_d)
        # Installed the way packaging/CMakeLists.txt installs it: the file, mode 0644, into the
        # directory the bus configuration includes.
        shutil.copyfile(os.path.join(args.source, "packaging/org.thaw.Node1.conf"),
                        os.path.join(system_d, "org.thaw.Node1.conf"))
        os.chmod(os.path.join(system_d, "org.thaw.Node1.conf"), 0o644)
        conf = os.path.join(work, f"{tag}.bus.conf")
        with open(conf, "w") as f:
            f.write('<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration '
                    '1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">\n'
                    f"<busconfig>\n  <type>system</type>\n  <listen>{self.address}</listen>\n"
                    f"  <auth>EXTERNAL</auth>\n{policy}  <includedir>{system_d}</includedir>\n"
                    "</busconfig>\n")
        self.bus_log = open(os.path.join(work, f"{tag}.bus.log"), "w")
        self.bus = subprocess.Popen(["dbus-daemon", "--nofork", "--nopidfile",
                                     f"--config-file={conf}"],
                                    stdout=self.bus_log, stderr=subprocess.STDOUT)
        socket = f"{work}/{tag}_bus_socket"
        for _ in range(500):
            if os.path.exists(socket) or self.bus.poll() is not None:
                break
            time.sleep(0.01)
        if not os.path.exists(socket):
            raise SystemExit(f"dbus-daemon did not start: {self.read(self.bus_log.name)}")
        groups = ", ".join(f'"{g}"' for g in allow_groups)
        toml = os.path.join(work, f"{tag}.thawd.toml")
        with open(toml, "w") as f:
            f.write(f'[node]\nstate_dir = "{work}/state"\n'
                    f'[store]\ncache_dir = "{work}/cache"\ncache_budget = "64MiB"\n'
                    f'registry = "file://{work}/models"\n'
                    f'[gpu]\npool_share = 0.5\n'
                    f'[shim]\nsocket = "{work}/thawd.sock"\nallow_groups = [{groups}]\n'
                    f'[dbus]\nbus = "{self.address}"\n')
        env = dict(os.environ, THAW_LIBCUDA=args.libcuda, THAW_EMU_DEVICE_MEMORY="256M",
                   THAW_EMU_STATE_DIR=f"{work}/emu")
        env.pop("NOTIFY_SOCKET", None)
        self.thawd_log_path = os.path.join(work, f"{tag}.thawd.log")
        self.thawd_log = open(self.thawd_log_path, "w")
        self.thawd = subprocess.Popen([args.thawd, "--config", toml], env=env,
                                      stdout=self.thawd_log, stderr=subprocess.STDOUT)
        if not self.wait(lambda: self.prop(MANAGER_PATH, MANAGER, "State") == 's "running"',
                         30):
            raise SystemExit(f"thawd did not come up on the {tag} bus:\n" +
                             self.read(self.thawd_log_path))

    @staticmethod
    def read(path):
        with open(path) as f:
            return f.read()

    def wait(self, predicate, seconds=30):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.thawd.poll() is not None:
                return False
            if predicate():
                return True
            time.sleep(0.05)
        return predicate()

    def busctl(self, args, as_user=()):
        return run([*as_user, "/usr/bin/busctl", f"--address={self.address}", *args])

    def prop(self, path, interface, name):
        rc, out = self.busctl(["get-property", NAME, path, interface, name])
        return out.strip() if rc == 0 else None

    def call(self, path, method, args, as_user=()):
        """dbus-send: it prints the D-Bus error's name, which tells the bus's refusal
        ("Rejected send message") from thawd's."""
        return run([*as_user, "/usr/bin/dbus-send", f"--bus={self.address}", "--print-reply",
                    f"--dest={NAME}", path, method, *args])

    def objects(self):
        """{path: {interface: {"methods": {member: in_signature}, "properties": [names]}}}"""
        rc, out = self.busctl(["tree", "--list", NAME])
        check(rc == 0, f"busctl tree: {out}")
        found = {}
        for path in out.split():
            rc, xml = self.busctl(["introspect", "--xml-interface", NAME, path])
            check(rc == 0, f"introspect {path}: {xml}")
            interfaces = {}
            for iface in ET.fromstring(xml).findall("interface"):
                methods = {}
                for m in iface.findall("method"):
                    methods[m.get("name")] = "".join(
                        a.get("type") for a in m.findall("arg") if a.get("direction", "in") == "in")
                props = [p.get("name") for p in iface.findall("property")]
                interfaces[iface.get("name")] = {"methods": methods, "properties": props}
            found[path] = interfaces
        return found

    def stop(self):
        for p in (self.thawd, self.bus):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def every_method(objects):
    for path, interfaces in objects.items():
        for iface, body in interfaces.items():
            for member, signature in body["methods"].items():
                yield path, f"{iface}.{member}", signature


def classified(objects):
    """Fails on methods in neither list, and on listed methods thawd no longer has."""
    seen = set()
    for path, method, _ in every_method(objects):
        seen.add(method)
        check(method in MUTATING or method in READ,
              f"{method} (on {path}) is neither in MUTATING nor in READ: decide who may call "
              "it, list it in tests/daemon/api/bus_authorization_test.py and allow or leave "
              "it out in packaging/org.thaw.Node1.conf")
    for method in sorted((MUTATING | READ) - seen):
        check(False, f"{method} is listed but thawd exports it nowhere: remove it from the list")


def reads_allowed(node, objects, as_user, who):
    """Every read method on every object, and every property by Get and GetAll."""
    for path, method, signature in every_method(objects):
        if method not in READ or method in (f"{PROPS}.Get", f"{PROPS}.GetAll"):
            continue
        rc, out = node.call(path, method, placeholder_args(signature, method), as_user)
        check(rc == 0, f"{who}: {method} on {path} refused: {out}")
    for path, interfaces in objects.items():
        for iface, body in interfaces.items():
            if not body["properties"]:
                continue
            rc, out = node.call(path, f"{PROPS}.GetAll", [f"string:{iface}"], as_user)
            check(rc == 0, f"{who}: GetAll {iface} on {path} refused: {out}")
            for prop in body["properties"]:
                rc, out = node.call(path, f"{PROPS}.Get", [f"string:{iface}", f"string:{prop}"],
                                    as_user)
                check(rc == 0, f"{who}: Get {iface}.{prop} on {path} refused: {out}")


def mutating_denied(node, objects, as_user, who, by, only_thaw=False):
    """Every mutating method on every object that has it is refused with AccessDenied; `by`
    is a text the refusal must contain (the bus's or thawd's wording)."""
    count = 0
    for path, method, signature in every_method(objects):
        if method not in MUTATING or (only_thaw and not method.startswith("org.thaw.")):
            continue
        rc, out = node.call(path, method, placeholder_args(signature, method), as_user)
        count += 1
        check(rc != 0 and ACCESS_DENIED in out and by in out,
              f"{who}: {method} on {path} was not refused with AccessDenied ({by}): {out}")
    return count


def system_bus_phase(work, args):
    node = Node(work, args, SYSTEM_DEFAULT_POLICY, ["thaw"], "system")
    try:
        # Root owns the name (thawd runs); nobody may not take it.
        rc, out = run([*NOBODY, "/usr/bin/dbus-send", f"--bus={node.address}", "--print-reply",
                       "--dest=org.freedesktop.DBus", "/org/freedesktop/DBus",
                       "org.freedesktop.DBus.RequestName", f"string:{NAME}", "uint32:4"])
        check(rc != 0 and ACCESS_DENIED in out, f"nobody may own {NAME}: {out}")

        # Root calls every mutating method; the first ones give each kind of object one
        # instance, so that nobody's reads below cover every interface.
        root_allowed = set()

        def as_root(method, args, expect_ok=True):
            rc, out = node.call(MANAGER_PATH, f"{MANAGER}.{method}", args)
            if check(rc == 0 if expect_ok else ACCESS_DENIED not in out,
                     f"root: {method} {args}: {out}"):
                root_allowed.add(f"{MANAGER}.{method}")
            return out

        as_root("Fetch", ["string:tiny"])
        check(node.wait(lambda: node.prop(f"{MANAGER_PATH}/model/tiny", "org.thaw.Node1.Model",
                                          "State") == 's "complete"'),
              "the model was not fetched: " + node.read(node.thawd_log_path))
        as_root("Prewarm", ["string:tiny", "int32:0"])
        as_root("PrewarmLayers", ["string:tiny", "int32:0", "int32:1"])
        for slot in ("g0s0", "g0s1"):
            check(node.wait(lambda: node.prop(f"{MANAGER_PATH}/slot/{slot}", "org.thaw.Node1.Slot",
                                              "State") == 's "prewarmed"'),
                  f"slot {slot} was not prewarmed: " + node.read(node.thawd_log_path))

        objects = node.objects()
        interfaces = {i for o in objects.values() for i in o}
        for kind in ("Manager", "Gpu", "Slot", "Model"):
            check(f"org.thaw.Node1.{kind}" in interfaces, f"no {kind} object to test: {objects}")
        classified(objects)
        reads_allowed(node, objects, NOBODY, "nobody on the system bus")
        denied = mutating_denied(node, objects, NOBODY, "nobody on the system bus",
                                 "Rejected send message")
        check(denied >= len(MUTATING), f"only {denied} mutating calls were tried")
        reads_allowed(node, objects, (), "root on the system bus")

        as_root("Activate", ["string:g0s0", "uint64:0"])
        as_root("Deactivate", ["string:g0s0"])
        as_root("Evict", ["string:g0s1"])
        # Set gets through to thawd for root, which answers that nothing is writable.
        rc, out = node.call(MANAGER_PATH, f"{PROPS}.Set",
                            [f"string:{MANAGER}", "string:State", "variant:string:x"])
        if check(rc != 0 and "PropertyReadOnly" in out, f"root: Properties.Set: {out}"):
            root_allowed.add(f"{PROPS}.Set")
        for method in sorted(MUTATING - root_allowed):
            check(False, f"root: {method} was not shown to be allowed")
        print(f"system bus: nobody tried {denied} mutating calls and every read; root got "
              f"through {len(root_allowed)} of {len(MUTATING)} mutating methods", flush=True)
    finally:
        node.stop()


def open_bus_phase(work, args, group):
    node = Node(work, args, OPEN_POLICY, [group.gr_name], "open")
    try:
        objects = node.objects()
        classified(objects)
        reads_allowed(node, objects, NOBODY, "nobody on the open bus")
        denied = mutating_denied(node, objects, NOBODY, "nobody on the open bus",
                                 f"needs root or group {group.gr_name} (caller uid 65534)",
                                 only_thaw=True)
        check(denied >= 6, f"only {denied} of thawd's mutating calls were tried")
        # A member of the allowed group, by the bus's UnixGroupIDs: supplementary, then primary.
        for how in ([f"--groups={group.gr_gid}", "--regid=65534"],
                    ["--clear-groups", f"--regid={group.gr_gid}"]):
            user = ["/usr/bin/setpriv", "--reuid=65534", *how]
            rc, out = node.call(MANAGER_PATH, f"{MANAGER}.Fetch", ["string:tiny"], user)
            check(rc == 0, f"group {group.gr_name} member ({' '.join(how)}): Fetch: {out}")
        # Groups gained after connecting do not count (setgroups needs CAP_SETGID: ambient here).
        rc, out = run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                       "--inh-caps=+setgid", "--ambient-caps=+setgid", args.call_after_setgroups,
                       node.address, str(group.gr_gid), "tiny"])
        check(rc == 1 and ACCESS_DENIED in out and "caller uid 65534" in out,
              f"a caller that joined group {group.gr_name} after connecting: {out}")
        print(f"open bus: nobody tried {denied} of thawd's mutating calls; group "
              f"{group.gr_name} tried Fetch twice and after joining late once", flush=True)
    finally:
        node.stop()


def allowed_group():
    """A group that exists here and is neither root's nor nobody's, to put in allow_groups."""
    for g in sorted(grp.getgrall(), key=lambda g: (g.gr_name != "users", g.gr_gid)):
        if g.gr_gid not in (0, 65534):
            return g
    return None


def main():
    if len(sys.argv) != 7:
        raise SystemExit(__doc__)
    names = ("source", "thawd", "libcuda", "genmodel", "thaw_fetch", "call_after_setgroups")
    args = type("Args", (), dict(zip(names, sys.argv[1:])))
    if os.geteuid() != 0:
        skip("needs root: it runs thawd, which owns org.thaw.Node1 only as root under the "
             "shipped policy, and becomes user nobody with setpriv (sudo ctest -R daemon_api)")
    for tool in ("setpriv", "dbus-daemon", "dbus-send", "busctl"):
        if shutil.which(tool) is None or not os.path.exists(f"/usr/bin/{tool}"):
            skip(f"{tool} is missing (apt install util-linux dbus systemd)")
    rc, out = run([*NOBODY, "/bin/true"])
    if rc != 0:
        skip(f"setpriv cannot become nobody here: {out.strip()}")
    group = allowed_group()
    if group is None:
        skip("no group other than root's and nobody's exists to test shim.allow_groups with")

    work = tempfile.mkdtemp(prefix="thaw-busauth.")
    os.chmod(work, 0o755)  # nobody's clients reach the bus sockets in it
    try:
        models = os.path.join(work, "models", "tiny")
        rc, out = run([args.genmodel, "--size", "tiny", "--out", models, "--quiet"])
        if rc != 0:
            raise SystemExit(f"thaw-genmodel: {out}")
        rc, out = run([args.thaw_fetch, "publish", "--quiet", models])
        if rc != 0:
            raise SystemExit(f"thaw-fetch publish: {out}")
        system_bus_phase(work, args)
        open_bus_phase(work, args, group)
    finally:
        if failures:
            for log in sorted(os.listdir(work)):
                if log.endswith(".log"):
                    print(f"--- {log}\n{Node.read(os.path.join(work, log))}")
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
