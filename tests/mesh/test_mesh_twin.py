"""Inventory -> twin spec -> adapter for a photonic_mesh, and pointing the inventory at its endpoints."""

from __future__ import annotations

from pathlib import Path

from emulators.mesh.spec import MeshSpec
from emulators.spec import TwinSpec
from testbed.documents import load_inventory
from testbed.twin.bridge import point_at_twin, twin_spec

INVENTORY = Path(__file__).resolve().parents[2] / "playbooks" / "inventory" / "emulated-rack.yaml"


def test_twin_spec_has_the_chip_and_round_trips():
    inv = load_inventory(INVENTORY).model
    spec = twin_spec(inv, seed=1, only={"chip1"})
    (chip,) = spec.devices
    assert isinstance(chip, MeshSpec) and chip.size == 8 and chip.drive == "current"
    again = TwinSpec.from_json(spec.to_json())
    assert again.devices[0] == chip


def test_point_at_twin_uses_the_qontrol_pty_for_a_serial_chip():
    inv = load_inventory(INVENTORY).model
    ep = {
        "devices": {
            "chip1": {
                "kind": "photonic_mesh",
                "qontrol": "/dev/pts/42",
                "visa": "TCPIP0::127.0.0.1::5555::SOCKET",
                "tcp": "127.0.0.1:5555",
            }
        }
    }
    assert point_at_twin(inv, ep).devices["chip1"].transport.port == "/dev/pts/42"
    ep["devices"]["chip1"]["serial"] = "/dev/pts/42"  # the adapter also lists its pty as "serial"
    visa = inv.devices["chip1"].model_copy(update={"transport": inv.devices["ocs1"].transport})
    inv = inv.model_copy(update={"devices": {**inv.devices, "chip1": visa}})
    assert point_at_twin(inv, ep).devices["chip1"].transport.resource == "TCPIP0::127.0.0.1::5555::SOCKET"
