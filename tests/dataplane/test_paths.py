"""Light paths in-process: the photonic chip as a switch, and the fibre map's validation."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from emulators.dataplane import LightPaths, parse_fibres
from emulators.mesh.chip import MeshChip
from emulators.mesh.spec import MeshSpec
from testbed.documents import load_inventory
from testbed.twin.bridge import twin_spec

# An ideal 4x4 chip: no fabrication spread, no crosstalk, instant heaters. With no drive every cell is
# in CROSS, which carries input 4 to output 8 only; a heater at P_pi (30 mW) puts its cell in BAR.
IDEAL = MeshSpec(
    "chip", size=4, settling_time_us=0, crosstalk=0, alpha_spread=0, phi0_spread_rad=0, resistance_spread=0
)
FIBRES = [{"host": f"gpu0{n}", "port": "p0", "switch": "chip", "ingress": n, "egress": 4 + n} for n in (1, 2, 3, 4)]
I_PI_MA = math.sqrt(30.0)  # P = I^2 R: 30 mW in 1 kOhm


def paths() -> tuple[LightPaths, MeshChip]:
    chip = MeshChip(IDEAL)
    return LightPaths(FIBRES, {"chip": SimpleNamespace(kind="photonic_mesh", chip=chip)}), chip


def test_chip_paths_follow_the_transfer_matrix():
    lp, chip = paths()
    # gpu04 -> gpu04 (input 4 -> output 8) is the only path at zero drive.
    assert lp.hop(lp.fibre("gpu04", "p0"), lp.fibre("gpu04", "p0"), 0.0)[0] is True
    assert lp.path("gpu01", "p0", "gpu01", "p0", 0.0)["lit"] is False
    # Route input 1 -> output 5: splitter tree 0 nodes 1, 2 (heaters 0, 1) and combiner tree 0 nodes
    # 1, 2 (heaters 12, 13) in BAR.
    for heater in (0, 1, 12, 13):
        chip.set_drive(heater, "I", I_PI_MA, 0.0)
    lit, why = lp.hop(lp.fibre("gpu01", "p0"), lp.fibre("gpu01", "p0"), 1.0)
    assert lit is True and "chip 1->5 carries 0.9" in why
    # A half-set cell splits the light: below the threshold, no path.
    chip.set_drive(13, "I", math.sqrt(15.0), 2.0)
    lit, why = lp.hop(lp.fibre("gpu01", "p0"), lp.fibre("gpu01", "p0"), 3.0)
    assert lit is False and "of input 1 to output 5 (< 0.5)" in why
    # Another host's output is not this host's path.
    assert lp.hop(lp.fibre("gpu01", "p0"), lp.fibre("gpu02", "p0"), 3.0)[0] is False


def test_a_switch_missing_from_the_twin_is_dark():
    lp = LightPaths(FIBRES, {})
    assert lp.path("gpu01", "p0", "gpu02", "p0", 0.0)["forward"]["why"] == "switch 'chip' is not emulated in this twin"


@pytest.mark.parametrize(
    "fibres, message",
    [
        ({"host": "a"}, "must be a list"),
        ([{"host": "a", "port": "p0", "switch": "s", "ingress": 1}], "needs host, port, switch, ingress, egress"),
        ([{"host": "a", "port": "p0", "switch": "s", "ingress": 0, "egress": 9}], "port number"),
        ([FIBRES[0], FIBRES[0]], "gpu01:p0 is cabled twice"),
    ],
)
def test_fibre_map_is_validated(fibres, message):
    with pytest.raises(ValueError, match=message):
        parse_fibres(fibres)


def test_twin_spec_carries_the_inventory_fibre_map(repo):
    inv = load_inventory(repo / "playbooks/inventory/emulated-rack.yaml").model
    spec = twin_spec(inv, seed=1)
    assert len(spec.fibres) == len(inv.fibres) > 0
    first = inv.fibres[0]
    assert spec.fibres[0] == {
        "host": first.host,
        "port": first.port,
        "switch": first.switch,
        "ingress": first.ingress,
        "egress": first.egress,
        "launch_power_dbm": first.launch_power_dbm,
        "rx_sensitivity_dbm": first.rx_sensitivity_dbm,
    }
    parse_fibres(spec.fibres)  # the twin accepts it
