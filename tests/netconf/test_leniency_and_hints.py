"""What the emulator takes as ncclient and real servers do, where RFC 6241 is strict it stays strict, and the driver's
hint for an in-use refusal matches what the switch said: a lock (naming its holder) or a port carrying a circuit.

ncclient passes edit-config's <config> and get's <filter> on as the user wrote them, with or without the NETCONF
namespace (its validated_element takes both), and its examples write a bare <config>; the other parameters
(target, source, ...) it always writes in the namespace itself.
"""

from __future__ import annotations

import pytest
from nc_helpers import settings_for
from ncclient.operations.rpc import RPCError
from ncclient.xml_ import to_ele
from test_ncclient_plain import NC, OPSW, circuits, connect, pair

from drivers.errors import DeviceCommandError
from drivers.netconf import polatis_netconf_audit
from drivers.netconf.polatis import PolatisNetconf


def bare_config(pairs: str, operation: str = "") -> str:
    return f'<config><cross-connects xmlns="{OPSW}"{operation}>{pairs}</cross-connects></config>'


def test_a_bare_config_and_a_bare_filter_are_taken(twin_ends):
    with connect(twin_ends) as m:
        m.edit_config(target="running", config=bare_config(pair(1, 9) + pair(2, 10)))
        delete = f' xmlns:nc="{NC}" nc:operation="delete"'
        m.edit_config(target="running", config=bare_config(pair(2, 10, delete)))
        assert circuits(m) == {1: 9}
        reply = m.get_config(
            source="running", filter=f'<filter type="subtree"><cross-connects xmlns="{OPSW}"/></filter>'
        )
        assert [p.findtext(f"{{{OPSW}}}egress") for p in to_ele(reply.xml).iter(f"{{{OPSW}}}pair")] == ["9"]
        reply = m.get(filter=f'<filter type="subtree"><product-information xmlns="{OPSW}"/></filter>')
        assert to_ele(reply.xml).findtext(f".//{{{OPSW}}}manufacturer") == "Polatis"


def test_the_audit_model_reads_a_bare_config_as_the_switch_does(twin_ends):
    with connect(twin_ends) as m:
        m.edit_config(target="running", config=bare_config(pair(3, 11)))
        assert circuits(m) == {3: 11}
    rpc = (
        f'<nc:rpc xmlns:nc="{NC}" message-id="1"><nc:edit-config><nc:target><nc:running/></nc:target>'
        f"{bare_config(pair(3, 11))}</nc:edit-config></nc:rpc>"
    )  # ncclient's wire form of the call above (its default device handler writes the nc: prefix)
    assert polatis_netconf_audit(8).replay({}, [rpc]) == {3: 11}


@pytest.mark.parametrize(
    ("operation", "tag"),
    [
        # <config> in another namespace, or a bare parameter ncclient never writes bare: still refused
        (f'<edit-config xmlns="{NC}"><target><running/></target><config xmlns="urn:example:other"/></edit-config>',
         "unknown-namespace"),
        (f'<nc:edit-config xmlns:nc="{NC}"><target><nc:running/></target>{bare_config(pair(1, 9))}</nc:edit-config>',
         "unknown-namespace"),
        (f'<nc:get-config xmlns:nc="{NC}"><source><nc:running/></source></nc:get-config>', "unknown-namespace"),
        # a bare <config> is taken as edit-config's only: on get it is no parameter
        (f'<nc:get xmlns:nc="{NC}">{bare_config("")}</nc:get>', "unknown-namespace"),
        # the data inside <config> must be in the module's namespace
        (f'<nc:edit-config xmlns:nc="{NC}"><nc:target><nc:running/></nc:target><config><cross-connects/></config>'
         "</nc:edit-config>", "unknown-namespace"),
    ],
    ids=["config-other-ns", "bare-target", "bare-source", "config-on-get", "bare-data"],
)  # fmt: skip
def test_where_rfc_6241_is_strict_the_switch_stays_strict(twin_ends, operation, tag):
    with connect(twin_ends) as m, pytest.raises(RPCError) as info:
        m.dispatch(to_ele(operation))
    assert info.value.tag == tag
    with connect(twin_ends) as m:
        assert circuits(m) == {}  # nothing changed


def test_in_use_from_a_lock_gets_a_lock_hint_naming_the_holder(twin_ends):
    records: list = []
    holder = connect(twin_ends)
    try:
        holder.lock(target="running")
        with PolatisNetconf(settings_for(twin_ends), "ocs1", records.append) as driver:
            with pytest.raises(DeviceCommandError) as info:
                driver.connect([(1, 9)])
            err = info.value
            assert "in-use" in err.message
            assert f"running is locked by NETCONF session {holder.session_id}" in err.hint
            assert "egress" not in err.hint and "circuit" not in err.hint
            # the driver asked who holds it with a <lock>, refused; it holds nothing itself
            sent = [r.data for r in records if r.direction == "tx"]
            assert "edit-config>" in sent[-2] and ":lock>" in sent[-1]
            holder.unlock(target="running")
            driver.connect([(1, 9)])  # once released, the same call goes through
            assert driver.connections() == {1: 9}
    finally:
        holder.close_session()


def test_in_use_from_a_circuit_gets_the_circuit_hint_and_no_lock_probe(twin_ends):
    records: list = []
    with PolatisNetconf(settings_for(twin_ends), "ocs1", records.append) as driver:
        driver.connect([(1, 9)])
        with pytest.raises(DeviceCommandError) as info:
            driver.connect([(2, 9)])
        assert "in-use" in info.value.message and "disconnect the circuit" in info.value.hint
        assert "<error-path" in info.value.received  # the switch points at the pair
        assert not [r for r in records if r.direction == "tx" and ":lock>" in r.data]
