"""`visa_library` on the VISA transport: read at the boundary (file:line and key, what to write instead), one
ResourceManager per library, an emulated run always on pyvisa-py, and a library that cannot be opened said
plainly (docs/protocols.md §6.1).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from peers import require_peer

from drivers.errors import DeviceConnectionError
from drivers.transports import TransportSettings, open_transport
from drivers.transports.visa import resource_manager
from drivers.transports.visa_library import BACKENDS, VisaLibrary, parse_visa_library
from testbed.config.transports import VisaTransport
from testbed.contracts.errors import UserError
from testbed.documents import load_inventory
from testbed.twin.bridge import assert_loopback, point_at_twin

REPO = Path(__file__).resolve().parents[2]
SIM_FILE = "drivers/scpi/polatis-sim.yaml"
SIM_SOCKET = "TCPIP0::polatis-sim::5025::SOCKET"


# -- the text --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "backend", "argument", "normal"),
    [
        ("@py", "py", "", "@py"),
        (" @PY ", "py", "", "@py"),
        ("@ivi", "ivi", "", "@ivi"),
        ("/usr/lib/x86_64-linux-gnu/libvisa.so.0", "ivi", "/usr/lib/x86_64-linux-gnu/libvisa.so.0", None),
        ("C:\\Windows\\System32\\visa64.dll@ivi", "ivi", "C:\\Windows\\System32\\visa64.dll", None),
        ("sims/polatis@lab.yaml@sim", "sim", "sims/polatis@lab.yaml", None),
    ],
)
def test_the_forms_pyvisa_takes(text, backend, argument, normal):
    library = parse_visa_library(text)
    assert (library.backend, library.argument) == (backend, argument)
    assert str(library) == (normal or f"{argument}@{backend}")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("@nope", "unknown VISA backend '@nope'"),
        ("@sim", "pyvisa-sim needs the definition file"),
        ("x@py", "pyvisa-py takes no path"),
        ("", "is empty"),
        ("@py\n", None),  # surrounding whitespace is dropped, not refused
        ("a\x00b@ivi", "control character"),
    ],
)
def test_what_is_refused_says_what_to_write(text, says):
    if says is None:
        assert str(parse_visa_library(text)) == "@py"
        return
    with pytest.raises(ValueError, match=says) as caught:
        parse_visa_library(text)
    assert "'@py'" in str(caught.value) or "'drivers/scpi/polatis-sim.yaml@sim'" in str(caught.value)


@given(st.one_of(st.text(max_size=60), st.sampled_from(["@py", "@ivi", "@sim", "a@sim", "@", "@@", " @ivi "])))
def test_any_text_is_a_library_or_a_value_error(text):
    try:
        library = parse_visa_library(text)
    except ValueError as exc:
        assert str(exc)  # says something; never another exception type (a traceback for a typo)
        return
    assert library.backend in BACKENDS
    assert parse_visa_library(str(library)) == library  # what the inventory keeps reads back the same


def test_a_non_string_is_refused():
    with pytest.raises(ValueError, match="expected a string"):
        parse_visa_library(5)


# -- the inventory ---------------------------------------------------------------------------------


def _validate(tmp_path, transport: str) -> subprocess.CompletedProcess:
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(
        "name: lab\ndevices:\n  ocs1:\n    kind: ocs\n    driver: polatis-scpi\n    size: 16\n"
        f"    transport:\n      type: visa\n{transport}"
    )
    return subprocess.run(
        [sys.executable, "-m", "testbed", "validate", str(inventory)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        (f'      resource: "{SIM_SOCKET}"\n      visa_library: "@gpib"\n', "unknown VISA backend '@gpib'"),
        (
            f'      resource: "{SIM_SOCKET}"\n      visa_library: "no/such.yaml@sim"\n',
            "the pyvisa-sim definition file no/such.yaml does not exist",
        ),
        (
            f'      resource: "TCPIP0::10.0.0.5::5025::SOCKET"\n      visa_library: "{SIM_FILE}@sim"\n',
            f"resource 'TCPIP0::10.0.0.5::5025::SOCKET' is not defined in the pyvisa-sim file {SIM_FILE} "
            f"(it defines {SIM_SOCKET}, ASRL1::INSTR); set resource to one of them",
        ),
    ],
)
def test_the_inventory_names_the_line_the_key_and_the_fix(tmp_path, lines, says):
    proc = _validate(tmp_path, lines)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert f"{tmp_path / 'inv.yaml'}:10: devices.ocs1.transport.visa_library: " in out
    assert says in out


def test_the_shipped_definition_validates_and_shows_in_the_address(tmp_path):
    proc = _validate(tmp_path, f'      resource: "{SIM_SOCKET}"\n      visa_library: "{SIM_FILE}@sim"\n')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    model = VisaTransport(type="visa", resource="GPIB0::5::INSTR", visa_library="@IVI")
    assert model.visa_library == "@ivi"
    assert model.address() == "GPIB0::5::INSTR via @ivi"  # the plan says which library a run would use
    assert model.settings().visa_library == "@ivi"
    assert VisaTransport(type="visa", resource=SIM_SOCKET).address() == SIM_SOCKET  # the default says nothing


def test_an_emulated_run_uses_pyvisa_py_whatever_the_lab_uses(tmp_path):
    """--emulate points every transport at the twin: the vendor's VISA and pyvisa-sim are left behind, and a
    transport that kept either is refused by the loopback guard.
    """
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(
        "name: lab\ndevices:\n"
        "  ocs1: {kind: ocs, driver: polatis-scpi, size: 16,"
        ' transport: {type: visa, resource: "GPIB0::5::INSTR", visa_library: "@ivi"}}\n'
        "  ocs2: {kind: ocs, driver: polatis-scpi, size: 16,"
        f' transport: {{type: visa, resource: "{SIM_SOCKET}", visa_library: "{REPO / SIM_FILE}@sim"}}}}\n'
    )
    lab = load_inventory(inventory).model
    twin_endpoints = {
        name: {"kind": "ocs", "visa": f"TCPIP0::127.0.0.1::{port}::SOCKET", "serial": f"/dev/pts/{port}"}
        for name, port in (("ocs1", 4001), ("ocs2", 4002))
    }
    twin = point_at_twin(lab, {"devices": twin_endpoints})
    for name in ("ocs1", "ocs2"):
        transport = twin.devices[name].transport
        assert transport.visa_library == "@py" and transport.settings().visa_library == "@py"
    assert_loopback(twin, ["ocs1", "ocs2"])
    on_ivi = twin.model_copy(
        update={
            "devices": {
                **twin.devices,
                "ocs1": twin.devices["ocs1"].model_copy(
                    update={"transport": twin.devices["ocs1"].transport.model_copy(update={"visa_library": "@ivi"})}
                ),
            }
        }
    )
    with pytest.raises(UserError, match=r"ocs1 -> ASRL/dev/pts/4001::INSTR via @ivi"):
        assert_loopback(on_ivi, ["ocs1", "ocs2"])


# -- opening ---------------------------------------------------------------------------------------


def test_one_resource_manager_per_library_however_the_file_is_named(monkeypatch):
    require_peer("pyvisa_sim", "pyvisa-sim is the independent SCPI peer of the Polatis driver (docs/interop.md)")
    monkeypatch.chdir(REPO)
    relative = resource_manager(parse_visa_library(f"{SIM_FILE}@sim"))
    absolute = resource_manager(parse_visa_library(f"{REPO / SIM_FILE}@sim"))
    assert relative is absolute
    assert resource_manager(parse_visa_library("@py")) is not relative


def _open_error(settings: TransportSettings) -> DeviceConnectionError:
    transport = open_transport(settings, "ocs-x")
    with pytest.raises(DeviceConnectionError) as caught:
        transport.query("*IDN?")
    err = caught.value
    assert err.device == "ocs-x" and err.address == settings.address and err.sent == "*IDN?"
    assert "cannot open the VISA resource, nothing was sent" in str(err)
    assert "Traceback" not in str(err) and "\\n" not in str(err)
    return err


def test_no_vendor_visa_says_what_to_install_or_use_instead():
    from pyvisa.ctwrapper import IVIVisaLibrary

    if IVIVisaLibrary.get_library_paths():
        pytest.skip("this machine has a vendor VISA library: opening @ivi would not fail")
    err = _open_error(TransportSettings("visa", "GPIB0::5::INSTR", 0.2, visa_library="@ivi"))
    assert "VISA library @ivi: Could not open VISA library: pyvisa found none on this machine" in str(err)
    assert "NI-VISA" in err.hint and "visa_library: '@py'" in err.hint


def test_a_definition_pyvisa_sim_cannot_load_is_one_line_not_its_traceback(tmp_path):
    require_peer("pyvisa_sim", "pyvisa-sim is the independent SCPI peer of the Polatis driver (docs/interop.md)")
    broken = tmp_path / "broken.yaml"
    broken.write_text('spec: "1.1"\ndevices: {}\nresources:\n  ASRL1::INSTR:\n    device: no-such-device\n')
    err = _open_error(TransportSettings("visa", "ASRL1::INSTR", 0.2, visa_library=f"{broken}@sim"))
    assert f"VISA library {broken}@sim" in str(err)
    assert "broken.yaml@sim: KeyError: 'no-such-device'\n" in str(err)  # pyvisa-sim's last word, not its traceback
    assert f"pyvisa-sim cannot load {broken}" in err.hint and "docs/protocols.md" in err.hint


def test_a_missing_definition_and_an_undefined_resource_are_named(tmp_path):
    require_peer("pyvisa_sim", "pyvisa-sim is the independent SCPI peer of the Polatis driver (docs/interop.md)")
    gone = tmp_path / "gone.yaml"
    err = _open_error(TransportSettings("visa", SIM_SOCKET, 0.2, visa_library=f"{gone}@sim"))
    assert f"the pyvisa-sim definition file {gone} does not exist" in str(err)
    # pyvisa-sim itself "opens" a resource its file does not define (session 0, every read empty): refused here
    err = _open_error(TransportSettings("visa", "ASRL7::INSTR", 0.2, visa_library=f"{REPO / SIM_FILE}@sim"))
    assert "ASRL7::INSTR is not defined in" in str(err)
    assert f"defines {SIM_SOCKET}, ASRL1::INSTR, not ASRL7::INSTR; set resource to one of them" in err.hint


def test_pyvisa_py_stays_the_default(tmp_path):
    assert TransportSettings("visa", SIM_SOCKET).visa_library == "@py"
    assert VisaLibrary("py", "").spec == "@py"
    assert os.path.isabs(parse_visa_library(f"{SIM_FILE}@sim").spec.removesuffix("@sim"))
