"""The bridge from an inventory to its emulated twin: the one place the framework reaches the emulators
(docs/architecture.md, "Layers"). A run on a lab never imports this module.

- twin_spec: what the twin must emulate, from each device's family (its TwinSupport) and the fibre map;
- point_at_twin: the same inventory with every transport pointed at the twin's loopback endpoints;
- start_twin: the twin process for a plan, and the TwinHandle the engine reaches it through (control ops,
  timed faults, the chip's transfer matrix, the data plane's relays);
- replay_session: a fresh emulator front end for `testbed replay`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from emulators.control import TriggerMissed
from emulators.frontends import TWIN_PASSWORD_ENV
from emulators.kinds import BUILTIN_KINDS, adapter_class, spec_class
from emulators.spec import TwinSpec
from emulators.twin import TwinProcess
from testbed.contracts.errors import UserError
from testbed.contracts.twin import Twin
from testbed.documents.inventory import Inventory
from testbed.families import FAMILIES, family_of

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def emulated_kinds() -> set[str]:
    """The device kinds the twin can stand in for (their family has a TwinSupport)."""
    return {f.kind for f in FAMILIES if f.twin is not None}


def _extra_kinds(inv: Inventory) -> dict[str, tuple[str, ...]]:
    """Emulators of families from other packages: kind -> (spec class, adapter class) references."""
    out = {}
    for dev in inv.devices.values():
        twin = family_of(dev).twin
        if twin is not None and twin.refs is not None and dev.kind not in BUILTIN_KINDS:
            out[dev.kind] = tuple(twin.refs)
    return out


def _device_spec(name: str, dev, inv: Inventory, seed: int, kinds: dict):
    twin = family_of(dev).twin
    assert twin is not None  # only emulated devices get here (not_emulated refused the others)
    data = twin.spec(name, dev, inv, seed)
    cls = spec_class(data["kind"], kinds)
    return cls.from_dict(data) if hasattr(cls, "from_dict") else cls(**data)


def twin_spec(inv: Inventory, seed: int, only: set[str] | None = None) -> TwinSpec:
    kinds = _extra_kinds(inv)
    devices = [
        _device_spec(name, dev, inv, seed, kinds)
        for name, dev in inv.devices.items()
        if (only is None or name in only) and family_of(dev).twin is not None
    ]
    # The fibre map and the trunks drive the twin's data plane (emulators/dataplane): traffic between host
    # ports flows only along the light paths the emulated switches hold, within each path's loss budget.
    fibres = [
        {
            "host": f.host,
            "port": f.port,
            "switch": f.switch,
            "ingress": f.actual()[0],
            "egress": f.actual()[1],
            "launch_power_dbm": f.launch_power_dbm,
            "rx_sensitivity_dbm": f.rx_sensitivity_dbm,
        }
        for f in inv.fibres
    ]
    trunks = [
        {"from": t.from_, "egress": t.egress, "to": t.to, "ingress": t.ingress, "loss_db": t.loss_db}
        for t in inv.trunks
    ]
    return TwinSpec(devices=devices, fibres=fibres, trunks=trunks, kinds=kinds)


def not_emulated(inv: Inventory, devices) -> list[str]:
    return [d for d in devices if family_of(inv.devices[d]).twin is None]


def point_at_twin(inv: Inventory, endpoints: dict) -> Inventory:
    """The same inventory with every emulated device's transport replaced by its twin endpoint."""
    devices = dict(inv.devices)
    for name, ep in endpoints["devices"].items():
        dev = devices[name]
        devices[name] = dev.model_copy(update={"transport": dev.transport.at_twin(ep)})
    return inv.model_copy(update={"devices": devices})


LOOPBACK = re.compile(
    r"^(TCPIP\d*::127\.0\.0\.1::\d+::SOCKET|ASRL/dev/pts/\d+::INSTR|/dev/pts/\d+|"
    r"socket://127\.0\.0\.1:\d+|.*@127\.0\.0\.1:\d+|127\.0\.0\.1:\d+)$"
)


_ON_A_NETWORK = re.compile(r"^(?:.*@)?(\d+\.\d+\.\d+\.\d+):\d+$")


def _inside(address: str, network: IpNetwork | None) -> bool:
    """Whether `address` (user@A:port, A:port) is on the twin's own management network (--netns)."""
    m = _ON_A_NETWORK.match(address)
    return network is not None and m is not None and ipaddress.ip_address(m.group(1)) in network


def assert_loopback(inv: Inventory, devices, network: IpNetwork | None = None) -> None:
    """An emulated run never opens a real address: refuse to go on if any device still points outside loopback
    (and, with --netns, outside the management network the twin made).
    """
    outside = [
        f"{d} -> {inv.devices[d].transport.address()}"
        for d in devices
        if not LOOPBACK.match(inv.devices[d].transport.address())
        and not _inside(inv.devices[d].transport.address(), network)
    ]
    if outside:
        raise UserError(
            "--emulate: refusing to run, these devices would use a non-loopback address: " + ", ".join(outside)
        )


class TwinHandle(Twin):
    """A running twin as the engine reaches it (testbed.contracts.twin.Twin): control ops, timed ops, the truths
    only the twin knows.
    """

    def __init__(self, process: TwinProcess) -> None:
        assert process.endpoints is not None and process.process is not None  # a started twin
        self.process = process
        self.control = process.control
        self.endpoints = process.endpoints.to_json()
        self.pid = process.process.pid
        self._links: list[list[str]] = []  # the launch being built's links, on the kernel data plane (--netns)

    @property
    def netns(self) -> dict | None:
        """The management network of a --netns twin (emulators/netns.py, describe()), None on loopback."""
        return self.endpoints.get("netns")

    def host_address(self, host: str) -> str:
        """Where `host`'s processes listen and are reached: its management address with --netns, else loopback."""
        network = self.netns
        if network is not None and host in network["hosts"]:
            return network["hosts"][host]["address"]
        return "127.0.0.1"

    @property
    def kernel_plane(self) -> bool:
        """Whether the job's traffic crosses the kernel (--netns, emulators/dataplane/kernel.py), not relays."""
        return self.netns is not None

    def rank_address(self, host: str) -> str:
        """Where `host`'s ranks listen and are reached by the other ranks: its data address on the kernel data
        plane with --netns (docs/netns.md), else loopback.
        """
        network = self.netns  # the kernel data plane is --netns's
        return network["data"][host] if network is not None and host in network["data"] else "127.0.0.1"

    def call(self, device: str | None, op: str, **args: Any) -> Any:
        return self.control.call(device, op, **args)

    def fire_at(self, at_ns: int, device: str, op: str, **args: Any) -> bool:
        try:
            self.control.call_at(at_ns, device, op, **args)
            return True
        except TriggerMissed:
            return False

    def open_truth(self, path: Path) -> None:
        """The ground truth goes to `path` from now on (the next run of a warm session, in its own folder)."""
        self.control.call(None, "truth.open", path=str(Path(path).resolve()))

    def transfer_power(self, device: str) -> list[list[float]]:
        """A chip's power transfer matrix |T[out][in]|^2 (for crosstalk, which a lab cannot measure)."""
        return self.control.call(device, "transfer_power")

    def dataplane_link(self, src_host: str, src_port: str, dst_host: str, dst_port: str, target_port: int) -> str:
        """The address src_host:src_port uses to reach the rank behind dst_host:dst_port: on loopback the data
        plane's relay; with --netns the rank's own address on the kernel data plane, the link kept for the
        launch's routes (`dataplane_commit`).
        """
        if self.kernel_plane:  # a duplex link: both ways
            self._links += [[src_host, src_port, dst_host, dst_port], [dst_host, dst_port, src_host, src_port]]
            return f"{self.rank_address(dst_host)}:{target_port}"
        args = dict(src_host=src_host, src_port=src_port, dst_host=dst_host, dst_port=dst_port)
        return self.control.call(None, "dataplane.link", **args, target_port=target_port)

    def dataplane_commit(self, fabric: Iterable[tuple[tuple[str, str], tuple[str, str]]] = ()) -> None:
        """A launch's links are all given (and `fabric`, its job fabric's, each ((host, port), (peer, port)): host
        transmits to peer): with --netns, its hosts' routes over them, in place before any rank starts; nothing
        on loopback, where each link is a relay already.
        """
        links, self._links = self._links, []
        if self.kernel_plane:
            links += [[a, pa, b, pb] for (a, pa), (b, pb) in fabric]
            self.control.call(None, "dataplane.routes", links=links)

    def clock(self, samples: int = 5) -> dict:
        """The twin's monotonic clock minus ours, by Cristian's method (the shortest round trip bounds the
        error by half of it). On one machine both read CLOCK_MONOTONIC, so the offset should be 0 within the
        bound: the run records it as evidence, and the accuracy comparison uses 0.
        """
        best: tuple[int, int] | None = None
        for _ in range(samples):
            t0 = time.monotonic_ns()
            remote = self.control.call(None, "clock")["mono_ns"]
            t1 = time.monotonic_ns()
            if best is None or t1 - t0 < best[0]:
                best = (t1 - t0, remote - (t0 + t1) // 2)
        assert best is not None, "samples must be at least 1"
        rtt, offset = best
        return {"offset_ms": round(offset / 1e6, 4), "error_bound_ms": round(rtt / 2e6, 4), "clock": "CLOCK_MONOTONIC"}


@contextlib.contextmanager
def start_twin(plan, truth_log: Path | None, console=None, *, netns: bool = False):
    """The twin of a plan's devices: yields (the inventory pointed at it, its TwinHandle); stops it after. With
    `netns`, every GPU host is a network namespace of its own (docs/netns.md), tagged from the run's id (the
    folder `truth_log` is in).
    """
    missing = not_emulated(plan.inventory, plan.devices)
    if missing:
        raise UserError(f"--emulate: no emulator yet for {', '.join(missing)}")
    spec = twin_spec(plan.inventory, plan.seed, only=set(plan.devices))
    if netns:
        from testbed.twin.netns import refuse_without_privilege, run_tag

        refuse_without_privilege()
        spec.netns = {"tag": run_tag(Path(truth_log).parent.name if truth_log is not None else None)}
    if truth_log is not None:
        spec.truth_log = str(Path(truth_log).resolve())  # the twin's account of what really happened
    spec.fault_proxy = plan.transport_faults  # only then: a proxy adds its own hop to every device call
    # The twin's switches and BMCs accept a password of its own, random (other accounts of the machine reach its
    # loopback endpoints too); the transports pointed at the twin read it from here, as a lab's from the variable
    # its inventory names.
    spec.password = secrets.token_urlsafe(16)
    os.environ[TWIN_PASSWORD_ENV] = spec.password
    with TwinProcess(spec) as process:
        handle = TwinHandle(process)
        inventory = point_at_twin(plan.inventory, handle.endpoints)
        network = handle.netns
        assert_loopback(inventory, plan.devices, ipaddress.ip_network(network["subnet"]) if network else None)
        if console is not None:
            console.print(
                f"[dim]emulated twin: {', '.join(handle.endpoints['devices'])} (control {handle.endpoints['control']})"
            )
            if network:
                console.print(
                    f"[dim]--netns: {len(network['hosts'])} host namespace(s) testbed-{network['tag']}-*, management "
                    f"network {network['subnet']} on bridge {network['bridge']} (this side: {network['gateway']})"
                )
        yield inventory, handle


def twin_control(address: str, timeout: float = 10.0):
    """A connection to a running twin's control server (testbed heal reaches a twin that outlived its run)."""
    from emulators.control import TwinControl

    return TwinControl(address, timeout=timeout)


def replay_session(inv: Inventory, device: str, seed: int, circuits: dict | None):
    """A fresh emulator front end for `device`, as `--emulate` would boot it, in the state the run found it:
    a replay session (testbed.ops.audit_replay.ReplaySession); None if its emulator cannot replay.
    """
    dev = inv.devices[device]
    if family_of(dev).twin is None:
        return None
    kinds = _extra_kinds(inv)
    spec = _device_spec(device, dev, inv, seed, kinds)
    session = getattr(adapter_class(spec.kind, kinds), "replay_session", None)
    return None if session is None else session(spec, circuits)
