"""Record and replay over TL1: a real emulated run whose switch was driven over Polatis or Calient TL1 replays
through a fresh TL1 front end with every recorded answer agreeing; an answer the switch gave differently is
the one disagreement; the raw output's framing (chunks cut anywhere, alarms, in-progress acknowledgments) and
an answer that never came are read as the protocol says (docs/protocols.md §8).
"""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pytest
from tl1_harness import Local

from emulators.devices import OcsDevice
from emulators.frontends import TWIN_PASSWORD
from emulators.spec import OcsSpec
from emulators.tl1.replay import ResponseReader
from testbed.ops.audit_replay import main, replay_run

INVENTORIES = {
    "polatis-tl1": "playbooks/inventory/emulated-rack-tl1.yaml",
    "calient-tl1": "playbooks/inventory/emulated-rack-calient.yaml",
}
# The query whose answer lists circuits, and a port in one of its lines to change into another.
LISTING = {"polatis-tl1": "RTRV-PATCH", "calient-tl1": "RTRV-CRS"}


@pytest.fixture(scope="module", params=sorted(INVENTORIES))
def recorded_run(request, testbed_run, tmp_path_factory) -> tuple[str, Path]:
    """A real run of playbooks/ocs-reconfig.yaml on the emulated twin, its switch driven over TL1."""
    driver = request.param
    results = tmp_path_factory.mktemp(f"results-{driver}")
    run_dir = testbed_run(
        "playbooks/ocs-reconfig.yaml", "--emulate", "--trials", "2", "--results", str(results),
        "--inventory", INVENTORIES[driver],
    )  # fmt: skip
    return driver, run_dir


@pytest.fixture
def run_copy(recorded_run, tmp_path) -> tuple[str, Path]:
    """A copy of the run to tamper with."""
    driver, run_dir = recorded_run
    return driver, Path(shutil.copytree(run_dir, tmp_path / run_dir.name))


def read_audit(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]


def write_audit(run_dir: Path, records: list[dict]) -> None:
    (run_dir / "audit.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def answered_alone(records: list[dict], verb: str) -> list[int]:
    """Positions of the tx records of `verb` whose answer, complete, is recorded before the next command."""
    found = []
    for n, r in enumerate(records):
        if r["direction"] != "tx" or not r["data"].startswith(verb + ":"):
            continue
        rx = "".join(x["data"] for x in records[n + 1 : next_tx(records, n)])
        ctag = r["data"].split(":")[3].rstrip(";\r\n")
        if re.search(rf"^M  {ctag} COMPLD\r\n", rx, re.MULTILINE) and rx.rstrip().endswith((";", "agent>")):
            found.append(n)
    return found


def next_tx(records: list[dict], n: int) -> int:
    return next((m for m in range(n + 1, len(records)) if records[m]["direction"] == "tx"), len(records))


def test_an_emulated_tl1_run_replays_with_every_answer_agreeing(recorded_run):
    _, run_dir = recorded_run
    records = read_audit(run_dir)
    assert records[0]["data"].startswith("ACT-USER::admin:1::***;")  # the password masked: replay logs in anyway
    report = replay_run(run_dir)
    (ocs,) = report.devices
    assert (ocs.device, ocs.replayed) == ("ocs1", True)
    # Every command sent alone (the driver waited for its answer) is one comparison, and so is a batch sent
    # before reading any answer (a rail change's DLT-PATCH and ENT-PATCH, or its ENT-CRS / ACT-CRS per
    # cross-connect): in the group of its last command, which holds the answers to all of them.
    answered_groups = sum(1 for n, r in enumerate(records) if r["direction"] == "tx" and next_tx(records, n) > n + 1)
    assert ocs.compared == answered_groups > 0
    assert ocs.messages > ocs.compared  # the run did send batches
    assert (ocs.agreed, ocs.timing_only, ocs.disagreements) == (ocs.compared, 0, [])
    out = io.StringIO()
    assert main(run_dir, out) == 0
    assert out.getvalue().endswith(
        f"replay: {report.compared} queries compared, {report.compared} agreed (100.0 %), 0 disagreed\n"
    )


def test_a_circuit_the_switch_listed_differently_is_the_one_disagreement(run_copy):
    driver, run_dir = run_copy
    records = read_audit(run_dir)
    before = replay_run(run_dir).devices[0]
    # The first listing that shows circuits: as if the real switch had patched another egress port.
    tx_at = next(n for n in answered_alone(records, LISTING[driver]) if '"' in records[n + 1]["data"])
    rx = records[tx_at + 1]
    if driver == "polatis-tl1":
        m = re.search(r'"(\d+),(\d+)"', rx["data"])
        new = f'"{m.group(1)},{int(m.group(2)) % 64 + 1}"'
    else:
        m = re.search(r"DSTPORT=(\d+\.\d+)\.(\d+)", rx["data"])
        new = f"DSTPORT={m.group(1)}.{int(m.group(2)) % 8 + 1}"
    original = m.group(0)
    rx["data"] = rx["data"].replace(original, new, 1)
    write_audit(run_dir, records)

    report = replay_run(run_dir)
    (x,) = report.disagreements
    assert (x.device, x.audit_line, x.command) == ("ocs1", tx_at + 1, records[tx_at]["data"].rstrip("\r\n"))
    assert x.index == sum(1 for r in records[:tx_at] if r["direction"] == "tx")
    recorded, emulated = x.recorded.split("\n"), x.emulator.split("\n")
    assert recorded[0] == emulated[0] == f"M  {x.command.split(':')[3]} COMPLD"
    changed = [(a, b) for a, b in zip(recorded, emulated, strict=True) if a != b]
    assert len(changed) == 1 and changed[0][0] == changed[0][1].replace(original, new, 1)
    assert (report.compared, report.agreed) == (before.compared, before.compared - 1)
    out = io.StringIO()
    assert main(run_dir, out) == 1
    assert f"ocs1 #{x.index} (audit.jsonl:{x.audit_line}) {x.command!r}: device " in out.getvalue()


ALARM = (  # §8.7, as another switch (SID) would send it
    "\r\n\n   LAB-OCS 24-05-01 12:00:00\r\n** 7 REPT ALM\r\n"
    '   "3:MJ,FAIL,SA,05-01,12-00-00,,RCV:\\"port failed\\""\r\n;'
)


def test_alarms_acknowledgments_and_chunks_cut_anywhere_change_nothing(run_copy):
    """Recorded output as a real switch may send it: an alarm and an in-progress acknowledgment before an
    answer, and an answer cut in two chunks recorded either side of the next command.
    """
    driver, run_dir = run_copy
    records = read_audit(run_dir)
    before = replay_run(run_dir).devices[0]
    first, second = answered_alone(records, LISTING[driver])[:2]
    rx = records[first + 1]
    ctag = records[first]["data"].split(":")[3].rstrip(";\r\n")
    rx["data"] = ALARM + f"IP {ctag}\r\n<" + rx["data"] + ALARM  # §8.3: the alarms, then the answer, then an alarm
    # The second listing's answer: its end, from inside its last line on, only arrives after the next command
    later = next_tx(records, second)
    cut = records[later - 1]
    at = cut["data"].rindex(";") - 3
    head, tail = cut["data"][:at], cut["data"][at:]
    cut["data"] = head
    records.insert(later + 1, {**cut, "data": tail, "mono_ns": records[later]["mono_ns"] + 1})
    write_audit(run_dir, records)

    after = replay_run(run_dir).devices[0]
    assert after.disagreements == [] and after.timing_only == 0
    # the cut answer is compared with the next command's, in one group
    assert after.compared == before.compared - 1


def test_an_answer_that_never_came_is_timing_not_a_disagreement(run_copy):
    # A switch slower than the transport's timeout: one RTRV-HDR (wait_settled) never answered in time.
    driver, run_dir = run_copy
    records = read_audit(run_dir)
    before = replay_run(run_dir).devices[0]
    hdr = answered_alone(records, "RTRV-HDR")[1]
    del records[hdr + 1 : next_tx(records, hdr)]
    write_audit(run_dir, records)
    after = replay_run(run_dir).devices[0]
    # its own group holds no answer (skipped); the next one shows it unanswered: timing, not compared
    assert after.disagreements == [] and after.timing_only == 1
    assert after.compared == before.compared - 2


def slow_switch(frontend: str) -> OcsSpec:
    return OcsSpec(name="lab-ocs", size=8, switching_time_ms=3000, jitter_ms=0, frontends=["scpi", frontend])


def test_a_slow_move_answers_in_progress_then_compld_when_settled():
    """§8.9: a move more than 2 s long is acknowledged `IP` at once and answered COMPLD when settled; the
    acknowledgment is not compared, the COMPLD's time is the exchange's `at`.
    """
    session = OcsDevice.replay_session(slow_switch("tl1-polatis"), None)
    login = session.exchange("ACT-USER::admin:1::***;\r\n", 0.0)
    assert (login.lines, login.at) == (["M  1 COMPLD"], 0.0)
    recorded = session.recorded("\r\n\n   LAB 99-01-01 00:00:00\r\nM  1 COMPLD\r\n;")  # another SID and time
    assert recorded == login.lines and session.verdict("ACT-USER", recorded, login.lines) == "compare"

    move = session.exchange("ENT-PATCH::1,9:2:;\r\n", 1.0)
    assert move.lines == ["M  2 COMPLD"] and move.at == pytest.approx(4.0)
    recorded = session.recorded("IP 2\r\n<\r\n\n   LAB 99-01-01 00:00:04\r\nM  2 COMPLD\r\n;")
    assert recorded == move.lines

    patch = session.exchange("RTRV-PATCH:::3:;\r\n", move.at)
    assert patch.lines == ["M  3 COMPLD", '   "1,9"']
    # a different port in the recorded answer stays different; a wrong password stays refused
    assert session.recorded('\r\n\n   LAB 99-01-01 00:00:04\r\nM  3 COMPLD\r\n   "1,10"\r\n;') != patch.lines
    again = session.exchange("ACT-USER::admin:4::wrong;\r\n", 5.0)
    assert again.lines[:2] == ["M  4 DENY", "   PIUI"]


@pytest.mark.parametrize("dialect", ["polatis", "calient"])
def test_output_cut_into_chunks_anywhere_reads_the_same(dialect):
    """The recorded chunks are raw reads: a cut may fall inside a line, a `\\r\\n`, a quoted string or a comment;
    the answers read are the same wherever it falls (§8.3 framing, Calient's `agent>` prompt included).
    """
    local = Local(dialect, login=False)
    commands = [
        "ACT-USER::admin:1::wrong;",  # DENY: an error code and a comment
        f"ACT-USER::admin:2::{TWIN_PASSWORD};",
        "ENT-PATCH::1,5:3:;" if dialect == "polatis" else "ENT-CRS::1.1.1,1.1.2:3::testbed,1WAY;",
        "RTRV-PATCH:::4:;" if dialect == "polatis" else "RTRV-CRS:::4::ALL;",
        "RTRV-NETYPE:::5:;" if dialect == "polatis" else "RTRV-NE:::5;",
    ]
    text = local.frontend.prompt.lstrip(b"\r\n").decode() + ALARM
    for command in commands:
        text += "".join(local.send(command))
    whole = [r.lines() for r in ResponseReader().feed(text)]
    assert [lines[0] for lines in whole] == ["M  1 DENY", "M  2 COMPLD", "M  3 COMPLD", "M  4 COMPLD", "M  5 COMPLD"]
    assert whole[0][1:] == ["   PIUI", "   /* login refused: unknown user or wrong password */"]
    assert len(whole[3]) == 2 and '"' in whole[3][1]  # the circuit (or the cross-connect entered)
    for cut in range(len(text) + 1):
        for second in (cut, min(len(text), cut + 3)):
            reader = ResponseReader()
            parts = reader.feed(text[:cut]) + reader.feed(text[cut:second]) + reader.feed(text[second:])
            assert [r.lines() for r in parts] == whole, (cut, second)
