"""Calibrate through the real drivers over the real endpoints, then route permutations (N=8)."""

from __future__ import annotations

import numpy as np
import pytest

from drivers.capabilities import PhotonicMesh
from drivers.errors import DeviceCommandError
from drivers.mesh import NotCalibrated, layout
from drivers.mesh.calibration import Calibration
from drivers.transports import TransportSettings
from testbed.families import PROCEDURES
from testbed.families.context import ProcedureContext
from testbed.families.drivers import make_driver


def routed_fraction(lt, dev, perm):
    """Per input: share of its light leaving the chip that reaches its target (ground truth)."""
    t = np.array(lt.call(dev.chip.transfer_power))
    n = len(perm)
    return t[perm, range(n)] / t.sum(axis=0), t


def qontrol_driver(ep):
    settings = TransportSettings(type="serial", address=ep["qontrol"], baudrate=115200, timeout_s=2.0)
    return make_driver("qontrol-mesh", "chip1", settings)


def scpi_driver(ep):
    return make_driver("scpi-mesh", "chip1", TransportSettings(type="visa", address=ep["visa"], timeout_s=2.0))


def test_calibrate_and_route_over_qontrol_then_scpi(mesh_device, tmp_path):
    dev, ep, lt = mesh_device(size=8, seed=11)
    mesh = qontrol_driver(ep)
    assert isinstance(mesh, PhotonicMesh)
    assert mesh.size() == (8, 8) and mesh.heater_count() == 112
    with pytest.raises(NotCalibrated, match="mesh.calibrate"):
        mesh.program(list(range(8)))
    ctx = ProcedureContext(device="chip1", address=ep["qontrol"])
    path = tmp_path / "chip1.json"
    out = PROCEDURES["mesh.calibrate"](mesh, ctx, path=str(path), points=20)
    assert out["uncalibrated"] == [] and path.exists()
    cal = Calibration.load(path)
    assert 0.01 < cal.crosstalk < 0.03  # the chip's 0.02 +- spread
    p_pi = np.array([h.p_pi_mw for h in cal.heaters])
    assert np.all(np.abs(p_pi / 30.0 - 1) < 0.08)  # nominal 30 mW +- 5 % spread

    rng = np.random.default_rng(5)
    for _ in range(4):
        perm = [int(x) for x in rng.permutation(8)]
        states = mesh.program(perm)
        assert layout.decode(states, 8) == perm
        frac, _ = routed_fraction(lt, dev, perm)
        assert frac.min() >= 0.99
        assert mesh.circuits() == {i + 1: 9 + o for i, o in enumerate(perm)}
        dbm = mesh.output_power()
        assert min(dbm.values()) > -3.0  # 6 cells x 0.1 dB, nothing lost to a wrong port

    # The SCPI front end of the same chip, driven with the same calibration file.
    other = scpi_driver(ep)
    other.load_calibration(path)
    perm = [int(x) for x in rng.permutation(8)]
    other.program(perm)
    frac, _ = routed_fraction(lt, dev, perm)
    assert frac.min() >= 0.99
    assert other.circuits() == {i + 1: 9 + o for i, o in enumerate(perm)}
    with pytest.raises(DeviceCommandError, match="12 V"):
        other.set_drive(0, 50.0)  # 50 mA: beyond the source's limit
        other.check_errors()


def test_reconfigure_procedure_like_a_switch(mesh_device, tmp_path):
    dev, ep, lt = mesh_device(size=8, seed=3)
    mesh = scpi_driver(ep)
    ctx = ProcedureContext(device="chip1", address=ep["visa"])
    ident = PROCEDURES["mesh.identify"](mesh, ctx, expected_size=8)
    assert ident["size"] == [8, 8] and ident["heaters"] == 112
    PROCEDURES["mesh.calibrate"](mesh, ctx, path=str(tmp_path / "c.json"), points=20)
    circuits = [(1, 12), (2, 9), (3, 16)]
    out = PROCEDURES["mesh.reconfigure"](mesh, ctx, circuits=circuits, managed=list(range(1, 17)))
    assert out["added"] == 3 and out["min_power_dbm"] > -3.0
    assert {"sent", "acked", "lit"} <= set(ctx.marks)
    held = mesh.circuits()
    assert all(held[i] == e for i, e in circuits)
    # a second change keeps the circuits on unmanaged ports
    out = PROCEDURES["mesh.reconfigure"](mesh, ctx, circuits=[(4, 9)], managed=[2, 4, 9])
    held = mesh.circuits()
    assert held[4] == 9 and held[1] == 12 and held[3] == 16
    assert held[2] != 9 and out["removed"] >= 1  # 2->9 gave way; 4's don't-care circuit counts too
    # drift that calibration does not know about -> the light check fails with a typed error
    lt.call(dev.chip.set_input_power, 4, -40.0)
    from testbed.families.verify import VerificationError

    with pytest.raises(VerificationError, match="no light"):
        PROCEDURES["mesh.reconfigure"](mesh, ctx, circuits=[(4, 10)], managed=[4, 10], timeout_s=0.05)
