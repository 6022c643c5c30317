"""Logging in, and what a user sees when it fails: every failure a DeviceConnectionError that names the
switch, its address and what to change, and the password nowhere (not in errors, not in the audit).
"""

from __future__ import annotations

import socket

import pytest
from tl1_harness import CALIENT, POLATIS, ScriptedTl1, block, settings_for

from drivers.errors import DeviceConnectionError
from drivers.tl1 import make_calient_tl1, make_polatis_tl1
from drivers.transports.tl1 import Tl1Transport
from emulators.frontends import TWIN_PASSWORD_ENV
from testbed.results.redact import redact_text

MAKERS = {POLATIS: make_polatis_tl1, CALIENT: make_calient_tl1}


@pytest.mark.parametrize("device", [POLATIS, CALIENT])
def test_a_wrong_password_says_which_variable_to_set(tl1_twin, device):
    records = []
    settings = settings_for(
        tl1_twin.endpoints.devices[device]["tl1"], password="s3cret-wrong", password_env=TWIN_PASSWORD_ENV
    )
    driver = MAKERS[device](device, settings, records.append)
    with pytest.raises(DeviceConnectionError) as info:
        driver.identify()
    err = info.value
    assert err.device == device and err.address == "admin@" + tl1_twin.endpoints.devices[device]["tl1"]
    assert "refused the login of user 'admin': PIUI" in err.message
    assert TWIN_PASSWORD_ENV in err.hint
    assert err.sent == "ACT-USER::admin:1::***;" and "DENY" in err.received
    assert "s3cret-wrong" not in str(err) and not any("s3cret-wrong" in r.data for r in records)
    assert records[0].data == "ACT-USER::admin:1::***;\r\n" == redact_text(records[0].data)
    driver.close()


def test_no_password_says_which_variable_to_set_and_sends_nothing():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(0.2)
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        driver = make_polatis_tl1("sw", settings_for(endpoint, password=None, password_env="LAB_OCS_PASSWORD"))
        with pytest.raises(DeviceConnectionError) as info:
            driver.connections()
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing even connected
    assert "set the environment variable LAB_OCS_PASSWORD" in info.value.hint
    assert info.value.sent is None


def test_nothing_listening(tl1_twin):
    with socket.create_server(("127.0.0.1", 0)) as s:
        endpoint = f"127.0.0.1:{s.getsockname()[1]}"
    driver = make_polatis_tl1("sw", settings_for(endpoint))
    with pytest.raises(DeviceConnectionError) as info:
        driver.size()
    assert "cannot connect" in info.value.message and "3082" in info.value.hint


def test_a_port_that_does_not_speak_tl1(tl1_twin):
    """The switch's SCPI port takes `ACT-USER...;` for a bad SCPI command and says nothing."""
    driver = make_polatis_tl1("sw", settings_for(tl1_twin.endpoints.devices[POLATIS]["tcp"], timeout_s=0.2))
    with pytest.raises(DeviceConnectionError) as info:
        driver.size()
    assert "no answer to the login" in info.value.message and "TL1 port" in info.value.hint


def test_a_session_logged_out_by_the_switch_logs_in_again(tl1_twin):
    """PLNA (e.g. the switch's idle timeout ended the login) means the command did not run: log in, resend."""
    transport = Tl1Transport(settings_for(tl1_twin.endpoints.devices[POLATIS]["tl1"]), POLATIS)
    try:
        transport.command("RTRV-HDR", "", "")
        transport.command("CANC-USER", "admin")  # as the switch would do it on its own
        assert transport.command("RTRV-HDR", "", "").code == "COMPLD"
    finally:
        transport.close()


def test_a_dropped_connection_is_an_error_then_the_next_call_reconnects():
    peer = ScriptedTl1(lambda verb, ctag: block(ctag, "COMPLD", ['"SYSTEM:SIZE=8x8"']), hang_ups=1)
    driver = make_polatis_tl1("sw", settings_for(peer.endpoint, timeout_s=0.5))
    try:
        with pytest.raises(DeviceConnectionError) as info:
            driver.size()
        assert "closed the connection" in info.value.message
        assert "outcome of the commands in flight is unknown" in info.value.hint
        assert info.value.sent.startswith("RTRV-EQPT::SYSTEM:2:")
        assert driver.size() == (8, 8)  # a new connection, logged in again
        assert [c.split(":")[0] for c in peer.commands] == ["ACT-USER", "RTRV-EQPT", "ACT-USER", "RTRV-EQPT"]
    finally:
        driver.close()
        peer.stop()
