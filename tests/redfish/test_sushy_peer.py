"""The BMC driver against a Redfish service we did not write, OpenStack's sushy-emulator (PyPI sushy-tools,
unmodified, started as its own process: tests/redfish/sushy_peer.py), and against the twin's BMC, with one test
body: read a system's PowerState, power it off, power it on, read it back. sushy-emulator has no SessionService
(the driver logs in with HTTP Basic over TLS) and serves a CA-issued certificate (verified against the CA, or
pinned); the twin's BMC has one (a session login) and serves its own self-signed certificate. Where the two
peers differ, docs/protocols.md §9.6 says how.

And the other way round: sushy, OpenStack's Redfish client library (what Ironic drives BMCs with), unmodified,
against the twin's BMC.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
from bmc_twin import bmc_settings, endpoints
from peers import require_peer

from drivers.errors import DeviceCommandError
from drivers.redfish import RedfishBmc, RedfishSettings
from emulators.frontends import TWIN_PASSWORD

SUSHY_WHY = "the Redfish peer test runs the driver against OpenStack's sushy-emulator (pip install sushy-tools)"


@pytest.fixture(scope="module")
def sushy(tmp_path_factory) -> Iterator:
    require_peer("sushy_tools", SUSHY_WHY)
    import sushy_peer

    emulator = sushy_peer.start(tmp_path_factory.mktemp("sushy"))
    yield emulator
    emulator.stop()


def sushy_settings(emulator, **changes) -> RedfishSettings:
    import sushy_peer

    base = {
        "address": emulator.url,
        "user": sushy_peer.USER,
        "password": sushy_peer.PASSWORD,
        "password_env": "LAB_BMC_PASSWORD",
        "ca_file": str(emulator.tls.ca),
        "timeout_s": 10.0,
        "power_wait_s": 30.0,  # its fake driver applies a reset 1 to 11 s after accepting it
    }
    return RedfishSettings(**{**base, **changes})


@pytest.fixture(params=["sushy-emulator", "twin"])
def peer(request) -> tuple[str, RedfishSettings, str]:
    """(name, the driver's settings for it, the login its service root calls for)."""
    if request.param == "sushy-emulator":
        return request.param, sushy_settings(request.getfixturevalue("sushy")), "basic"
    request.getfixturevalue("ctl")  # the twin's hosts reset (powered on) before and after
    return request.param, bmc_settings(endpoints(request.getfixturevalue("twin"))), "session"


def test_the_driver_reads_powers_off_powers_on_and_reads_back_on_both_peers(peer):
    name, settings, login = peer
    audit = []
    with RedfishBmc(settings, "gpu01", audit.append) as bmc:
        assert bmc.power_state() == "On"
        assert bmc.auth == login  # decided from the service root: a SessionService link or none
        off = bmc.power_off()
        assert off["changed"] and off["reset"] == "ForceOff" and off["power_state"] == "Off"
        assert bmc.power_state() == "Off"
        again = bmc.power_off()  # already off: nothing is sent
        assert again["changed"] is False and again["reset"] is None
        on = bmc.power_on()
        assert on["changed"] and on["reset"] == "On" and on["power_state"] == "On"
        assert bmc.power_state() == "On"
    text = "\n".join(r.data for r in audit)
    assert '{"ResetType": "ForceOff"}' in text and '{"ResetType": "On"}' in text
    assert settings.password not in text.replace("(testbed twin)", "")  # the twin's password is "twin"
    if login == "basic":
        assert "HTTP Basic as" in text and "SessionService/Sessions" not in text  # no session was tried
    else:
        assert "session login as" in text and "(log out)" in text


def test_a_pinned_ca_issued_certificate_verifies_on_sushy_emulator(sushy):
    """The lab pins the BMC's own certificate, which its CA issued (the emulator serves leaf and CA)."""
    with RedfishBmc(sushy_settings(sushy, ca_file=str(sushy.tls.cert)), "gpu01") as bmc:
        assert bmc.power_state() in ("On", "Off")


def test_a_wrong_password_on_a_basic_only_bmc_says_login_refused_not_session_slots(sushy):
    with pytest.raises(DeviceCommandError) as err, RedfishBmc(sushy_settings(sushy, password="wrong"), "gpu01") as b:
        b.power_state()
    text = str(err.value)
    assert text.startswith(f"gpu01 ({sushy.url}): the BMC refused the login of user 'lab-admin'")
    assert "HTTP Basic" in text and "$LAB_BMC_PASSWORD" in text and "session slot" not in text


def test_an_unmodified_sushy_client_reads_and_power_cycles_the_twins_bmc(twin, ctl):
    """sushy (the library Ironic uses), as it comes: its default login (a session where there is one), the
    walk from the service root to the system, the Reset action with values the system advertises.
    """
    sushy = require_peer("sushy", "the twin's BMC is tried with OpenStack's Redfish client (pip install sushy)")
    ep = endpoints(twin)
    auth = sushy.auth.SessionOrBasicAuth(username=ep["redfish_user"], password=TWIN_PASSWORD)  # sushy's default
    root = sushy.Sushy(ep["redfish"], auth=auth, verify=ep["redfish_ca"])  # the twin's certificate, checked
    try:
        systems = root.get_system_collection()
        assert systems.members_identities == ("/redfish/v1/Systems/1",)
        system = root.get_system("/redfish/v1/Systems/1")
        assert system.power_state == sushy.POWER_STATE_ON
        assert {sushy.RESET_ON, sushy.RESET_FORCE_OFF} <= set(system.get_allowed_reset_system_values())
        system.reset_system(sushy.RESET_FORCE_OFF)
        system.refresh()
        assert system.power_state == sushy.POWER_STATE_OFF
        assert ctl.call("gpu01", "state")["powered"] is False
        system.reset_system(sushy.RESET_ON)
        system.refresh()
        assert system.power_state == sushy.POWER_STATE_ON
        session = auth.get_session_resource_id()  # a session, not Basic: the twin has a SessionService
        assert session and session in root.get_session_service().sessions.members_identities
    finally:
        auth.close()  # logs out: DELETE of its session
    listed = requests.get(
        f"{ep['redfish']}/redfish/v1/SessionService/Sessions",
        auth=(ep["redfish_user"], TWIN_PASSWORD),
        verify=ep["redfish_ca"],
        timeout=10,
    ).json()
    assert {"@odata.id": session} not in listed["Members"]
    assert ctl.call("gpu01", "state")["powered"] is True
