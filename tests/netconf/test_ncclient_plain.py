"""An unmodified ncclient against the emulator, with nothing of the project on the client side: the twin's client
key and the host key listed in its known_hosts, raw XML for get-config and edit-config, in both framings (base:1.1
chunked, and base:1.0 end-of-message from a client that only advertises 1.0 or against a 1.0-only server).
"""

from __future__ import annotations

import time

import paramiko
import pytest
from ncclient import manager
from ncclient.devices.default import DefaultDeviceHandler
from ncclient.operations.rpc import RPCError
from ncclient.xml_ import to_ele

OPSW = "http://www.polatis.com/yang/optical-switch"
NC = "urn:ietf:params:xml:ns:netconf:base:1.0"
BASE_11 = "urn:ietf:params:netconf:base:1.1"


class Base10Only(DefaultDeviceHandler):
    """ncclient's default handler, advertising base:1.0 only (so the session stays in ]]>]]> framing)."""

    _BASE_CAPABILITIES = [c for c in DefaultDeviceHandler._BASE_CAPABILITIES if c != BASE_11]


def connect(endpoints: dict, **kw) -> manager.Manager:
    host, _, port = endpoints["netconf"].rpartition(":")
    known = paramiko.HostKeys(endpoints["known_hosts"]).lookup(f"[{host}]:{port}")
    host_key = known["ssh-ed25519"]
    args = {"key_filename": endpoints["key_file"], "allow_agent": False, "look_for_keys": False, **kw}
    return manager.connect(
        host=host, port=int(port), username="admin", hostkey_verify=True, hostkey_b64=host_key.get_base64(),
        timeout=10, **args,
    )  # fmt: skip


def edit(pairs: str, operation: str = "") -> str:
    return f'<config xmlns="{NC}"><cross-connects xmlns="{OPSW}"{operation}>{pairs}</cross-connects></config>'


def pair(i: int, e: int, attrs: str = "") -> str:
    return f"<pair{attrs}><ingress>{i}</ingress><egress>{e}</egress></pair>"


def circuits(m: manager.Manager) -> dict[int, int]:
    reply = m.get_config(source="running", filter=("subtree", f'<cross-connects xmlns="{OPSW}"/>'))
    root = to_ele(reply.xml)
    found = root.findall(f".//{{{OPSW}}}pair")
    return {int(p.findtext(f"{{{OPSW}}}ingress")): int(p.findtext(f"{{{OPSW}}}egress")) for p in found}


def test_get_config_and_edit_config_with_raw_xml(twin_ends):
    with connect(twin_ends) as m:
        assert BASE_11 in m.server_capabilities
        caps = list(m.server_capabilities)
        assert f"{OPSW}?module=optical-switch&revision=2018-03-22" in caps
        m.edit_config(target="running", config=edit(pair(1, 9) + pair(2, 10)))
        assert circuits(m) == {1: 9, 2: 10}
        delete = f' xmlns:nc="{NC}" nc:operation="delete"'
        m.edit_config(target="running", config=edit(pair(1, 9, delete)))
        assert circuits(m) == {2: 10}
        m.edit_config(target="running", config=edit(pair(3, 11)), default_operation="replace")
        assert circuits(m) == {3: 11}
        time.sleep(0.05)  # the mirrors settle (25 ms)
        power = m.get(filter=("subtree", f'<opm-power xmlns="{OPSW}"><port><port-id>11</port-id></port></opm-power>'))
        assert to_ele(power.xml).findtext(f".//{{{OPSW}}}power") == "-99.99"  # ingress 3 is dark
        with pytest.raises(RPCError) as info:
            m.edit_config(target="running", config=edit(pair(4, 99)))
        assert info.value.tag == "invalid-value"


def _framing_of_last_session(switch) -> str:
    deadline = time.monotonic() + 5
    while not switch.frontend.sessions and time.monotonic() < deadline:
        time.sleep(0.01)
    return switch.frontend.sessions[-1]["framing"]


@pytest.mark.parametrize(
    ("server_options", "client", "framing"),
    [
        ({}, {}, "1.1"),
        ({}, {"device_params": {"handler": Base10Only}}, "1.0"),
        ({"base11": False}, {}, "1.0"),
    ],
    ids=["chunked", "client-1.0-only", "server-1.0-only"],
)
def test_both_framings(local_switch, server_options, client, framing):
    switch = local_switch(**server_options)
    with connect(switch.endpoints, **client) as m:
        assert (BASE_11 in m.server_capabilities) == server_options.get("base11", True)
        m.edit_config(target="running", config=edit(pair(1, 9)))
        assert circuits(m) == {1: 9}
        big = "".join(pair(i, 8 + i) for i in range(1, 9))  # a longer message, several reads
        m.edit_config(target="running", config=edit(big), default_operation="replace")
        assert circuits(m) == {i: 8 + i for i in range(1, 9)}
    assert _framing_of_last_session(switch) == framing


def test_a_second_sessions_lock_is_denied_and_its_edit_is_in_use(twin_ends):
    first = connect(twin_ends)
    with connect(twin_ends) as second:
        first.lock(target="running")
        with pytest.raises(RPCError) as info:
            second.lock(target="running")
        assert info.value.tag == "lock-denied" and f"<session-id>{first.session_id}</session-id>" in info.value.info
        with pytest.raises(RPCError) as info:
            second.edit_config(target="running", config=edit(pair(1, 9)))
        assert info.value.tag == "in-use"
        first.edit_config(target="running", config=edit(pair(1, 9)))  # the holder may change it
        with pytest.raises(RPCError) as info:
            second.unlock(target="running")
        assert info.value.tag == "operation-failed"
        first.close_session()  # the lock ends with its session
        second.lock(target="running")
        second.unlock(target="running")
        assert circuits(second) == {1: 9}


def test_unsupported_operations_and_datastores(twin_ends):
    with connect(twin_ends) as m:
        with pytest.raises(RPCError) as info:
            m.dispatch(to_ele(f'<commit xmlns="{NC}"/>'))
        assert info.value.tag == "operation-not-supported"
        with pytest.raises(RPCError) as info:
            m.get_config(source="startup")
        assert info.value.tag == "invalid-value"
        with pytest.raises(RPCError) as info:
            m.dispatch(to_ele('<reboot xmlns="urn:example:other"/>'))
        assert info.value.tag == "unknown-namespace"


def test_password_login(twin_ends):
    from emulators.frontends import TWIN_PASSWORD  # the twin's published password; the client is still ncclient

    with connect(twin_ends, key_filename=None, password=TWIN_PASSWORD) as m:
        assert m.session_id
