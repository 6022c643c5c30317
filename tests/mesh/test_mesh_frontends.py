"""The unmodified qontrol library and a plain pyvisa client drive the emulated chip."""

from __future__ import annotations

import pytest
import pyvisa
import qontrol


def test_qontrol_library_initialises_and_sets_channels(mesh_device):
    dev, ep, lt = mesh_device(size=4)
    errors = []
    q = qontrol.QXOutput(serial_port_name=ep["qontrol"], response_timeout=0.5, log_handler=errors.append)
    try:
        assert q.device_id == "Q8iv-0A1B"
        assert q.n_chs == dev.chip.heaters == 24  # 3 daisy-chained Q8iv modules (nupall?)
        assert len(q.chain) == 3
        assert (q.v_full, q.i_full) == (12.0, 24.0)
        q.v[3] = 4.5
        assert q.v[3] == pytest.approx(4.5)
        assert lt.call(dev.chip.voltage, 3) == pytest.approx(4.5)
        q.i[2] = 5.0
        assert q.i[2] == pytest.approx(5.0)
        assert lt.call(dev.chip.current_ma, 2) == pytest.approx(5.0)
        volts = q.get_all_values("V")
        assert len(volts) == 24 and volts[3] == pytest.approx(4.5)
        q.set_value(1, "V", 13.0)  # above vfull: the module answers an error line, not OK
        assert any(e.get("type") == "err" and e.get("id") == 1 and e.get("ch") == 1 for e in errors)
    finally:
        q.close()


def test_pyvisa_client_drives_the_scpi_source(mesh_device):
    dev, ep, lt = mesh_device(size=4)
    rm = pyvisa.ResourceManager("@py")
    inst = rm.open_resource(ep["visa"], read_termination="\n", write_termination="\n", timeout=2000)
    try:
        assert inst.query("*IDN?").startswith("Testbed,MZI-MESH")
        assert inst.query(":MESH:SIZE?") == "4,4"
        assert int(inst.query("SOUR:CHAN:COUN?")) == 24
        inst.write("SOUR3:CURR 0.005")
        assert float(inst.query("SOURce3:CURRent?")) == pytest.approx(0.005)
        assert inst.query("*OPC?") == "1"
        volts = float(inst.query("MEAS:VOLT? (@3)"))
        assert volts == pytest.approx(0.005 * lt.call(lambda: dev.chip.resistance[2]), rel=1e-4)
        powers = [float(x) for x in inst.query("MEAS:POW? (@1:8)").split(",")]
        assert powers[:4] == [0.0] * 4  # inputs read the transceivers' 0 dBm
        total_mw = sum(10 ** (p / 10) for p in powers[4:])
        assert 0.5 < total_mw < 4.0  # light is conserved up to loss and dumped ports
        assert inst.query("SYST:ERR?") == '0,"No error"'
        inst.write("SOUR99:CURR 0.001")
        assert inst.query("SYST:ERR?").startswith("-114")
        inst.write("SOUR1:CURR 1")
        assert inst.query("SYST:ERR?").startswith("-222")
    finally:
        inst.close()
