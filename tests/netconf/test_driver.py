"""PolatisNetconf (drivers/netconf/polatis.py) end to end against the emulated switch's NETCONF front end, over
real SSH on 127.0.0.1: the circuit-switch conformance suite on the twin (module revision 2018-03-22, list `pair`)
and on a switch served in-process with revision 2017-02-09 (list `pairs`), then what the suite does not look at:
the audit records, the error messages, wait_settled, the revision, a dropped session, password login.
"""

from __future__ import annotations

import threading
import time

import pytest
from nc_helpers import LIT, SIZE, ocs_spec, settings_for

from drivers.capabilities import CircuitSwitch
from drivers.errors import DeviceCommandError, DeviceConnectionError
from drivers.netconf import make_polatis_netconf, polatis_netconf_audit
from drivers.netconf.polatis import PolatisNetconf
from emulators.frontends import TWIN_PASSWORD
from testbed.conformance import circuit_switch_suite


@pytest.fixture
def twin_driver(twin_ends):
    driver = make_polatis_netconf("ocs1", settings_for(twin_ends), None)
    yield driver
    driver.close()


@pytest.fixture
def old_revision_driver(local_switch):
    switch = local_switch(revision="2017-02-09")
    driver = switch.driver()
    yield driver
    driver.close()


test_conformance_on_the_twin = circuit_switch_suite("twin_driver", size=SIZE, lit_ingress=sorted(LIT))
test_conformance_with_pairs = circuit_switch_suite("old_revision_driver", size=SIZE, lit_ingress=sorted(LIT))


def test_identity_revision_and_capability(twin_driver):
    assert isinstance(twin_driver, CircuitSwitch)
    ident = twin_driver.identify()
    assert (ident.vendor, ident.serial, ident.firmware) == ("Polatis", "000001", "6.5.2.18")
    assert f"{SIZE}x{SIZE}" in ident.model  # the emulator's model name carries the real size
    assert twin_driver.size() == (SIZE, SIZE)
    assert twin_driver.revision == "2018-03-22" and twin_driver.motion


def test_the_revision_decides_the_list_name(local_switch):
    for revision, name in (("2017-02-09", "pairs"), ("2017-08-04", "pair")):
        switch = local_switch(revision=revision)
        records: list = []
        with switch.driver(records.append) as driver:
            driver.connect([(1, 9)])
            assert driver.connections() == {1: 9}
        edit = next(r.data for r in records if r.direction == "tx" and "edit-config" in r.data)
        assert f"<{name}><ingress>1</ingress><egress>9</egress></{name}>" in edit
        assert switch.on_loop(switch.engine.circuits) == {1: 9}


def test_every_rpc_is_audited_as_sent_and_received(twin_ends):
    records: list = []
    driver = PolatisNetconf(settings_for(twin_ends), "ocs1", records.append)
    try:
        driver.connect([(9, 1)])  # given egress-first: the driver puts the ingress first
        driver.wait_settled()
    finally:
        driver.close()
    assert records[0].direction == "rx" and records[0].data.startswith("(NETCONF session ")
    exchanges = records[1:]
    assert [r.direction for r in exchanges] == ["tx", "rx"] * (len(exchanges) // 2)
    sent = [r.data for r in exchanges if r.direction == "tx"]
    assert "<ingress>1</ingress><egress>9</egress>" in sent[0] and "edit-config" in sent[0]
    assert "switch-motion" in sent[1] and "close-session" in sent[-1]
    replies = [r.data for r in exchanges if r.direction == "rx"]
    assert all("<rpc-reply" in r for r in replies) and "<ok/>" in replies[0]
    stamps = [r.mono_ns for r in records]
    assert stamps == sorted(stamps)
    assert all(r.device == "ocs1" and r.address == driver.address for r in records)
    # What the driver sent, replayed through its own audit model, gives what the switch holds.
    assert polatis_netconf_audit(SIZE).replay({}, sent) == {1: 9}


def test_refusals_name_device_address_request_reply_and_a_hint(twin_driver):
    twin_driver.connect([(1, 9)])
    with pytest.raises(DeviceCommandError) as info:
        twin_driver.connect([(2, 9)])  # egress 9 is taken
    err = info.value
    assert err.device == "ocs1" and err.address == twin_driver.address
    assert "in-use" in err.message and "<ingress>2</ingress>" in err.sent and "<rpc-error>" in err.received
    assert "disconnect the circuit" in err.hint
    with pytest.raises(DeviceCommandError) as info:
        twin_driver.disconnect([(3, 11)])
    assert "data-missing" in info.value.message and "connections()" in info.value.hint
    with pytest.raises(DeviceCommandError) as info:
        twin_driver.port_states([1, 99])
    assert "99" in info.value.message and f"egress {SIZE + 1}..{2 * SIZE}" in info.value.hint
    assert twin_driver.connections() == {1: 9}  # nothing changed


def test_deferred_refusals_come_out_of_check_errors_once(twin_driver):
    twin_driver.disconnect([(4, 12)], check=False)  # not connected: refused, kept
    assert twin_driver.connections() == {}  # any other call sends the held delete first, alone
    twin_driver.connect([(1, 9)], check=False)  # goes through
    with pytest.raises(DeviceCommandError) as info:
        twin_driver.check_errors("the circuit change")
    assert "1 write(s) of the circuit change" in str(info.value) and "data-missing" in str(info.value)
    twin_driver.check_errors()  # forgotten once raised
    assert twin_driver.connections() == {1: 9}


def test_a_disconnect_and_connect_unchecked_are_one_edit_applied_whole(twin_ends):
    records: list = []
    with PolatisNetconf(settings_for(twin_ends), "ocs1", records.append) as driver:
        driver.connect([(1, 9), (2, 10)])
        driver.wait_settled()
        start = len(records)
        driver.wait_settled()  # nothing sent since the switch said 0: no RPC
        assert len(records) == start
        # ingress 1 moves from egress 9 to 11, egress 10 goes from ingress 2 to 3: one edit-config
        driver.disconnect([(1, 9), (2, 10)], check=False)
        driver.connect([(1, 11), (3, 10)], check=False)
        driver.check_errors("the change")
        driver.wait_settled()
        assert driver.connections() == {1: 11, 3: 10}
        sent = [r.data for r in records[start:] if r.direction == "tx"]
        assert "edit-config" in sent[0] and "get-config" in sent[-1]  # one edit-config, then the settle queries
        # the settle: a query, a sleep to the end it reports and a confirming query (one alone when a loaded
        # machine answered the edit after the move was over)
        assert all("switch-motion" in t for t in sent[1:-1]) and len(sent[1:-1]) >= 1
        delete = '<pair nc:operation="delete"><ingress>1</ingress><egress>9</egress></pair>'
        assert sent[0].index(delete) < sent[0].index("<pair><ingress>1</ingress><egress>11</egress></pair>")
        # A refusal of either part changes nothing; check_errors reports it once.
        driver.disconnect([(4, 12)], check=False)  # not connected
        driver.connect([(2, 9)], check=False)
        with pytest.raises(DeviceCommandError) as info:
            driver.check_errors("the change")
        assert "disconnect and connect" in str(info.value) and "<ingress>2</ingress>" in info.value.sent
        assert driver.connections() == {1: 11, 3: 10}
    edits = [r.data for r in records if r.direction == "tx" and "edit-config" in r.data]
    assert polatis_netconf_audit(SIZE).replay({}, edits) == {1: 11, 3: 10}


def test_wait_settled_asks_the_switch_how_long_the_mirrors_move(local_switch):
    switch = local_switch(ocs_spec(switching_time_ms=120, jitter_ms=0))
    with switch.driver() as driver:
        driver.connect([(1, 9)])
        start = time.monotonic()
        driver.wait_settled()
        waited = time.monotonic() - start
        assert waited > 0.05  # it waited for the mirrors (how much longer a loaded machine takes is no behaviour)
        assert driver.port_power([9])[9] == pytest.approx(LIT[1] - 1.0)  # lit as soon as it returns
        assert switch.on_loop(lambda: switch.engine.is_moving(9, time.monotonic())) is False


def test_without_the_motion_module_wait_settled_waits_the_settle_time(local_switch, monkeypatch):
    switch = local_switch(ocs_spec(switching_time_ms=20, jitter_ms=0), motion=False)
    with switch.driver(settle_s=0.08) as driver:
        assert driver.identify() and driver.motion is False
        # The sleeps this thread asks for, and still takes: what the driver chose to wait, which a busy machine
        # cannot change (how long a sleep overruns is the machine's, not the driver's).
        asked, sleep, me = [], time.sleep, threading.current_thread()

        def observed_sleep(seconds: float) -> None:
            if threading.current_thread() is me:
                asked.append(seconds)
            sleep(seconds)

        monkeypatch.setattr(time, "sleep", observed_sleep)
        start = time.monotonic()
        driver.connect([(1, 9)])
        driver.wait_settled()
        # A lower bound of the model: not back before the settle time from the change, however busy the machine.
        assert time.monotonic() - start >= 0.08
        assert asked and all(0 <= s <= 0.08 for s in asked)  # the rest of the settle time, never more
        assert driver.port_power([9])[9] > -20
        asked.clear()
        driver.wait_settled()  # nothing changed since: no wait beyond the settle time
        assert all(s == 0 for s in asked), asked


def test_a_dropped_session_is_opened_again_on_the_next_call(local_switch):
    switch = local_switch()
    with switch.driver() as driver:
        driver.connect([(1, 9)])
        for transport in list(switch.frontend._transports):
            transport.close()  # the switch restarts its NETCONF server's connections
        time.sleep(0.2)
        assert driver.connections() == {1: 9}  # reconnected before sending, nothing sent twice
        assert [s["end"] for s in switch.frontend.sessions][:1] != ["close-session"]


def test_password_login(twin_ends, monkeypatch):
    settings = settings_for(twin_ends, key_file=None, password=TWIN_PASSWORD, password_env="TESTBED_TWIN_PASSWORD")
    with PolatisNetconf(settings, "ocs1") as driver:
        assert driver.size() == (SIZE, SIZE)
    bad = settings_for(twin_ends, key_file=None, password="wrong", password_env="X")
    with pytest.raises(DeviceConnectionError) as info, PolatisNetconf(bad, "ocs1") as driver:
        driver.connections()
    assert "authentication as 'admin' failed with the password from $X" in str(info.value)
