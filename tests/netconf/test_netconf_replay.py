"""`testbed replay` of a run whose OCS was driven over NETCONF (driver polatis-netconf, emulators/netconf/replay.py):
an emulated run's audit log, fed through a fresh NETCONF server, agrees with every recorded <rpc-reply>; replies are
compared as XML content, so a reply written differently agrees and a reply that says something else (another
cross-connect, another power) is reported, and only that one.

(Named test_netconf_replay.py: tests/replay/test_replay.py has the basename test_replay.py, and two test modules
of one basename in folders without __init__.py cannot be collected in one pytest run.)
"""

from __future__ import annotations

import io
import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from testbed.ops.audit_replay import main, replay_run

NC_NS = "urn:ietf:params:xml:ns:netconf:base:1.0"
OPSW_NS = "http://www.polatis.com/yang/optical-switch"


@pytest.fixture(scope="module")
def recorded_run(testbed_run, tmp_path_factory) -> Path:
    """A real run of playbooks/ocs-reconfig.yaml on the emulated twin with the OCS on NETCONF, as a user starts it."""
    results = tmp_path_factory.mktemp("results")
    inventory = "playbooks/inventory/emulated-rack-netconf.yaml"
    return testbed_run(
        "playbooks/ocs-reconfig.yaml", "--emulate", "--trials", "2", "--results", str(results), "--inventory", inventory
    )


@pytest.fixture
def run_copy(recorded_run, tmp_path) -> Path:
    """A copy of the run to tamper with."""
    return Path(shutil.copytree(recorded_run, tmp_path / recorded_run.name))


def read_audit(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]


def write_audit(run_dir: Path, records: list[dict]) -> None:
    (run_dir / "audit.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def rpcs(records: list[dict]) -> list[int]:
    """Positions of the <rpc>s sent to the switch."""
    return [n for n, r in enumerate(records) if r["device"] == "ocs1" and r["direction"] == "tx"]


def reply_to(records: list[dict], pattern: str) -> int:
    """The position of the reply to the first <rpc> whose text matches `pattern` (it follows the rpc at once)."""
    tx_at = next(n for n in rpcs(records) if re.search(pattern, records[n]["data"]))
    assert records[tx_at + 1]["direction"] == "rx" and "<rpc-reply" in records[tx_at + 1]["data"]
    return tx_at + 1


def ocs(report):
    return next(d for d in report.devices if d.device == "ocs1")


def test_an_emulated_netconf_run_replays_with_every_reply_agreeing(recorded_run):
    records = read_audit(recorded_run)
    sent = [records[n]["data"] for n in rpcs(records)]
    # What makes the comparison worth something: the run changed circuits, read them, read light and polled motion.
    for op in ("<nc:edit-config>", "<nc:get-config>", "<opm-power ", "<switch-motion ", "<product-information "):
        assert any(op in rpc for rpc in sent), op
    first = next(r["data"] for r in records if r["device"] == "ocs1")
    assert first.startswith("(NETCONF session 1 opened, base:1.1 framing; server capabilities: ")

    report = replay_run(recorded_run)
    device = ocs(report)
    assert (device.replayed, device.kind, device.messages) == (True, "ocs", len(sent))
    assert device.compared == len(sent) > 0  # every RPC is answered, so every reply is compared
    assert (device.agreed, device.timing_only, device.disagreements) == (len(sent), 0, [])
    assert report.disagreements == [] and report.ok
    out = io.StringIO()
    assert main(recorded_run, out) == 0
    assert f"ocs1: agrees: {len(sent)} queries compared, {len(sent)} agreed" in out.getvalue()


def test_a_cross_connect_the_device_reported_differently_is_the_one_disagreement(run_copy):
    records = read_audit(run_copy)
    # The first read of the circuits after the ring was applied: as if the real switch reported ingress 1 on
    # egress 60 where the emulator holds it on the egress the driver asked for.
    rx_at = next(
        n + 1 for n in rpcs(records) if "<nc:get-config>" in records[n]["data"] and "<pair>" in records[n + 1]["data"]
    )
    original = records[rx_at]["data"]
    egress = re.search(r"<pair><ingress>1</ingress><egress>(\d+)</egress></pair>", original).group(1)
    assert egress != "60"
    records[rx_at]["data"] = original.replace(
        f"<ingress>1</ingress><egress>{egress}</egress>", "<ingress>1</ingress><egress>60</egress>"
    )
    write_audit(run_copy, records)

    report = replay_run(run_copy)
    (x,) = report.disagreements
    assert (x.device, x.audit_line, x.command) == ("ocs1", rx_at, records[rx_at - 1]["data"])
    assert x.index == rpcs(records).index(rx_at - 1)
    recorded, emulated = x.recorded.splitlines(), x.emulator.splitlines()
    assert len(recorded) == len(emulated)
    differ = [(a, b) for a, b in zip(recorded, emulated, strict=True) if a != b]
    assert differ == [
        (
            "rpc-reply/data/opsw:cross-connects/pair: ingress=1 egress=60",
            f"rpc-reply/data/opsw:cross-connects/pair: ingress=1 egress={egress}",
        )
    ]
    n = len(rpcs(records))
    assert (ocs(report).compared, ocs(report).agreed, report.disagreed) == (n, n - 1, 1)
    out = io.StringIO()
    assert main(run_copy, out) == 1
    assert f"ocs1 #{x.index} (audit.jsonl:{x.audit_line})" in out.getvalue()


def _rewritten(reply: str) -> str:
    """The same reply as another server might write it: ElementTree's `ns0:` prefixes instead of default
    namespaces, indented, every list and every entry's leaves in reverse order, decimals without trailing zeros.
    """
    root = ET.fromstring(reply.encode())
    for elem in root.iter():
        elem[:] = list(reversed(elem))
        text = (elem.text or "").strip()
        if re.fullmatch(r"-?\d+\.\d+", text):
            text = text.rstrip("0")
            elem.text = text + "0" if text.endswith(".") else text
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


def test_replies_are_compared_as_xml_content_not_bytes(run_copy):
    records = read_audit(run_copy)
    power_at = reply_to(records, "<opm-power ")
    original = records[power_at]["data"]
    for n in rpcs(records):
        if records[n + 1]["data"].startswith("<?xml"):
            records[n + 1]["data"] = _rewritten(records[n + 1]["data"])
    written = r"<ns0:data>\s+<ns1:opm-power>\s+<ns1:port>\s+<ns1:power>-1.0</ns1:power>"
    assert re.search(written, records[power_at]["data"])
    write_audit(run_copy, records)
    report = replay_run(run_copy)
    assert report.ok and ocs(report).compared == len(rpcs(records))

    # ... but another power reading is a difference, however it is written.
    assert "<port><port-id>33</port-id><power>-1.00</power></port>" in original
    tampered = original.replace("<port-id>33</port-id><power>-1.00<", "<port-id>33</port-id><power>-1.25<")
    records[power_at]["data"] = _rewritten(tampered)
    write_audit(run_copy, records)
    (x,) = replay_run(run_copy).disagreements
    assert x.audit_line == power_at  # the <rpc>'s line (1-based), just before its reply
    assert [a for a in x.recorded.splitlines() if a not in x.emulator.splitlines()] == [
        "rpc-reply/data/opsw:opm-power/port: port-id=33 power=-1.25"
    ]


def test_a_message_id_the_switch_did_not_echo_is_a_difference(run_copy):
    records = read_audit(run_copy)
    rx_at = reply_to(records, "<nc:edit-config>")
    records[rx_at]["data"] = re.sub(r'message-id="[^"]*"', 'message-id="101"', records[rx_at]["data"])
    write_audit(run_copy, records)
    (x,) = replay_run(run_copy).disagreements
    assert (x.audit_line, x.recorded) == (rx_at, "rpc-reply[message-id=101]: ok")
    assert re.fullmatch(r"rpc-reply\[message-id=urn:uuid:[0-9a-f-]+\]: ok", x.emulator)


def test_when_the_mirrors_settle_is_not_compared(run_copy):
    # settle-remaining-us says only when: a real switch as fast again as the model, or as slow, is no disagreement.
    # The driver reads it after every edit; whether a read caught the mirrors moving depends on how busy the machine
    # was, so every reading is rewritten to a time no replay of the model gives (longer than any of its moves).
    records = read_audit(run_copy)
    readings = [n + 1 for n in rpcs(records) if "<settle-remaining-us>" in records[n + 1]["data"]]
    assert readings  # the driver waited for the mirrors through the server's motion state
    for n in readings:
        records[n]["data"] = re.sub(r"<settle-remaining-us>\d+<", "<settle-remaining-us>987654<", records[n]["data"])
    write_audit(run_copy, records)
    report = replay_run(run_copy)
    assert report.ok and ocs(report).compared == len(rpcs(records))


def test_a_timeout_is_timing_and_a_lost_connection_is_skipped(run_copy):
    records = read_audit(run_copy)
    hello = next(r["data"] for r in records if r["device"] == "ocs1").replace("session 1", "session {}")
    assert hello.startswith("(NETCONF session {} opened")

    def note(text: str) -> dict:
        return {**records[0], "device": "ocs1", "direction": "rx", "data": text}

    # As the driver records them: "(timeout)" or "(connection lost: ...)" in place of the reply, then, before
    # the next RPC, the new session (or a failed attempt at one, then the new session).
    replaced = {
        reply_to(records, "<opm-power "): [note("(timeout)"), note(hello.format(2))],
        reply_to(records, "<product-information "): [
            note("(connection lost: TransportError('Not connected to NETCONF server'))"),
            note("(connection failed: NoValidConnectionsError(None, 'Unable to connect to port 830'))"),
            note(hello.format(3)),
        ],
    }
    after_reply = reply_to(records, "<nc:edit-config>")  # a reconnect after a reply is not about that reply
    replaced[after_reply] = [records[after_reply], note(hello.format(4))]
    records = [x for n, r in enumerate(records) for x in replaced.get(n, [r])]
    write_audit(run_copy, records)

    report = replay_run(run_copy)
    n = len(rpcs(records))
    assert report.ok
    assert (ocs(report).messages, ocs(report).compared, ocs(report).timing_only) == (n, n - 2, 1)
