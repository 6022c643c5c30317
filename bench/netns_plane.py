"""The kernel data plane of `--netns` (docs/netns.md, "The kernel data plane"), issue 29's figures.

    python bench/netns_plane.py [--mbytes 200] [--rounds 5] [--repeats 20] [--startup-hosts 64]
                                [--startup-rounds 3] [--opus-trials 3] [--no-opus]

Needs root (network namespaces) and pyroute2; without them it says why and measures nothing.

(1) Throughput over one circuit: a twin of playbooks/inventory/emulated-rack.yaml with --netns, circuits
    gpu01:p0 -> gpu02:p1 and back on ocs1 (over SCPI), the routes of that duplex link installed once
    (`dataplane.routes`, one directed link each way, each with the next hop's permanent neighbour entry: no ARP).
    One TCP connection of MBYTES MB from a process in gpu01's namespace to one in gpu02's, at the hosts' data
    addresses, timed inside the client from its first byte to the server's count of what it received. Baseline, in
    alternating rounds: the same two programs in two namespaces made here joined by one bare veth pair. The twin's
    path has one veth pair more and a tc redirect: p0 ==veth== f_a -(u32 + mirred)-> f_b ==veth== p1.
(2) Circuit applied -> traffic flowing (the plane's own delay): gpu01 sends a small UDP datagram every 0.5 ms to an
    echo in gpu02's namespace while no circuit exists; at t0 ocs1 gets the ADD of both directions and `*OPC?` on one
    line (switching time SWITCHING_MS, no jitter). Recorded: when `*OPC?` answered, when the first datagram that came
    back was sent and when its echo arrived; from the kernel's events (`dataplane.state` kernel.events), seen (the
    twin's tick noticed the light) -> applied (the tc filter in) and `*OPC?` -> seen. The circuits are removed and
    the kernel waited dark between repeats.
(3) Start-up: a twin of opus_scale.inventory_data(STARTUP_HOSTS) (8 ports a host, 8 rails) started by TwinProcess
    until its endpoints are announced, with --netns and on loopback in alternating rounds; the stop timed too.
(4) Opus with --netns: `testbed run playbooks/gpu-health.yaml --inventory playbooks/inventory/opus-2048.yaml
    --emulate --netns --trials 1`, then playbooks/opus-failover.yaml with --trials T, cold, as a user types them:
    wall time to exit, exit status, the run's status (summary.json), the process tree's memory every 0.5 s
    (benchlib.TreeMemory, split as bench/opus_runs.py; the processes in the hosts' namespaces descend from the twin)
    and the drop of /proc/meminfo MemAvailable during the run (TreeMemory keeps it too).
    A run that leaves namespaces behind is healed (`testbed heal RUN`) and says so.

Everything made here is gone when it returns: each twin's tag is checked with testbed.twin.netns.leftovers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from benchlib import REPO, TreeMemory, command_line, compile_project, pct, process_tree, stats, write_out  # noqa: E402
from rich.console import Console  # noqa: E402

RACK = REPO / "playbooks/inventory/emulated-rack.yaml"
OPUS = REPO / "playbooks/inventory/opus-2048.yaml"
HEALTH = REPO / "playbooks/gpu-health.yaml"
FAILOVER = REPO / "playbooks/opus-failover.yaml"
# ocs1's cabling in the emulated rack (tests/netns/test_kernel_plane.py): host port -> (ingress, egress)
CABLE = {("gpu01", "p0"): (1, 33), ("gpu02", "p1"): (4, 36)}
A, B = ("gpu01", "p0"), ("gpu02", "p1")
# both directions: gpu01:p0's light into gpu02:p1's receiver, and back
CIRCUITS = f"(@{CABLE[A][0]},{CABLE[B][0]}),(@{CABLE[B][1]},{CABLE[A][1]})"
TCP_PORT = 47021
UDP_PORT = 47022
SWITCHING_MS = 25.0
SEND_EVERY_S = 0.0005
RUN_TIMEOUT_S = 1200
SAMPLE_EVERY_S = 0.5
VETH_NET = ("192.0.2.1", "192.0.2.2")  # inside the baseline's own two namespaces only

# A TCP sink: counts each connection's bytes until EOF, answers the count.
SINK = """
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
buf = bytearray(1 << 20)
while True:
    c, _ = s.accept()
    with c:
        n = 0
        while k := c.recv_into(buf):
            n += k
        c.sendall(str(n).encode())
"""
# One connection of N MB; prints the bytes sent, the sink's count and seconds from the first byte to the count.
SOURCE = """
import socket, sys, time
chunk = bytes(10**6)
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
start = time.perf_counter()
for _ in range(int(sys.argv[3])):
    c.sendall(chunk)
c.shutdown(socket.SHUT_WR)
got = c.recv(64)
print(int(sys.argv[3]) * len(chunk), got.decode(), time.perf_counter() - start, flush=True)
"""
ECHO = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    d, a = s.recvfrom(2048)
    s.sendto(d, a)
"""
# Sends a datagram (CLOCK_MONOTONIC at send) every EVERY s; after "arm" on stdin, prints the first echo of a
# datagram sent after the arm: "echo SENT RECEIVED" (monotonic seconds, the benchmark's clock too). The next arm
# comes only after that line is read, so the two threads never race for `armed`.
PINGER = """
import os, socket, struct, sys, threading, time
dst, every = (sys.argv[1], int(sys.argv[2])), float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[4], 0))
armed = [None]

def commands():
    for line in sys.stdin:
        if line.startswith("arm"):
            armed[0] = time.monotonic()
            print("armed", flush=True)
    os._exit(0)

def send():
    due = time.monotonic()
    while True:
        try:
            s.sendto(struct.pack("!d", time.monotonic()), dst)
        except OSError:
            pass
        due = max(due + every, time.monotonic())
        time.sleep(max(0.0, due - time.monotonic()))

threading.Thread(target=commands, daemon=True).start()
threading.Thread(target=send, daemon=True).start()
print("ready", flush=True)
while True:
    data, _ = s.recvfrom(64)
    now = time.monotonic()
    (sent,) = struct.unpack("!d", data)
    if armed[0] is not None and sent >= armed[0]:
        armed[0] = None
        print(f"echo {sent:.6f} {now:.6f}", flush=True)
"""


def skip_reason() -> str | None:
    """Why this machine cannot measure the kernel plane, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, as CI does)"
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        return "pyroute2 is not installed (pip install 'testbed[netns]')"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    return None


# --- processes in a namespace ---------------------------------------------------------------------------


def in_ns(namespace: str, script: str, *args: str, **popen) -> subprocess.Popen:
    command = ["ip", "netns", "exec", namespace, sys.executable, "-c", script, *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, **popen)


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The process's next line of output, within `timeout` seconds."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise TimeoutError(f"no output within {timeout} s from {proc.args[3]} ({' '.join(proc.args[-3:])})")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"a process in {proc.args[3]} ended (exit status {proc.wait()})")
    return line.strip()


def started(proc: subprocess.Popen) -> subprocess.Popen:
    if read_line(proc, 30) != "ready":
        raise RuntimeError(f"a process in {proc.args[3]} did not start")
    return proc


def end(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def one_transfer(namespace: str, address: str, mbytes: int) -> float:
    """MB/s of one TCP connection of `mbytes` MB from a process in `namespace` to the sink at `address`."""
    proc = in_ns(namespace, SOURCE, address, str(TCP_PORT), str(mbytes))
    try:
        sent, got, seconds = read_line(proc, 300).split()
    finally:
        end([proc])
    if int(sent) != mbytes * 10**6 or int(got) != int(sent):
        raise RuntimeError(f"sent {sent} bytes, the sink counted {got}")
    return mbytes / float(seconds)


# --- the twin of the emulated rack, with --netns ---------------------------------------------------------


class Rack:
    """A --netns twin of the emulated rack, ocs1 over SCPI on one connection, and what runs in its namespaces."""

    def __init__(self, made: list[str]) -> None:
        from emulators.twin import TwinProcess
        from testbed.documents import load_inventory
        from testbed.twin.bridge import twin_spec

        spec = twin_spec(load_inventory(str(RACK)).model, seed=0)
        self.tag = secrets.token_hex(3)
        spec.netns = {"tag": self.tag}
        made.append(self.tag)
        self.twin = TwinProcess(spec, start_timeout=60)
        self.twin.start()
        net = self.twin.endpoints.netns
        self.ns = {h: net["hosts"][h]["netns"] for h in ("gpu01", "gpu02")}
        self.data = {h: net["data"][h] for h in ("gpu01", "gpu02")}
        # the duplex link as two directed ones: each host's /32 to the other, its next hop's MAC set (no ARP)
        self.twin.control.call(None, "dataplane.routes", links=[[*A, *B], [*B, *A]])
        host, port = self.twin.endpoints.devices["ocs1"]["tcp"].rsplit(":", 1)
        self.scpi_sock = socket.create_connection((host, int(port)), timeout=10)
        self.scpi_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b""
        self.procs: list[subprocess.Popen] = []

    def scpi(self, line: str) -> tuple[float, float]:
        """Send `line;*OPC?`; (monotonic time sent, monotonic time the answer arrived)."""
        sent = time.monotonic()
        self.scpi_sock.sendall(f"{line};*OPC?\n".encode())
        while b"\n" not in self._buf:
            chunk = self.scpi_sock.recv(4096)
            if not chunk:
                raise RuntimeError("ocs1 closed the connection")
            self._buf += chunk
        answered = time.monotonic()
        reply, _, self._buf = self._buf.partition(b"\n")
        if reply.strip() != b"1":
            raise RuntimeError(f"ocs1 answered {reply!r} to {line}")
        return sent, answered

    def kernel(self) -> dict:
        return self.twin.control.call(None, "dataplane.state")["kernel"]

    def light(self, on: bool) -> None:
        """ADD (on) or SUB the circuits; return when the kernel forwards both directions, or neither."""
        self.scpi(f":OXC:SWIT:CONN:{'ADD' if on else 'SUB'} {CIRCUITS}")
        want = {"gpu01:p0": "gpu02:p1" if on else None, "gpu02:p1": "gpu01:p0" if on else None}
        deadline = time.monotonic() + 10
        while True:
            seen = {d["from"]: d["to"] for d in self.kernel()["directions"]}
            if all(seen.get(k) == v for k, v in want.items()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the kernel data plane still forwards {seen}, not {want}")
            time.sleep(0.005)  # polling the twin's state for a condition

    def close(self) -> None:
        end(self.procs)
        with contextlib.suppress(OSError):
            self.scpi_sock.close()
        self.twin.stop()


# --- the baseline: a bare veth pair between two fresh namespaces ----------------------------------------


def veth_pair(made_ns: list[str]) -> tuple[str, str]:
    """Two fresh namespaces joined by one bare veth pair, VETH_NET's addresses at its ends: the baseline."""
    from pyroute2 import IPRoute, NetNS, netns

    tag = secrets.token_hex(3)
    names = (f"nsbench-{tag}-a", f"nsbench-{tag}-b")
    for name in names:
        netns.create(name)
        made_ns.append(name)
    with IPRoute() as ipr:
        ipr.link("add", ifname=f"nb{tag}a", kind="veth", peer={"ifname": f"nb{tag}b", "net_ns_fd": names[1]})
        ipr.link("set", index=ipr.link_lookup(ifname=f"nb{tag}a")[0], net_ns_fd=names[0])
    for name, ifname, address in zip(names, (f"nb{tag}a", f"nb{tag}b"), VETH_NET, strict=True):
        with NetNS(name) as inner:
            index = inner.link_lookup(ifname=ifname)[0]
            inner.addr("add", index=index, address=address, prefixlen=24)
            inner.link("set", index=index, state="up")
            inner.link("set", index=inner.link_lookup(ifname="lo")[0], state="up")
    return names


# --- (1) and (2) ------------------------------------------------------------------------------------------


def throughput(rack: Rack, made_ns: list[str], mbytes: int, rounds: int, console: Console) -> dict:
    rack.light(True)
    veth = veth_pair(made_ns)
    sinks = []
    try:
        sinks.append(started(in_ns(rack.ns["gpu02"], SINK, rack.data["gpu02"], str(TCP_PORT))))
        sinks.append(started(in_ns(veth[1], SINK, VETH_NET[1], str(TCP_PORT))))
        ways = {"circuit": (rack.ns["gpu01"], rack.data["gpu02"]), "veth": (veth[0], VETH_NET[1])}
        for way in ways.values():  # a first connection each way, not counted: the veth's ARP, the first accept
            one_transfer(*way, mbytes)
        before = {d["from"]: d["bytes"] for d in rack.kernel()["directions"]}
        got: dict[str, list[float]] = {"circuit": [], "veth": []}
        for r in range(rounds):
            for name in ("circuit", "veth") if r % 2 == 0 else ("veth", "circuit"):
                got[name].append(one_transfer(*ways[name], mbytes))
            console.print(
                f"throughput round {r + 1}/{rounds}: circuit {got['circuit'][-1]:.0f} MB/s, "
                f"veth {got['veth'][-1]:.0f} MB/s",
                highlight=False,
            )
        after = {d["from"]: d["bytes"] for d in rack.kernel()["directions"]}
    finally:
        end(sinks)
        for name in veth:
            subprocess.run(["ip", "netns", "del", name], check=False)
        rack.light(False)
    crossed = after["gpu01:p0"] - before["gpu01:p0"]
    if crossed < rounds * mbytes * 10**6:
        raise RuntimeError(f"only {crossed} bytes crossed gpu01:p0's fibre for {rounds * mbytes} MB sent")
    circuit, bare = float(np.median(got["circuit"])), float(np.median(got["veth"]))
    return {
        "mbytes_per_connection": mbytes,
        "circuit_mb_s": stats(got["circuit"]),
        "veth_mb_s": stats(got["veth"]),
        "circuit_mb_s_p50": circuit,
        "veth_mb_s_p50": bare,
        "ratio_circuit_vs_veth": circuit / bare,
        "bytes_on_gpu01_p0": crossed,
    }


def to_flow(rack: Rack, repeats: int, console: Console) -> dict:
    rack.twin.control.call("ocs1", "set_switching_time", ms=SWITCHING_MS, jitter_ms=0.0)
    rack.light(False)
    echo = started(in_ns(rack.ns["gpu02"], ECHO, rack.data["gpu02"], str(UDP_PORT)))
    rack.procs.append(echo)
    args = (rack.data["gpu02"], str(UDP_PORT), str(SEND_EVERY_S), rack.data["gpu01"])
    pinger = in_ns(rack.ns["gpu01"], PINGER, *args, stdin=subprocess.PIPE)
    rack.procs.append(pinger)
    started(pinger)
    rows: list[dict] = []
    for i in range(repeats):
        time.sleep(0.05)  # echoes in flight from before are back or gone
        pinger.stdin.write("arm\n")
        pinger.stdin.flush()
        if read_line(pinger, 10) != "armed":
            raise RuntimeError("the sender did not arm")
        t0, opc = rack.scpi(f":OXC:SWIT:CONN:ADD {CIRCUITS}")
        _, sent, back = read_line(pinger, 10).split()
        sent, back = float(sent), float(back)
        events = [
            e
            for e in rack.kernel()["events"]
            if e.get("from") in ("gpu01:p0", "gpu02:p1") and e.get("to") and e.get("t", 0) >= t0 - 0.001
        ]
        if len(events) < 2:
            raise RuntimeError(f"the kernel's events show {len(events)} of the circuit's 2 directions applied")
        seen, applied = max(e["t"] for e in events), max(e["applied"] for e in events)
        rows.append(
            {
                "opc_ms": 1000 * (opc - t0),
                "flow_ms": 1000 * (back - t0),
                "after_opc_ms": 1000 * (back - opc),
                "first_sent_ms": 1000 * (sent - t0),
                "kernel_applied_ms": 1000 * (applied - t0),
                "opc_to_seen_ms": 1000 * (seen - opc),
                "seen_to_applied_ms": [1000 * (e["applied"] - e["t"]) for e in events],
            }
        )
        rack.light(False)
        if (i + 1) % 5 == 0 or i + 1 == repeats:
            flow = np.median([r["flow_ms"] for r in rows])
            console.print(f"to flow {i + 1}/{repeats}: p50 {flow:.1f} ms", highlight=False)
    end([pinger, echo])
    out = {"switching_ms": SWITCHING_MS, "send_every_ms": SEND_EVERY_S * 1000, "tick_ms": rack.kernel()["tick_ms"]}
    for key in rows[0]:
        x = [v for r in rows for v in (r[key] if isinstance(r[key], list) else [r[key]])]
        out[key] = {**stats(x), "p90": pct(x, 90)}
    return {**out, "samples": rows}


# --- (3) start-up --------------------------------------------------------------------------------------------


def startup(hosts: int, rounds: int, made: list[str], console: Console) -> dict:
    import opus_scale

    from emulators.twin import TwinProcess
    from testbed.documents import load_inventory
    from testbed.twin.bridge import twin_spec

    with tempfile.TemporaryDirectory(prefix="bench-netns-") as tmp:
        inv = load_inventory(str(opus_scale.write_yaml(Path(tmp) / "inv.yaml", opus_scale.inventory_data(hosts))))
        inv = inv.model
    got: dict[str, dict[str, list[float]]] = {m: {"ready_s": [], "stop_s": []} for m in ("netns", "loopback")}
    for r in range(rounds):
        for mode in ("netns", "loopback") if r % 2 == 0 else ("loopback", "netns"):
            spec = twin_spec(inv, 0)
            if mode == "netns":
                tag = secrets.token_hex(3)
                spec.netns = {"tag": tag}
                made.append(tag)
            twin = TwinProcess(spec, start_timeout=600, stop_timeout=120)
            start = time.perf_counter()
            try:
                twin.start()
                got[mode]["ready_s"].append(time.perf_counter() - start)
            finally:
                start = time.perf_counter()
                twin.stop()
                got[mode]["stop_s"].append(time.perf_counter() - start)
        console.print(
            f"start-up round {r + 1}/{rounds} ({hosts} hosts): netns {got['netns']['ready_s'][-1]:.2f} s, "
            f"loopback {got['loopback']['ready_s'][-1]:.2f} s",
            highlight=False,
        )
    netns_p50, loop_p50 = (float(np.median(got[m]["ready_s"])) for m in ("netns", "loopback"))
    return {
        "hosts": hosts,
        "devices": len(inv.devices),
        "host_ports": len(inv.fibres),
        "netns_ready_s": stats(got["netns"]["ready_s"]),
        "loopback_ready_s": stats(got["loopback"]["ready_s"]),
        "netns_stop_s": stats(got["netns"]["stop_s"]),
        "loopback_stop_s": stats(got["loopback"]["stop_s"]),
        "ratio_netns_vs_loopback": netns_p50 / loop_p50,
    }


# --- (4) Opus through the CLI with --netns -----------------------------------------------------------------


def cli_run(playbook: Path, results: Path, trials: int, timeout_s: float) -> dict:
    """`testbed run PLAYBOOK --inventory opus-2048.yaml --emulate --netns --trials T`, cold, as a user types it."""
    import opus_runs

    from testbed.twin import netns

    results.mkdir(parents=True)
    command = [opus_runs.testbed_binary(), "run", str(playbook), "--inventory", str(OPUS), "--emulate", "--netns"]
    command += ["--trials", str(trials), "--results", str(results)]
    out_path = results / "stdout.txt"
    with open(out_path, "w") as out:
        start = time.monotonic()
        proc = subprocess.Popen(
            command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "160"}
        )
        with TreeMemory(proc.pid, opus_runs.classify, inherit=("twin",), every_s=SAMPLE_EVERY_S) as memory:
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                for pid in reversed(list(process_tree(proc.pid))):  # the command's processes, its twin and Ray
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, 9)
                proc.wait()
                code = None
        wall = time.monotonic() - start
    runs = [d for d in results.iterdir() if d.is_dir()]
    run_dir = runs[0] if len(runs) == 1 else None
    summary, tag, healed = {}, None, None
    with contextlib.suppress(OSError, TypeError, ValueError, KeyError):
        summary = json.loads((run_dir / "summary.json").read_text())
    with contextlib.suppress(OSError, TypeError, ValueError, KeyError):
        tag = netns.tag_of(json.loads((run_dir / "run.json").read_text())["run"])
    if tag is not None and any(netns.leftovers(tag).values()):
        heal = subprocess.run(
            [opus_runs.testbed_binary(), "heal", str(run_dir)], capture_output=True, text=True, timeout=300
        )
        healed = " ".join(heal.stdout.split())[:300]
        if any(netns.leftovers(tag).values()):
            netns.remove(tag)
    stray = []  # a process of the command's tree still alive after it (the same pid and command line): ended here
    for pid, seen in memory.procs.items():
        if command_line(pid)[:120] == seen["command"] and pid != proc.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
                stray.append(seen["command"])
    tail = out_path.read_text()[-1500:]
    why = [ln.strip() for ln in tail.splitlines() if re.search(r"Error|error|cannot", ln)] or tail.strip().splitlines()
    return {
        "command": "testbed " + " ".join(str(c).replace(str(REPO) + "/", "") for c in command[1:-2]),
        "wall_s": wall,
        "exit_status": code,
        "timed_out": code is None,
        "status": summary.get("status"),
        "completed": code == 0 and summary.get("status") == "ok",
        "trials": summary.get("trials"),
        "failover_total_ms": (summary.get("spans") or {}).get("failover.total"),
        "health_wall_ms": (summary.get("spans") or {}).get("health.wall"),
        "tag": tag,
        "healed": healed,
        "stray_processes_ended": stray,
        "output_tail": None if code == 0 else tail,
        "error": None if code == 0 else (why or [""])[-1][:300],  # the last line that names an error, for the table
        "memory": memory.summary(),
        "mem_available_drop_mib": memory.mem_available_drop_mib,
    }


def opus(trials: int, timeout_s: float, console: Console) -> dict:
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-netns-opus-") as tmp:
        for kind, playbook, t in (("health", HEALTH, 1), ("failover", FAILOVER, trials)):
            run = cli_run(playbook, Path(tmp) / kind, t, timeout_s)
            mem = run["memory"]
            console.print(
                f"opus --netns {kind}: {'completed' if run['completed'] else 'did NOT complete'} "
                f"(exit {run['exit_status']}, status {run['status']}) in {run['wall_s']:.1f} s; peak PSS "
                f"{mem['peak_pss']['pss_mib']:.0f} MiB, RSS {mem['peak_rss']['rss_mib']:.0f} MiB, MemAvailable "
                f"-{run['mem_available_drop_mib']:.0f} MiB" + (f"; healed: {run['healed']}" if run["healed"] else ""),
                highlight=False,
            )
            out[kind] = run
    return out


# --- all of it ------------------------------------------------------------------------------------------------


def measure(
    mbytes: int = 200,
    rounds: int = 5,
    repeats: int = 20,
    startup_hosts: int = 64,
    startup_rounds: int = 3,
    opus_trials: int = 3,
    opus_runs: bool = True,
    opus_timeout_s: float = RUN_TIMEOUT_S,
    console: Console | None = None,
) -> dict:
    from testbed.twin import netns

    console = console or Console()
    why = skip_reason()
    if why is not None:
        console.print(f"[yellow]netns_plane skipped: {why}[/]")
        return {"skipped": why}
    made_tags: list[str] = []
    made_ns: list[str] = []
    figures: dict = {}
    try:
        rack = Rack(made_tags)
        try:
            figures["throughput"] = throughput(rack, made_ns, mbytes, rounds, console)
            figures["to_flow"] = to_flow(rack, repeats, console)
        finally:
            rack.close()
        figures["startup"] = startup(startup_hosts, startup_rounds, made_tags, console)
        if opus_runs:
            figures["opus"] = opus(opus_trials, opus_timeout_s, console)
    finally:
        left = {}
        for tag in made_tags:
            found = netns.leftovers(tag)
            if any(found.values()):
                left[tag] = {k: len(v) for k, v in found.items()}
                netns.remove(tag)
        stray = [n for n in made_ns if Path("/run/netns", n).exists()]
        for name in stray:
            subprocess.run(["ip", "netns", "del", name], check=False)
        figures["tags"] = made_tags  # testbed-<tag>-* and tb<tag>*: the names this run's twins made
        figures["leftovers_removed"] = {"twins": left, "baseline_namespaces": stray}
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbytes", type=int, default=200, help="MB per TCP connection")
    parser.add_argument("--rounds", type=int, default=5, help="throughput rounds (a connection each way)")
    parser.add_argument("--repeats", type=int, default=20, help="circuit -> flow repeats")
    parser.add_argument("--startup-hosts", type=int, default=64)
    parser.add_argument("--startup-rounds", type=int, default=3)
    parser.add_argument("--opus-trials", type=int, default=3, help="failovers in the opus-failover run")
    parser.add_argument("--no-opus", action="store_true", help="leave out the 256-host CLI runs")
    args = vars(parser.parse_args())
    with_opus = not args.pop("no_opus")
    compile_project()
    figures = measure(**args, opus_runs=with_opus)
    shown = {k: {**v, "samples": len(v["samples"])} if k == "to_flow" else v for k, v in figures.items()}
    print(json.dumps(shown, indent=2, default=str)[:8000])
    write_out("netns_plane", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
