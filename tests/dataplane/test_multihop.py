"""Light paths through several switches joined by trunks: in-process against the real engines (virtual
time), and through a twin process whose relays carry a connection across two switches.

Cabling in both (host transmit -> ingress, egress -> host receive; trunks one way each, 0.5 dB):

    gpu01:p0 -> ocs1 1 / 9          gpu02:p0 -> ocs2 1 / 9
    ocs1 egress 16 -> ocs2 ingress 8        ocs2 egress 16 -> ocs1 ingress 8
"""

from __future__ import annotations

import math
import socket
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from dataplane_harness import address, recv_exact, refused, wait_reset
from raw_scpi import ask

from emulators.control import TwinControl
from emulators.dataplane import LightPaths
from emulators.dataplane.paths import couple_trunk_light, parse_trunks
from emulators.mesh.chip import MeshChip
from emulators.mesh.spec import MeshSpec
from emulators.scpi.ocs import DARK_DBM, PolatisEngine
from emulators.spec import OcsSpec, TwinSpec
from emulators.twin import TwinProcess

FIBRES = [
    {"host": "gpu01", "port": "p0", "switch": "ocs1", "ingress": 1, "egress": 9},
    {"host": "gpu02", "port": "p0", "switch": "ocs2", "ingress": 1, "egress": 9},
]
TRUNKS = [
    {"from": "ocs1", "egress": 16, "to": "ocs2", "ingress": 8, "loss_db": 0.5},
    {"from": "ocs2", "egress": 16, "to": "ocs1", "ingress": 8, "loss_db": 0.5},
]
# gpu01 -> gpu02 and gpu02 -> gpu01, as (switch, SCPI channel lists) per switch
FORWARD = {"ocs1": "(@1),(@16)", "ocs2": "(@8),(@9)"}
BACKWARD = {"ocs2": "(@1),(@16)", "ocs1": "(@8),(@9)"}
MOVE = 0.005  # switching time 5 ms, no jitter


def ocs_spec(name: str) -> OcsSpec:
    return OcsSpec(name, size=8, switching_time_ms=MOVE * 1000, jitter_ms=0.0, input_power_dbm={1: 0.0})


class Lab:
    """Two real OCS engines and the light paths between them, in virtual time."""

    def __init__(self, fibres=FIBRES, trunks=TRUNKS):
        self.ocs = {name: PolatisEngine(ocs_spec(name), clock=lambda: 0.0) for name in ("ocs1", "ocs2")}
        devices = {name: SimpleNamespace(kind="ocs", engine=e) for name, e in self.ocs.items()}
        self.paths = LightPaths(fibres, devices, trunks=trunks)
        couple_trunk_light(self.paths.trunks, devices)

    def scpi(self, switch: str, line: str, now: float) -> list[str]:
        return [r.data.decode().strip() for r in self.ocs[switch].new_session().handle(line, now)]

    def connect(self, circuits: dict[str, str], now: float) -> None:
        for switch, channels in circuits.items():
            self.scpi(switch, f":OXC:SWIT:CONN:ADD {channels}", now)

    def forward(self, now: float) -> tuple[bool, str]:
        return self.paths.hop(self.paths.fibre("gpu01", "p0"), self.paths.fibre("gpu02", "p0"), now)


def test_light_crosses_two_switches_only_while_both_hold_their_circuits():
    lab = Lab()
    assert lab.forward(0.0) == (False, "ocs1 holds no circuit from 1")
    lab.connect({"ocs1": FORWARD["ocs1"]}, 0.0)
    lit, why = lab.forward(1.0)
    assert not lit and why == "after ocs1 1->16, trunk ocs1:16->ocs2:8: ocs2 holds no circuit 8->9"
    lab.connect({"ocs2": FORWARD["ocs2"]}, 2.0)
    assert lab.forward(2.0 + MOVE / 2) == (
        False,
        "after ocs1 1->16, trunk ocs1:16->ocs2:8: ocs2 port 8 is moving",
    )
    assert lab.forward(3.0) == (True, "ocs1 1->16, trunk ocs1:16->ocs2:8, ocs2 8->9 (2.50 dB of 20.00 dB)")
    # TCP needs both directions: the path is lit once the way back is switched too.
    assert lab.paths.path("gpu01", "p0", "gpu02", "p0", 3.0)["lit"] is False
    lab.connect(BACKWARD, 3.0)
    assert lab.paths.path("gpu01", "p0", "gpu02", "p0", 4.0)["lit"] is True
    # Removing either switch's circuit darkens it.
    lab.scpi("ocs2", ":OXC:SWIT:CONN:SUB (@8)", 4.0)
    assert lab.forward(5.0) == (False, "after ocs1 1->16, trunk ocs1:16->ocs2:8: ocs2 holds no circuit 8->9")
    lab.connect({"ocs2": FORWARD["ocs2"]}, 5.0)
    assert lab.forward(6.0)[0] is True
    lab.scpi("ocs1", ":OXC:SWIT:CONN:SUB (@1)", 6.0)
    assert lab.forward(7.0) == (False, "ocs1 holds no circuit from 1")
    # A circuit towards another host's receiver is not the path either.
    lab.connect({"ocs1": "(@1),(@10)"}, 7.0)
    assert lab.forward(8.0) == (
        False,
        "ocs1 holds 1->10, which leads to no fibre, not on toward gpu02:p0 on ocs2",
    )


def test_a_failed_trunk_port_darkens_the_path():
    lab = Lab()
    lab.connect(FORWARD, 0.0)
    assert lab.forward(1.0)[0] is True
    lab.ocs["ocs2"].fail_port(8)
    assert lab.forward(1.0) == (False, "after ocs1 1->16, trunk ocs1:16->ocs2:8: ocs2 port 8 is failed")


def test_the_power_monitor_reads_the_light_of_the_whole_path():
    lab = Lab()
    ocs2 = lab.ocs["ocs2"]
    assert ocs2.power_dbm(8, 0.0) == DARK_DBM  # nothing arrives over the trunk yet
    lab.connect(FORWARD, 0.0)
    # 0 dBm launched, ocs1 1.0 dB, trunk 0.5 dB, ocs2 1.0 dB; read over SCPI as a driver does.
    assert lab.scpi("ocs2", ":PMON:POW? (@8,9)", 1.0) == ["-1.50,-2.50"]
    assert lab.scpi("ocs2", ":PMON:POW? (@9)", 0.0 + MOVE / 2) == [f"{DARK_DBM:.2f}"]  # ocs1 still moving
    lab.scpi("ocs1", ":OXC:SWIT:CONN:SUB (@1)", 1.0)
    assert ocs2.power_dbm(9, 2.0) == DARK_DBM


def test_a_ring_of_circuits_through_trunks_reads_dark_instead_of_recursing():
    lab = Lab()
    # ocs1 8 -> 16 -> ocs2 8 -> 16 -> ocs1 8: a closed loop no host transmits into.
    lab.connect({"ocs1": "(@8),(@16)", "ocs2": "(@8),(@16)"}, 0.0)
    assert lab.ocs["ocs1"].power_dbm(16, 1.0) == DARK_DBM
    assert lab.ocs["ocs2"].power_dbm(16, 1.0) == DARK_DBM


def test_a_path_over_the_loss_budget_is_dark():
    lossy = [dict(TRUNKS[0], loss_db=19.0), TRUNKS[1]]
    lab = Lab(trunks=lossy)
    lab.connect(FORWARD, 0.0)
    lit, why = lab.forward(1.0)
    assert not lit
    assert why.endswith(
        "loses 21.00 dB, over the loss budget of 20.00 dB (gpu01:p0 launches 0 dBm, gpu02:p0 receives down to -20 dBm)"
    )
    stronger = [dict(FIBRES[0], launch_power_dbm=1.0), FIBRES[1]]
    lab = Lab(fibres=stronger, trunks=lossy)
    lab.connect(FORWARD, 0.0)
    assert lab.forward(1.0)[0] is True


def test_a_chip_output_into_a_trunk_reaches_an_ocs():
    # An ideal 4x4 chip: with no drive it carries input 4 to output 8, which is a trunk into ocs1 ingress 8.
    chip = MeshChip(
        MeshSpec(
            "chip",
            size=4,
            settling_time_us=0,
            crosstalk=0,
            alpha_spread=0,
            phi0_spread_rad=0,
            resistance_spread=0,
            input_power_dbm={4: 0.0},
        )
    )
    ocs1 = PolatisEngine(ocs_spec("ocs1"), clock=lambda: 0.0)
    devices = {
        "chip": SimpleNamespace(kind="photonic_mesh", chip=chip),
        "ocs1": SimpleNamespace(kind="ocs", engine=ocs1),
    }
    fibres = [
        {"host": "gpu04", "port": "p2", "switch": "chip", "ingress": 4, "egress": 8},
        {"host": "gpu01", "port": "p0", "switch": "ocs1", "ingress": 1, "egress": 9},
    ]
    trunks = [{"from": "chip", "egress": 8, "to": "ocs1", "ingress": 8, "loss_db": 0.5}]
    paths = LightPaths(fibres, devices, trunks=trunks)
    couple_trunk_light(paths.trunks, devices)
    src, dst = paths.fibre("gpu04", "p2"), paths.fibre("gpu01", "p0")
    carried = float(abs(chip.transfer(0.0)[3, 3]) ** 2)  # 4 cells of 0.1 dB: about 0.91
    crossed = f"chip 4->8 carries {carried:.2f}, trunk chip:8->ocs1:8"
    assert paths.hop(src, dst, 0.0) == (False, f"after {crossed}: ocs1 holds no circuit 8->9")
    ocs1.new_session().handle(":OXC:SWIT:CONN:ADD (@8),(@9)", 0.0)
    lit, why = paths.hop(src, dst, 1.0)
    loss = -10 * math.log10(carried) + 0.5 + 1.0
    assert lit and why == f"{crossed}, ocs1 8->9 ({loss:.2f} dB of 20.00 dB)"
    assert ocs1.power_dbm(9, 1.0) == pytest.approx(-loss)  # the chip's light, less every loss on the way


# --- the same cabling in a twin process: relays across two switches --------------------------------------


@pytest.fixture(scope="module")
def twin() -> Iterator[TwinProcess]:
    spec = TwinSpec([ocs_spec("ocs1"), ocs_spec("ocs2")], fibres=FIBRES, trunks=TRUNKS)
    assert TwinSpec.from_json(spec.to_json()).trunks == TRUNKS
    with TwinProcess(spec) as tw:
        yield tw


@pytest.fixture
def ctl(twin: TwinProcess) -> Iterator[TwinControl]:
    control = twin.control
    for device in (None, "ocs1", "ocs2"):
        control.call(device, "dataplane.reset" if device is None else "reset")
    yield control


def scpi(twin: TwinProcess, device: str, line: str) -> str:
    """One line sent to the switch over its TCP endpoint, ending in a query; its answer."""
    return ask(twin.endpoints.devices[device]["tcp"], line)[0]


def test_a_connection_crosses_two_switches_and_is_cut_when_either_circuit_goes(twin, ctl, rank):
    relay = ctl.call(
        None,
        "dataplane.link",
        src_host="gpu01",
        src_port="p0",
        dst_host="gpu02",
        dst_port="p0",
        target_port=rank.port,
    )
    assert refused(relay)
    for device in ("ocs1", "ocs2"):
        assert (
            scpi(twin, device, f":OXC:SWIT:CONN:ADD {FORWARD[device]};:OXC:SWIT:CONN:ADD {BACKWARD[device]};*OPC?")
            == "1"
        )
    assert ctl.call(None, "dataplane.state")["trunks"] == TRUNKS
    assert scpi(twin, "ocs2", ":PMON:POW? (@9)") == "-2.50"  # light from gpu01 through both switches
    for removed in ("ocs1", "ocs2"):
        client = socket.create_connection(address(relay), timeout=5)
        server = rank.accept()
        with client, server:
            client.sendall(b"across")
            assert recv_exact(server, 6) == b"across"
            server.sendall(b"back")
            assert recv_exact(client, 4) == b"back"
            # One switch's circuit from ingress 1 goes: ocs1's carries gpu01 -> gpu02, ocs2's the way back.
            assert scpi(twin, removed, ":OXC:SWIT:CONN:SUB (@1);*OPC?") == "1"
            wait_reset(client)
        path = ctl.call(None, "dataplane.path", src_host="gpu01", src_port="p0", dst_host="gpu02", dst_port="p0")
        assert path["lit"] is False
        assert refused(relay)
        assert scpi(twin, removed, ":OXC:SWIT:CONN:ADD (@1),(@16);*OPC?") == "1"
    assert ctl.call(None, "dataplane.state")["totals"]["cut"] == 2


@pytest.mark.parametrize(
    "trunks, message",
    [
        ({"from": "ocs1"}, "trunks must be a list"),
        ([{"from": "ocs1", "egress": 16, "to": "ocs2"}], "needs from, egress, to, ingress"),
        ([TRUNKS[0], dict(TRUNKS[0], ingress=7)], "ocs1 egress 16 carries two trunks"),
        ([TRUNKS[0], dict(TRUNKS[0], egress=15)], "ocs2 ingress 8 receives two trunks"),
        ([dict(TRUNKS[0], loss_db=-1)], "loss_db must be >= 0"),
    ],
)
def test_the_twin_checks_its_trunk_list(trunks, message):
    with pytest.raises(ValueError, match=message):
        parse_trunks(trunks)


def test_twin_spec_carries_the_trunks():
    assert "trunks" not in TwinSpec([ocs_spec("ocs1")]).to_json()  # unchanged twin input without trunks
    with pytest.raises(ValueError, match="trunks must be a list of objects"):
        TwinSpec.from_json('{"devices": [], "trunks": {"from": "ocs1"}}')
