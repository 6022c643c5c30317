"""The mistakes a lab makes with a BMC, and what it is told: a wrong password, a certificate that does not
verify, the password variable not set, an inventory entry that cannot work. Each message names the host, the
BMC's address and what to change; none shows the password; a refused call changes nothing on the host.
"""

from __future__ import annotations

import textwrap

import pytest
from bmc_twin import bmc_settings, endpoints

from drivers.errors import DeviceCommandError, DeviceConnectionError
from drivers.redfish import RedfishBmc
from emulators.redfish.server import self_signed_certificate
from testbed.contracts.errors import UserError
from testbed.documents import load_inventory
from testbed.families.gpu_host import BmcConfig

WRONG = "n0t-the-bmc-password"


def test_a_wrong_password_names_host_address_user_and_variable(twin, ctl):
    ep = endpoints(twin)
    audit = []
    bmc = RedfishBmc(bmc_settings(ep, password=WRONG), "gpu01", audit.append)
    with pytest.raises(DeviceCommandError) as err:
        bmc.power_off()
    text = str(err.value)
    assert text.startswith(f"gpu01 ({ep['redfish']}): the BMC refused the login of user 'admin'")
    assert "HTTP 401" in text and "$LAB_BMC_PASSWORD" in text and "bmc.user" in text
    assert WRONG not in text and all(WRONG not in r.data for r in audit)
    assert ctl.call("gpu01", "state")["powered"] is True


def test_a_certificate_that_does_not_verify_is_refused_never_ignored(twin, ctl, tmp_path):
    ep = endpoints(twin)
    other_ca, _ = self_signed_certificate(tmp_path)  # a CA that did not sign the BMC's certificate
    for settings, against in (
        (bmc_settings(ep, ca_file=str(other_ca)), f"bmc.ca_file {other_ca}"),
        (bmc_settings(ep, ca_file=None), "the default CA bundle"),  # no CA file: verified all the same
    ):
        with pytest.raises(DeviceConnectionError) as err:
            RedfishBmc(settings, "gpu01").power_off()
        text = str(err.value)
        assert text.startswith(f"gpu01 ({ep['redfish']}): the BMC's TLS certificate did not verify against {against}")
        assert "CERTIFICATE_VERIFY_FAILED" in text and "set bmc.ca_file" in text
    assert ctl.call("gpu01", "state")["powered"] is True


def test_a_missing_ca_file_and_an_unreachable_bmc_say_what_to_check(twin, tmp_path):
    ep = endpoints(twin)
    with pytest.raises(DeviceConnectionError, match=r"CA file \(bmc.ca_file\) .*nope.pem does not exist"):
        RedfishBmc(bmc_settings(ep, ca_file=str(tmp_path / "nope.pem")), "gpu01").power_state()
    with pytest.raises(DeviceConnectionError) as err:
        RedfishBmc(bmc_settings(ep, address="https://127.0.0.1:1"), "gpu01").power_state()
    assert "could not reach the BMC" in str(err.value) and "Connection refused" in str(err.value)
    assert "check bmc.address" in str(err.value)


def test_an_unset_password_variable_names_host_variable_and_what_to_set(monkeypatch):
    monkeypatch.delenv("LAB_BMC_PASSWORD", raising=False)
    bmc = BmcConfig(address="10.0.0.21", user="admin", password_env="LAB_BMC_PASSWORD")
    assert bmc.address == "https://10.0.0.21"
    with pytest.raises(UserError) as err:
        bmc.call_args("gpu07")
    text = str(err.value)
    assert text.startswith("gpu07: the password of its BMC (admin@https://10.0.0.21)")
    assert "LAB_BMC_PASSWORD, which is not set; export LAB_BMC_PASSWORD=..." in text
    monkeypatch.setenv("LAB_BMC_PASSWORD", "from-the-environment")
    assert bmc.call_args("gpu07")["password"] == "from-the-environment"


def test_inventory_mistakes_in_bmc_are_reported_at_their_line(tmp_path):
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(
        textwrap.dedent(
            """\
            name: lab
            devices:
              gpu01:
                kind: gpu_host
                driver: ssh
                transport: {type: ssh, host: 10.0.0.11, user: lab}
                bmc:
                  address: http://10.0.0.21
                  user: admin
                  password_env: LAB_BMC_PASSWORD
              gpu02:
                kind: gpu_host
                driver: ssh
                transport: {type: ssh, host: 10.0.0.12, user: lab}
                bmc: {address: "https://10.0.0.22:70000", user: admin, password_env: "LAB BMC", passwrod: x}
            """
        )
    )
    with pytest.raises(Exception) as err:
        load_inventory(str(inventory))
    text = str(err.value)
    assert f"{inventory}:8: devices.gpu01.bmc.address: 'http://10.0.0.21': a BMC is reached over https" in text
    assert f"{inventory}:15: devices.gpu02.bmc.address" in text and "port" in text
    assert f"{inventory}:15: devices.gpu02.bmc.password_env" in text
    assert f"{inventory}:15: devices.gpu02.bmc.passwrod: unknown key" in text


def test_a_password_in_the_inventory_is_refused(tmp_path):
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(
        "name: lab\ndevices:\n  gpu01:\n    kind: gpu_host\n    driver: ssh\n"
        "    transport: {type: ssh, host: 10.0.0.11, user: lab}\n"
        "    bmc: {address: 10.0.0.21, user: admin, password: hunter2, password_env: P}\n"
    )
    with pytest.raises(Exception, match=r"lab.yaml:7: devices.gpu01.bmc.password: secrets are not accepted"):
        load_inventory(str(inventory))
