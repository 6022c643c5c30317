"""The twin with --netns (docs/netns.md): each GPU host a network namespace of its own on a management network.

Each host's SSH server and BMC answer at its address there and nowhere else, what it starts runs in its namespace,
the control side reaches it over the network, and the namespaces and links go with the twin however it stops
short of SIGKILL; after a SIGKILL, `remove(tag)` (what `testbed heal` runs) takes them.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from peers import require_peer

from drivers.redfish import RedfishBmc, RedfishSettings
from drivers.transports.ssh import SshSettings, SshTransport
from emulators.twin import TwinProcess
from testbed.documents import load_inventory
from testbed.twin import netns
from testbed.twin.bridge import twin_spec

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")

INVENTORY = Path(__file__).resolve().parents[2] / "playbooks" / "inventory" / "emulated-rack.yaml"


@pytest.fixture
def spec():
    require_peer("pyroute2", "the twin makes its namespaces and links with pyroute2")
    s = twin_spec(load_inventory(str(INVENTORY)).model, seed=0)
    s.netns = {"tag": secrets.token_hex(3)}
    return s


def hosts_of(twin: TwinProcess) -> dict:
    return twin.endpoints.netns["hosts"]


def ns_inode(name: str) -> tuple[int, int]:
    st = os.stat(f"/run/netns/{name}")
    return st.st_dev, st.st_ino


def ssh(ep: dict) -> SshTransport:
    address, _, port = ep["ssh"].rpartition(":")
    return SshTransport(SshSettings(address, ep["user"], int(port), ep["key_file"], ep["known_hosts"], 5.0), "gpu01")


def test_every_host_is_a_namespace_reached_at_its_own_address(spec):
    with TwinProcess(spec) as twin:
        network = twin.endpoints.netns
        subnet = ipaddress.ip_network(network["subnet"])
        hosts = hosts_of(twin)
        gpu_hosts = [n for n, ep in twin.endpoints.devices.items() if ep["kind"] == "gpu_host"]
        assert sorted(hosts) == sorted(gpu_hosts)
        for name, where in hosts.items():
            ep = twin.endpoints.devices[name]
            assert ep["ssh"] == f"{where['address']}:{ep['ssh'].rpartition(':')[2]}"
            assert ep["redfish"].startswith(f"https://{where['address']}:")
            assert ipaddress.ip_address(where["address"]) in subnet
            assert where["netns"] == f"testbed-{network['tag']}-{name}"
        # The control side's own address on the network is where the kernel's route to a host leaves from: the
        # address the fabric service listens on and tells the ranks (testbed/fabric_service/addresses.py).
        from testbed.fabric_service.addresses import service_addresses

        listen, told = service_addresses({h: w["address"] for h, w in hosts.items()})
        assert listen == network["gateway"] and set(told.values()) == {network["gateway"]}
        # The host answers over the management network, and its BMC does, its certificate verified.
        ep = twin.endpoints.devices["gpu01"]
        transport = ssh(ep)
        try:
            assert "NVIDIA" in transport.exec("nvidia-smi -L").stdout
        finally:
            transport.close()
        bmc = RedfishBmc(
            RedfishSettings(
                address=ep["redfish"],
                user=ep["redfish_user"],
                password=spec.password,
                ca_file=ep["redfish_ca"],
                timeout_s=5.0,
                power_wait_s=10.0,
            ),
            "gpu01",
        )
        try:
            assert bmc.power_state() == "On"
        finally:
            bmc.close()
        # Nothing of the host is bound on this side: its port on loopback is closed.
        port = int(ep["ssh"].rpartition(":")[2])
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_what_a_host_starts_runs_in_its_namespace_and_reaches_the_others(spec):
    with TwinProcess(spec) as twin:
        hosts = hosts_of(twin)
        ep = twin.endpoints.devices["gpu01"]
        other = hosts["gpu02"]["address"]
        transport = ssh(ep)
        try:
            transport.exec("nohup sleep 60 > sleep.log 2>&1 &")
        finally:
            transport.close()
        (job,) = [j for j in twin.control.call("gpu01", "state")["jobs"] if j["alive"]]
        st = os.stat(f"/proc/{job['pid']}/ns/net")
        assert (st.st_dev, st.st_ino) == ns_inode(hosts["gpu01"]["netns"])
        # From inside gpu01's namespace (as its processes are), gpu02 is reached at its address; loopback is the
        # namespace's own, with nothing of the control side on it.
        probe = ["ip", "netns", "exec", hosts["gpu01"]["netns"], "python3", "-c"]
        port = twin.endpoints.devices["gpu02"]["ssh"].rpartition(":")[2]
        reach = f"import socket; socket.create_connection(('{other}', {port}), timeout=3).close()"
        assert subprocess.run([*probe, reach], capture_output=True, timeout=30).returncode == 0
        control = twin.endpoints.control.rpartition(":")[2]
        home = f"import socket; socket.create_connection(('127.0.0.1', {control}), timeout=3).close()"
        assert subprocess.run([*probe, home], capture_output=True, timeout=30).returncode != 0
        pid = job["pid"]
    assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
    assert not any(netns.leftovers(spec.netns["tag"]).values())


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_the_twin_removes_its_network_however_it_is_stopped(spec, sig):
    twin = TwinProcess(spec)
    twin.start()
    try:
        tag = spec.netns["tag"]
        left = netns.leftovers(tag)
        # a namespace per host, and the kernel data plane's fabric
        assert sorted(left["namespaces"]) == sorted(
            [*(w["netns"] for w in hosts_of(twin).values()), twin.endpoints.netns["fabric"]]
        )
        assert left["links"]
        twin.process.send_signal(sig)
        assert twin.process.wait(30) == 0
        assert not any(netns.leftovers(tag).values())
    finally:
        twin.stop()


def test_the_twin_removes_its_network_when_its_parent_dies(spec):
    """A runner killed outright closes the twin's stdin: the twin stops, and takes its network with it."""
    twin = TwinProcess(spec)
    twin.start()
    try:
        twin.process.stdin.close()
        assert twin.process.wait(30) == 0
        assert not any(netns.leftovers(spec.netns["tag"]).values())
    finally:
        twin.stop()


def test_after_sigkill_remove_takes_what_the_twin_left_and_nothing_else(spec):
    other = netns.run_tag(None)
    from emulators.netns import ManagementNetwork

    bystander = ManagementNetwork(other, ["gpu01"])  # another run's network, alive
    bystander.up()
    twin = TwinProcess(spec)
    try:
        twin.start()
        ep = twin.endpoints.devices["gpu01"]
        transport = ssh(ep)
        try:
            transport.exec("nohup sleep 60 > sleep.log 2>&1 &")
        finally:
            transport.close()
        twin.process.kill()
        twin.process.wait(30)
        left = netns.leftovers(spec.netns["tag"])
        assert left["namespaces"] and left["links"] and left["processes"]  # the rank outlived its twin
        done = netns.remove(spec.netns["tag"])
        assert done
        deadline = time.monotonic() + 10
        while any(netns.leftovers(spec.netns["tag"]).values()) and time.monotonic() < deadline:
            time.sleep(0.05)  # a namespace's veth goes once the kernel has freed the namespace
        assert not any(netns.leftovers(spec.netns["tag"]).values())
        assert netns.leftovers(other)["namespaces"] == [f"testbed-{other}-gpu01"]  # not this run's: kept
    finally:
        twin.stop()
        bystander.down()
    assert not any(netns.leftovers(other).values())


def test_two_twins_at_once_take_subnets_apart(spec):
    second = twin_spec(load_inventory(str(INVENTORY)).model, seed=0)
    second.netns = {"tag": secrets.token_hex(3)}
    with TwinProcess(spec) as a, TwinProcess(second) as b:
        one, two = (ipaddress.ip_network(t.endpoints.netns["subnet"]) for t in (a, b))
        assert not one.overlaps(two)
        # and neither overlaps a route this machine had
        routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True)
        for line in routes.stdout.splitlines():
            dst = line.split()[0]
            if dst[0].isdigit() and "tb" not in line:
                net = ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False)
                assert not net.overlaps(one) and not net.overlaps(two), line
