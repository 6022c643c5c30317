"""What the twin must emulate: plain data, JSON-serialisable, so the twin can run in its own process.

The testbed core builds a TwinSpec from the inventory (testbed/twin/bridge.py); the emulators package never
imports the testbed core.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from emulators.kinds import spec_class


@dataclass
class OcsSpec:
    """A Polatis-style optical circuit switch: ingress ports 1..size, egress ports size+1..2*size."""

    name: str
    size: int = 32
    switching_time_ms: float = 25.0
    jitter_ms: float = 0.5  # each move takes switching_time_ms + uniform(-jitter, +jitter), seeded
    insertion_loss_db: float = 1.0
    # Light arriving on ingress ports (from the host transceivers cabled to them), in dBm.
    input_power_dbm: dict[int, float] = field(default_factory=dict)
    seed: int = 0
    idn: str = "Polatis,N-OST-32x32-LU1-DMHNS,000001,6.5.2.18"
    # Circuits (ingress, egress) the switch holds from the start, settled: another user's, in a shared lab.
    circuits: list = field(default_factory=list)
    # The management interfaces it answers on: "scpi" (TCP and a pty) and those of emulators/frontends.py.
    frontends: list = field(default_factory=lambda: ["scpi"])
    user: str = "admin"  # who may log in on TL1 and NETCONF (with emulators.frontends.TWIN_PASSWORD)
    kind: str = "ocs"

    @classmethod
    def from_dict(cls, d: dict) -> OcsSpec:
        # JSON object keys are strings; ports are ints.
        power = {int(k): float(v) for k, v in d.get("input_power_dbm", {}).items()}
        return cls(**{**d, "input_power_dbm": power})


@dataclass
class TwinSpec:
    devices: list = field(default_factory=list)  # OcsSpec and the spec classes emulators/kinds.py names
    # Put a seeded FaultProxy (emulators/proxy) in front of every device's "tcp" endpoint, driven through
    # the control API's proxy.* ops (see emulators/twin.py). Off: the twin serves exactly as without it.
    fault_proxy: bool = False
    # The inventory's fibre map: {host, port, switch, ingress, egress} per cabled host port. The twin's data
    # plane (emulators/dataplane) relays traffic between host ports only along light paths the switches hold.
    fibres: list = field(default_factory=list)
    # A file for the twin's ground truth (emulators/truth.py): when faults were applied and when each job
    # line was written, on the twin's clock. None: no ground truth is kept.
    truth_log: str | None = None
    # The inventory's trunks (switch-to-switch fibres, one direction each): {from, egress, to, ingress,
    # loss_db}. Light paths may cross several switches over them (emulators/dataplane/paths.py).
    trunks: list = field(default_factory=list)
    # kind -> ("module:SpecClass", "module:AdapterClass") for kinds beyond emulators/kinds.py's own: a device
    # family from another package names its emulator here.
    kinds: dict = field(default_factory=dict)
    # What the twin's switches (TL1, NETCONF) and BMCs accept with their user. The default is published (for a twin
    # a test starts by hand); `testbed run --emulate` and `testbed emulate` give each twin a random one, since
    # other accounts of the machine reach 127.0.0.1 too.
    password: str = "twin"  # noqa: S105
    # With --netns (docs/netns.md): {"tag": six hex digits naming the run's namespaces and links}. Each GPU host is
    # then a network namespace of its own on a management network the twin makes (emulators/netns.py).
    netns: dict | None = None

    def to_json(self) -> str:
        out: dict = {"devices": [asdict(d) for d in self.devices]}
        if self.kinds:
            out["kinds"] = {k: list(v) for k, v in self.kinds.items()}
        if self.fault_proxy:
            out["fault_proxy"] = True
        if self.fibres:
            out["fibres"] = [dict(f) for f in self.fibres]
        if self.trunks:
            out["trunks"] = [dict(t) for t in self.trunks]
        if self.truth_log:
            out["truth_log"] = self.truth_log
        out["password"] = self.password
        if self.netns:
            out["netns"] = dict(self.netns)
        return json.dumps(out)

    @classmethod
    def from_json(cls, text: str) -> TwinSpec:
        raw = json.loads(text)
        kinds = raw.get("kinds", {})
        if not isinstance(kinds, dict) or not all(
            isinstance(v, list) and len(v) == 2 and all(isinstance(r, str) for r in v) for v in kinds.values()
        ):
            raise ValueError(f"kinds must map a kind to [spec class, adapter class], got {kinds!r}")
        kinds = {k: tuple(v) for k, v in kinds.items()}
        devices = []
        for d in raw["devices"]:
            spec = spec_class(d.get("kind", "ocs"), kinds)
            devices.append(spec.from_dict(d) if hasattr(spec, "from_dict") else spec(**d))
        fault_proxy = raw.get("fault_proxy", False)
        if not isinstance(fault_proxy, bool):
            raise ValueError(f"fault_proxy must be true or false, got {fault_proxy!r}")
        fibres = raw.get("fibres", [])
        if not isinstance(fibres, list) or not all(isinstance(f, dict) for f in fibres):
            raise ValueError(f"fibres must be a list of objects, got {fibres!r}")
        trunks = raw.get("trunks", [])
        if not isinstance(trunks, list) or not all(isinstance(t, dict) for t in trunks):
            raise ValueError(f"trunks must be a list of objects, got {trunks!r}")
        truth_log = raw.get("truth_log")
        if truth_log is not None and not isinstance(truth_log, str):
            raise ValueError(f"truth_log must be a file path, got {truth_log!r}")
        password = raw.get("password", cls.password)
        if not isinstance(password, str) or not password:
            raise ValueError("password must be a non-empty string")
        netns = raw.get("netns")
        if netns is not None and not (
            isinstance(netns, dict) and isinstance(netns.get("tag"), str) and netns["tag"].isalnum()
        ):
            raise ValueError(f"netns must be an object with an alphanumeric tag, got {netns!r}")
        return cls(
            netns=netns,
            devices=devices,
            fault_proxy=fault_proxy,
            fibres=fibres,
            trunks=trunks,
            truth_log=truth_log,
            kinds=kinds,
            password=password,
        )
