"""Every RPC the driver sends in a representative sequence, and every reply the switch's NETCONF server gives it,
validated against the optical-switch YANG model with libyang (yanglint, Debian libyang2-tools 2.1.30).

The model is the project's own subset of the vendor's module (tests/netconf/yang/optical-switch.yang: same name,
namespace, prefix, and the vendor's types and constraints for the nodes used; docs/interop.md says how it was
checked against the vendor's own module). The messages are taken where the switch received and answered them: the
emulator's NETCONF front end keeps each session's messages (front-end option `transcript`).
"""

from __future__ import annotations

import time

import pytest
from nc_helpers import ocs_spec
from peers import require_program
from test_ncclient_plain import connect
from yang_check import NC, OPSW, Document, documents, yanglint

from drivers.errors import DeviceCommandError

WHY = "yanglint (Debian package libyang2-tools) validates the NETCONF messages against the optical-switch YANG"


@pytest.fixture(scope="module")
def lint() -> str:
    return require_program("yanglint", WHY)


def representative_sequence(switch) -> None:
    """What a run does with a switch: open, identify, make circuits, read them and the light, disable and enable
    a port, move circuits in one edit, take them down; and an edit refused because another session holds the lock
    (the driver then asks who holds it with a <lock>), then the holder's unlock.
    """
    with switch.driver() as driver:
        driver.identify()
        driver.connect([(1, 9), (2, 10)])
        driver.wait_settled()
        driver.connections()
        driver.port_power([1, 9, 10, 11])
        driver.port_states([1, 9])
        driver.set_port_enabled([10], False)
        driver.set_port_enabled([10], True)
        driver.disconnect([(1, 9), (2, 10)], check=False)
        driver.connect([(1, 11), (3, 10)], check=False)  # one edit-config: deletes, then merges
        driver.check_errors()
        driver.disconnect([(1, 11)])
        with pytest.raises(DeviceCommandError):
            driver.connect([(4, 12), (5, 12)])  # in-use: egress 12 twice (refused, still valid YANG content)
        driver.disconnect_all()
        holder = connect(switch.endpoints)
        try:
            holder.lock(target="running")
            with pytest.raises(DeviceCommandError) as info:
                driver.connect([(1, 9)])
            assert "running is locked by NETCONF session" in info.value.hint
            holder.unlock(target="running")
        finally:
            holder.close_session()
        driver.connect([(1, 9)])


def _transcripts(switch, sessions: int) -> list[tuple[bytes, bytes | None]]:
    """The messages of the first `sessions` sessions to end (the front end files a session as it ends, which
    can be just after the client saw its close-session answered).
    """
    deadline = time.monotonic() + 10
    while len(switch.frontend.sessions) < sessions and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(switch.frontend.sessions) >= sessions, switch.frontend.sessions
    return [m for s in switch.frontend.sessions for m in s.get("messages", [])]


def test_every_rpc_and_reply_of_the_driver_is_valid_yang(local_switch, lint):
    switch = local_switch(ocs_spec(switching_time_ms=5), transcript=True)
    representative_sequence(switch)
    messages = _transcripts(switch, 2)  # the driver's session and the lock holder's
    seen: dict[str, int] = {}
    problems: list[str] = []
    checked: list[Document] = []
    for rpc, reply in messages:
        name, docs = documents(rpc.decode(), None if reply is None else reply.decode())
        seen[name] = seen.get(name, 0) + 1
        for doc in docs:
            checked.append(doc)
            if (problem := yanglint(lint, doc)) is not None:
                problems.append(problem)
    assert not problems, "\n".join(problems)
    # the sequence covered what the driver does
    assert {"get", "get-config", "edit-config", "port-set-state", "lock", "unlock", "close-session"} <= set(seen)
    kinds = {d.kind for d in checked}
    assert kinds == {"edit", "get", "getconfig", "rpc"}
    edits = [d.xml for d in checked if d.kind == "edit"]
    assert any('operation="delete"' in e for e in edits) and any('operation="replace"' in e for e in edits)
    replies = " ".join(d.xml for d in checked if d.kind in ("get", "getconfig"))
    for node in ("pair", "product-information", "opm-power", "status", "switch-motion"):
        assert f":{node}>" in replies or f"<{node}>" in replies or f"<{node} " in replies, node


@pytest.mark.parametrize(
    ("kind", "xml"),
    [
        ("edit", '<cross-connects xmlns="{o}"><pair><ingress>0</ingress><egress>9</egress></pair></cross-connects>'),
        ("edit", '<cross-connects xmlns="{o}"><pairs><ingress>1</ingress><egress>9</egress></pairs></cross-connects>'),
        ("edit", '<cross-connects xmlns="{o}" xmlns:nc="{n}" nc:operation="move"/>'),
        ("getconfig", '<opm-power xmlns="{o}"><port><port-id>9</port-id><power>-1.00</power></port></opm-power>'),
        ("get", '<opm-power xmlns="{o}"><port><port-id>9</port-id><power>-1.005</power></port></opm-power>'),
        ("get", '<port-config xmlns="{o}"><port><port-id>9</port-id><status>PO_ENABLED</status></port></port-config>'),
        ("get", '<cross-connects xmlns="{o}"><pair><ingress>1</ingress><gain>3</gain></pair></cross-connects>'),
        ("rpc", '<port-set-state xmlns="{o}"><port-enab>x</port-enab></port-set-state>'),
    ],
    ids=["port-0", "old-list-name", "bad-operation", "state-in-get-config", "three-decimals", "old-status-enum",
         "unknown-leaf", "port-not-a-number"],
)  # fmt: skip
def test_the_validation_refuses_what_the_model_does_not_allow(lint, kind, xml):
    doc = Document(kind, "a hand-written counterexample", xml.format(o=OPSW, n=NC))
    assert yanglint(lint, doc) is not None
