"""Property tests of taking ports out of service (link.down's commands), on one emulated switch through its
three grammars: Polatis SCPI `:OXC:SWIT:PORT:DIS|ENAB (@...)`, Polatis TL1 `OPR|RLS-PORT-SHUTTER`, Calient
TL1 `ED-PORT ...:INAS|OUTAS=OOS|IS`, in every spelling, with ranges and ports out of range.

After any sequence, against a reference of the ports disabled:
- a command naming a port the switch lacks is refused whole (an error or a DENY) and changes nothing;
- every port reads what the reference says (`:OXC:SWIT:PORT:STAT?`), and a circuit through a disabled port
  reads dark on the power monitor while the others stay lit;
- the twin's ground truth logs each accepted change once, with its ports and state, and nothing refused;
- each dialect's audit model (what `testbed check` holds the writes to) names exactly the ports written.
"""

from __future__ import annotations

import json
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drivers.scpi.audit import PolatisAuditModel
from drivers.tl1.audit import CalientTl1AuditModel, PolatisTl1AuditModel
from drivers.tl1.calient import aid_of
from emulators.frontends import TWIN_PASSWORD
from emulators.scpi.ocs import DARK_DBM, PolatisEngine
from emulators.spec import OcsSpec
from emulators.tl1.frontend import CalientTl1Frontend, PolatisTl1Frontend
from emulators.truth import GroundTruth

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_STATUS = re.compile(r"M  \S+ (COMPLD|DENY)\r\n")

SCPI_HEADERS = {
    False: [":OXC:SWIT:PORT:DIS", ":oxc:switch:port:disable", ":OXC:SWITch:PORT:DISable", "OXC:SWIT:PORT:DIS"],
    True: [":OXC:SWIT:PORT:ENAB", ":oxc:swit:port:enable", ":OXC:SWITch:PORT:ENABle", "OXC:SWIT:PORT:ENAB"],
}
TL1_VERBS = {False: ["OPR-PORT-SHUTTER", "opr-port-shutter"], True: ["RLS-PORT-SHUTTER", "Rls-Port-Shutter"]}


class Switch:
    """One engine (size n, a lit circuit i -> n+i on every ingress) with its SCPI session and a logged-in
    session of each TL1 dialect, and the ground truth in a file.
    """

    def __init__(self, n: int, truth_path) -> None:
        circuits = [[i, n + i] for i in range(1, n + 1)]
        lit = {i: 0.0 for i in range(1, n + 1)}
        self.spec = OcsSpec(
            "sw", size=n, switching_time_ms=0, jitter_ms=0, circuits=circuits, input_power_dbm=lit, user="admin"
        )
        self.n = n
        self.engine = PolatisEngine(self.spec, clock=lambda: 0.0)
        self.truth_path = truth_path
        truth_path.write_text("")
        self.engine.truth = GroundTruth(truth_path)
        self.scpi = self.engine.new_session()
        self.out: list[str] = []
        self.tl1 = {}
        for dialect, cls in (("polatis", PolatisTl1Frontend), ("calient", CalientTl1Frontend)):
            session = cls(self.engine, self.spec).new_session(
                lambda at, data: self.out.append(data.decode("latin-1")), lambda data: None
            )
            session.receive(f"ACT-USER::admin:1::{TWIN_PASSWORD};".encode(), 0.0)
            self.tl1[dialect] = session
        assert "COMPLD" in self.out[-1] and "COMPLD" in self.out[-2]
        self.now = 0.0

    def scpi_ask(self, line: str) -> list[str]:
        self.now += 0.001
        return [r.data.decode().strip() for r in self.scpi.handle(line, self.now)]

    def errors(self) -> list[int]:
        codes = []
        while (reply := self.scpi_ask(":SYST:ERR?")[0]) and not reply.startswith("0,"):
            codes.append(int(reply.split(",")[0]))
        return codes

    def tl1_status(self, dialect: str, command: str) -> str:
        before = len(self.out)
        self.now += 0.001
        self.tl1[dialect].receive(command.encode("latin-1"), self.now)
        (status,) = [m.group(1) for block in self.out[before:] if (m := _STATUS.search(block))]
        return status

    def truth(self) -> list[dict]:
        return [json.loads(line) for line in self.truth_path.read_text().splitlines()]


# A port list: items that are one port or a range (either way round); now and then one beyond the switch.
@st.composite
def port_items(draw, top: int) -> list[tuple[int, int]]:
    port = st.integers(1, top)
    item = st.one_of(port.map(lambda p: (p, p)), st.tuples(port, port))
    items = draw(st.lists(item, min_size=1, max_size=4))
    if draw(st.integers(0, 3)) == 0:
        stray = draw(st.sampled_from([0, top + 1]))
        items.insert(draw(st.integers(0, len(items))), (stray, stray))
    return items


def expand(items: list[tuple[int, int]]) -> list[int]:
    out: list[int] = []
    for a, b in items:
        out.extend(range(a, b + 1) if a <= b else range(a, b - 1, -1))
    return out


@st.composite
def operations(draw, n: int):
    dialect = draw(st.sampled_from(["scpi", "polatis", "calient"]))
    enable = draw(st.booleans())
    if dialect == "calient":
        side = draw(st.sampled_from(["INAS", "OUTAS"]))
        ks = draw(st.lists(st.integers(1, n + 1), min_size=1, max_size=4))  # n + 1: a port the switch lacks
        offset = 0 if side == "INAS" else n
        return dialect, enable, [offset + k for k in ks], all(k <= n for k in ks), (side, ks)
    items = draw(port_items(2 * n))
    ports = expand(items)
    valid = all(1 <= p <= 2 * n for p in ports)
    if dialect == "scpi":
        header = draw(st.sampled_from(SCPI_HEADERS[enable]))
        space = draw(st.sampled_from(["", " "]))
        body = ",".join(f"{space}{a}{space}" if a == b else f"{a}:{b}" for a, b in items)
        return dialect, enable, ports, valid, f"{header} (@{body})"
    verb = draw(st.sampled_from(TL1_VERBS[enable]))
    aid = "&".join(str(a) if a == b else f"{a}&&{b}" for a, b in items)
    return dialect, enable, ports, valid, f"{verb}::{aid}:{draw(st.integers(1, 999))}:;"


scenarios = st.integers(2, 6).flatmap(lambda n: st.tuples(st.just(n), st.lists(operations(n), max_size=8)))


@FUZZ
@given(scenarios)
def test_port_commands_in_every_dialect_agree_with_the_reference(tmp_path_factory, scenario):
    n, ops = scenario
    sw = Switch(n, tmp_path_factory.mktemp("truth") / "truth.jsonl")
    disabled: set[int] = set()
    audit = {"scpi": PolatisAuditModel(n), "polatis": PolatisTl1AuditModel(n), "calient": CalientTl1AuditModel(n)}
    for dialect, enable, ports, valid, command in ops:
        logged = len(sw.truth())
        if dialect == "scpi":
            sw.scpi_ask(command)
            accepted = not sw.errors()
            text = command
        elif dialect == "polatis":
            accepted = sw.tl1_status("polatis", command) == "COMPLD"
            text = command
        else:
            side, ks = command
            aid = "&".join(aid_of(k) if k <= n else f"1.{k // 8 + 1}.{k % 8 + 1}0" for k in ks)
            text = f"ED-PORT::{aid}:7:::{side}={'IS' if enable else 'OOS'};"
            accepted = sw.tl1_status("calient", text) == "COMPLD"
        assert accepted == valid, (command, ports)
        new = sw.truth()[logged:]
        if accepted:
            (disabled.difference_update if enable else disabled.update)(ports)
            assert [(e["event"], e["switch"], e["ports"], e["state"]) for e in new] == [
                ("port", "sw", sorted(set(ports)), "enabled" if enable else "disabled")
            ]
            (write,) = audit[dialect].writes(text)
            assert write.ports == frozenset(ports), (text, write)
        else:
            assert new == []

        states = sw.scpi_ask(f":OXC:SWIT:PORT:STAT? (@1:{2 * n})")[0]
        assert states == "(" + ",".join("D" if p in disabled else "E" for p in range(1, 2 * n + 1)) + ")"
        powers = [float(v) for v in sw.scpi_ask(f":PMON:POW? (@{n + 1}:{2 * n})")[0].split(",")]
        for i, dbm in enumerate(powers, start=1):
            dark = i in disabled or n + i in disabled
            assert (dbm == DARK_DBM) == dark, (i, dbm, disabled)
