"""The kernel data plane (docs/netns.md): with --netns a host's traffic to another host's data address crosses the
kernel from its port's interface to the port its light reaches on the emulated switch, and nowhere else. The
switch is driven over SCPI, as a driver drives it; the traffic is a real TCP connection between processes in
the hosts' namespaces.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from peers import require_peer
from raw_scpi import ask

from emulators.dataplane.kernel import KernelPlane, _first_hops
from emulators.dataplane.paths import LightPaths
from emulators.twin import TwinProcess
from testbed.documents import load_inventory
from testbed.twin import netns
from testbed.twin.bridge import twin_spec

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")

INVENTORY = Path(__file__).resolve().parents[2] / "playbooks" / "inventory" / "emulated-rack.yaml"
# ocs1's cabling in the emulated rack: host port -> (ingress it transmits into, egress it receives from)
CABLE = {
    ("gpu01", "p0"): (1, 33),
    ("gpu01", "p1"): (2, 34),
    ("gpu02", "p0"): (3, 35),
    ("gpu02", "p1"): (4, 36),
    ("gpu03", "p0"): (5, 37),
    ("gpu03", "p1"): (6, 38),
}
A0, A1, B0, B1, C0, C1 = (
    ("gpu01", "p0"),
    ("gpu01", "p1"),
    ("gpu02", "p0"),
    ("gpu02", "p1"),
    ("gpu03", "p0"),
    ("gpu03", "p1"),
)
PORT = 47011
# A server in a host's namespace: echoes each connection's bytes until EOF; says "ready" once it listens.
SERVER = """
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    c, _ = s.accept()
    with c:
        while data := c.recv(65536):
            c.sendall(data)
"""
CLIENT = """
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    c.sendall(b"x" * 100000)
    c.shutdown(socket.SHUT_WR)
    got = b""
    while data := c.recv(65536):
        got += data
    print(len(got))
except OSError as exc:
    print(type(exc).__name__)
"""


@pytest.fixture(scope="module")
def twin():
    require_peer("pyroute2", "the twin makes its namespaces and links with pyroute2")
    spec = twin_spec(load_inventory(str(INVENTORY)).model, seed=0)
    spec.netns = {"tag": secrets.token_hex(3)}
    with TwinProcess(spec) as tw:
        yield tw
    assert not any(netns.leftovers(spec.netns["tag"]).values())


@pytest.fixture
def ocs1(twin):
    def scpi(line: str) -> str:
        return ask(twin.endpoints.devices["ocs1"]["tcp"], f"{line};*OPC?")[0]

    scpi(":OXC:SWIT:DISC:ALL")
    yield scpi
    scpi(":OXC:SWIT:DISC:ALL")


def circuits(*pairs: tuple[tuple[str, str], tuple[str, str]]) -> str:
    """SCPI's channel lists for circuits from each pair's transmitting host port to its receiving one."""
    ingress = ",".join(str(CABLE[tx][0]) for tx, _ in pairs)
    egress = ",".join(str(CABLE[rx][1]) for _, rx in pairs)
    return f"(@{ingress}),(@{egress})"


def data(twin, host: str) -> str:
    return twin.endpoints.netns["data"][host]


def in_ns(twin, host: str) -> list[str]:
    return ["ip", "netns", "exec", twin.endpoints.netns["hosts"][host]["netns"], sys.executable, "-c"]


@pytest.fixture
def server(twin):
    """An echo server in gpu02's and in gpu03's namespace, at their data addresses."""
    procs = []
    for host in ("gpu02", "gpu03"):
        proc = subprocess.Popen(
            [*in_ns(twin, host), SERVER, data(twin, host), str(PORT)], stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        assert proc.stdout.readline().strip() == "ready"
    yield
    for proc in procs:
        proc.kill()
        proc.wait()


def send(twin, src: str, dst: str, timeout: float = 2.0) -> str:
    """From a process in src's namespace, 100000 bytes to dst's echo server: the count echoed, or the error."""
    out = subprocess.run(
        [*in_ns(twin, src), CLIENT, data(twin, dst), str(PORT), str(timeout)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout.strip() or out.stderr.strip()


def directions(twin) -> dict[str, dict]:
    return {d["from"]: d for d in twin.control.call(None, "dataplane.state")["kernel"]["directions"]}


def await_light(twin, want: dict[str, str | None], within_s: float = 10.0) -> None:
    """Until the kernel forwards each host port's frames as `want` says (host port -> the port it reaches)."""
    deadline = time.monotonic() + within_s
    while True:
        seen = {k: directions(twin)[k]["to"] for k in want}
        if seen == want:
            return
        assert time.monotonic() < deadline, f"the kernel data plane still forwards {seen}, not {want}"
        time.sleep(0.01)  # polling the twin's state for a condition, not standing in for it


def routes(twin, *links: list[str]) -> dict:
    """Routes over directed links: [host, port, peer, peer's port], host transmitting to peer."""
    return twin.control.call(None, "dataplane.routes", links=[list(x) for x in links])


def duplex(host: str, port: str, peer: str, peer_port: str) -> list[list[str]]:
    return [[host, port, peer, peer_port], [peer, peer_port, host, port]]


def test_a_circuit_carries_traffic_and_only_while_its_light_goes_both_ways(twin, ocs1, server):
    routes(twin, *duplex("gpu01", "p0", "gpu02", "p1"))
    await_light(twin, {"gpu01:p0": None, "gpu02:p1": None})
    assert send(twin, "gpu01", "gpu02") == "TimeoutError"  # no circuit: the fabric drops every frame
    before = directions(twin)["gpu01:p0"]["bytes"]
    ocs1(f":OXC:SWIT:CONN:ADD {circuits((A0, B1), (B1, A0))}")
    await_light(twin, {"gpu01:p0": "gpu02:p1", "gpu02:p1": "gpu01:p0"})
    assert send(twin, "gpu01", "gpu02") == "100000"
    assert directions(twin)["gpu01:p0"]["bytes"] - before > 100000  # it crossed gpu01:p0's fibre
    # One direction dark (the way back removed): TCP cannot work over it
    ocs1(f":OXC:SWIT:CONN:SUB {circuits((B1, A0))}")
    await_light(twin, {"gpu01:p0": "gpu02:p1", "gpu02:p1": None})
    assert send(twin, "gpu01", "gpu02") == "TimeoutError"
    # Re-pointed to another host: its light lands at gpu03, which is not the route's next hop
    ocs1(f":OXC:SWIT:CONN:ADD {circuits((A0, C1), (C1, A0))}")
    await_light(twin, {"gpu01:p0": "gpu03:p1", "gpu03:p1": "gpu01:p0"})
    assert send(twin, "gpu01", "gpu02") == "TimeoutError"


def test_a_disabled_port_darkens_the_circuit(twin, ocs1, server):
    routes(twin, *duplex("gpu01", "p0", "gpu02", "p1"))
    ocs1(f":OXC:SWIT:CONN:ADD {circuits((A0, B1), (B1, A0))}")
    await_light(twin, {"gpu01:p0": "gpu02:p1", "gpu02:p1": "gpu01:p0"})
    ocs1(f":OXC:SWIT:PORT:DIS (@{CABLE[B1][0]})")
    try:
        await_light(twin, {"gpu01:p0": "gpu02:p1", "gpu02:p1": None})
        assert send(twin, "gpu01", "gpu02") == "TimeoutError"
        why = [
            e["why"]
            for e in twin.control.call(None, "dataplane.state")["kernel"]["events"]
            if e.get("from") == "gpu02:p1"
        ]
        assert "disabled" in why[-1]
    finally:
        ocs1(f":OXC:SWIT:PORT:ENAB (@{CABLE[B1][0]})")
    await_light(twin, {"gpu02:p1": "gpu01:p0"})
    assert send(twin, "gpu01", "gpu02") == "100000"


def test_a_host_forwards_for_the_others_where_the_topology_needs_it(twin, ocs1, server):
    # gpu01 - gpu02 - gpu03 in a line: gpu01 reaches gpu03 through gpu02
    table = routes(twin, *duplex("gpu01", "p0", "gpu02", "p1"), *duplex("gpu02", "p0", "gpu03", "p1"))
    assert table == {"gpu01": 2, "gpu02": 2, "gpu03": 2}
    state = twin.control.call(None, "dataplane.state")["kernel"]
    assert state["routes"]["gpu01"][data(twin, "gpu03")] == {"via": data(twin, "gpu02"), "port": "p0"}
    ocs1(f":OXC:SWIT:CONN:ADD {circuits((A0, B1), (B1, A0), (B0, C1), (C1, B0))}")
    await_light(twin, {"gpu01:p0": "gpu02:p1", "gpu02:p0": "gpu03:p1", "gpu03:p1": "gpu02:p0"})
    gpu02_p0 = directions(twin)["gpu02:p0"]["bytes"]
    assert send(twin, "gpu01", "gpu03") == "100000"
    assert directions(twin)["gpu02:p0"]["bytes"] - gpu02_p0 > 100000  # gpu02 forwarded it on
    # The next launch's routes replace these: gpu03 is no longer on them
    assert routes(twin, *duplex("gpu01", "p0", "gpu02", "p1")) == {"gpu01": 1, "gpu02": 1}
    assert send(twin, "gpu01", "gpu03") in ("TimeoutError", "OSError")


def test_a_one_way_ring_carries_tcp_the_way_back_going_round(twin, ocs1, server):
    """Light one way only, gpu01 -> gpu02 -> gpu03 -> gpu01 (a ring without reverse ports): gpu02's answers to
    gpu01 go on through gpu03, and nothing needs light both ways (the neighbours are set, not asked for by ARP).
    """
    ring = [["gpu01", "p0", "gpu02", "p1"], ["gpu02", "p0", "gpu03", "p1"], ["gpu03", "p0", "gpu01", "p1"]]
    routes(twin, *ring)
    state = twin.control.call(None, "dataplane.state")["kernel"]
    assert state["routes"]["gpu02"][data(twin, "gpu01")] == {"via": data(twin, "gpu03"), "port": "p0"}
    ocs1(f":OXC:SWIT:CONN:ADD {circuits((A0, B1), (B0, C1), (C0, A1))}")
    await_light(twin, {"gpu01:p0": "gpu02:p1", "gpu02:p0": "gpu03:p1", "gpu03:p0": "gpu01:p1", "gpu02:p1": None})
    gpu03_out = directions(twin)["gpu03:p0"]["bytes"]
    assert send(twin, "gpu01", "gpu02") == "100000"
    assert directions(twin)["gpu03:p0"]["bytes"] - gpu03_out > 100000  # the echo came back round through gpu03


def test_routes_name_a_port_the_plane_does_not_have():
    plane = KernelPlane(LightPaths([], {}), "000000", {"gpu01": "ns"}, {"gpu01": "10.0.0.2"})
    with pytest.raises(ValueError, match="gpu01:p9 is not a host port"):
        plane.routes([["gpu01", "p9", "gpu02", "p0"]])


def test_first_hops_take_the_shortest_way_and_the_first_given_of_equal_ones():
    ring = {
        "a": [("p0", "b"), ("p1", "d")],
        "b": [("p1", "a"), ("p0", "c")],
        "c": [("p1", "b"), ("p0", "d")],
        "d": [("p1", "c"), ("p0", "a")],
    }
    assert _first_hops(ring, "a") == {"b": ("p0", "b"), "d": ("p1", "d"), "c": ("p0", "b")}
    assert _first_hops({"a": []}, "a") == {}
