"""Record and replay: does the emulator answer what the device answered?

`replay_run(run_dir)` takes a run's audit.jsonl (every message sent to a device and every reply, in
order), rebuilds a fresh emulator engine for each device from the run's inventory snapshot (run.json),
starts it in the state the device was found in, feeds it the recorded messages in order and compares
each reply with the recorded one. On a lab run, every disagreement is a place where the emulator (and so
every emulated test) models the real device wrongly; on an emulated run, replay must agree 100 %.

Rules of the comparison:
- how replies are compared is the protocol's (its ReplaySession): SCPI replies as text, line by line, with
  terminators stripped; TL1 responses without their date-and-time header, autonomous messages and
  in-progress acknowledgments; NETCONF replies as canonical XML (prefixes, order and layout do not count,
  the message-id does); timestamps are never compared;
- the engine is fed at the recorded pace (a power reading taken mid-move is replayed mid-move), but never
  before the engine could have sent its previous reply, so a query that followed `*OPC?` sees the
  settled switch whatever the real switch's speed was;
- an answer that only says "settled now" (`*OPC?`) and that the device never gave (a timeout) is not
  compared; nor is a TL1 or NETCONF request the device left unanswered;
- the engine starts with the circuits the run found (its `fabric.initial` mark); port states, input
  power and timing come from the inventory (the same spec `--emulate` boots);
- what the run's twin control API did (faults, power changes) is not in the audit log; replaying a run
  that injected faults may disagree where a fault changed what the device saw.

A device is replayed when its family's emulator can replay its driver's protocol (a ReplaySession: an OCS
over SCPI, TL1 or NETCONF); the others are reported as not replayable yet.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol, TextIO

from testbed.contracts.errors import EXIT_BAD_INPUT, EXIT_EXPERIMENT_FAILED, EXIT_OK, UserError
from testbed.events import Op, read_events, read_jsonl
from testbed.events.run_info import read_run_info


class Exchange(Protocol):
    lines: list[str]  # the emulator's reply, as lines to compare
    at: float  # when the emulator could have sent the last of it


class ReplaySession(Protocol):
    """A fresh emulator front end fed a run's recorded messages (emulators/scpi/replay.py has the SCPI one). How
    replies are compared is the protocol's business: the session says it.
    """

    def exchange(self, message: str, now: float) -> Exchange:
        """Feed one recorded message at `now` (s after the device's first); what the emulator answers."""

    def recorded(self, text: str) -> list[str]:
        """The recorded replies' text as the lines to compare (timestamps and ids made comparable)."""

    def verdict(self, message: str, recorded: list[str], emulated: list[str]) -> str:
        """Says "compare", "skip" (nothing to compare) or "timing" (the answer only says when)."""


@dataclass(frozen=True)
class Disagreement:
    device: str
    index: int  # 0-based position of the message among the device's messages (tx records)
    audit_line: int  # 1-based line of the message in audit.jsonl
    command: str
    recorded: str  # the device's reply, lines joined by "\n"; "" if it sent none
    emulator: str  # the engine's reply, same form

    def __str__(self) -> str:
        return (
            f"{self.device} #{self.index} (audit.jsonl:{self.audit_line}) {self.command!r}: "
            f"device {_shown(self.recorded)}, emulator {_shown(self.emulator)}"
        )


@dataclass
class DeviceReplay:
    device: str
    kind: str
    replayed: bool
    note: str = ""  # why not replayed, or how it started
    messages: int = 0  # messages sent to the device
    compared: int = 0  # queries (and anything either side answered) compared
    agreed: int = 0
    timing_only: int = 0  # messages the device left unanswered (an `*OPC?`, a TL1 or NETCONF timeout)
    disagreements: list[Disagreement] = field(default_factory=list)

    @property
    def disagreed(self) -> int:
        return len(self.disagreements)


@dataclass
class ReplayReport:
    run_dir: str
    devices: list[DeviceReplay]

    @property
    def compared(self) -> int:
        return sum(d.compared for d in self.devices)

    @property
    def agreed(self) -> int:
        return sum(d.agreed for d in self.devices)

    @property
    def disagreed(self) -> int:
        return sum(d.disagreed for d in self.devices)

    @property
    def disagreements(self) -> list[Disagreement]:
        return [x for d in self.devices for x in d.disagreements]

    @property
    def ok(self) -> bool:
        return self.disagreed == 0

    def summary(self) -> str:
        pct = f" ({100 * self.agreed / self.compared:.1f} %)" if self.compared else ""
        return f"{self.compared} queries compared, {self.agreed} agreed{pct}, {self.disagreed} disagreed"

    def to_dict(self) -> dict:
        return {
            "run_dir": self.run_dir,
            "compared": self.compared,
            "agreed": self.agreed,
            "disagreed": self.disagreed,
            "devices": [{**asdict(d), "disagreed": d.disagreed} for d in self.devices],
        }


def replay_run(run_dir: str | Path) -> ReplayReport:
    """Replay every device of a run through a fresh emulator; raises UserError for a folder that is no run."""
    from testbed.documents.inventory import Inventory

    run_dir = Path(run_dir)
    try:
        info = read_run_info(run_dir)  # a link, a FIFO, too large, too deep, a field of a wrong type: exit 2
        audit = read_jsonl(run_dir / "audit.jsonl").numbered()
        events = read_events(run_dir / "events.jsonl").numbered() if os.path.lexists(run_dir / "events.jsonl") else []
        inventory = Inventory.model_validate(info["inventory"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"{run_dir}: not a readable run folder ({exc}); pass a folder `testbed run` wrote "
            "(with run.json and audit.jsonl)"
        ) from None
    seed = int(info.get("seed") or 0)
    by_device: dict[str, list[tuple[int, dict]]] = {}
    for line_no, record in audit:
        by_device.setdefault(str(record.get("device")), []).append((line_no, record))
    initial = _initial_circuits(events)
    devices = [_replay_device(name, records, inventory, seed, initial.get(name)) for name, records in by_device.items()]
    return ReplayReport(str(run_dir), devices)


def _replay_device(name: str, records: list[tuple[int, dict]], inventory, seed: int, circuits) -> DeviceReplay:
    from testbed.twin.bridge import replay_session  # replay is an emulator tool: it reaches them through the bridge

    dev = inventory.devices.get(name)
    messages = sum(1 for _, r in records if r.get("direction") == "tx")
    if dev is None:
        return DeviceReplay(name, "?", False, "not in the run's inventory: not replayable", messages)
    session = replay_session(inventory, name, seed, circuits if isinstance(circuits, dict) else None)
    if session is None:
        return DeviceReplay(
            name, dev.kind, False, f"not replayable yet (no replay for a {dev.kind} driven by {dev.driver})", messages
        )
    result = DeviceReplay(name, dev.kind, True, messages=messages)
    if isinstance(circuits, dict):
        result.note = f"started with the {len(circuits)} circuit(s) the run found"
    else:
        result.note = "no circuits recorded when the run identified it: started without circuits"

    # Group: each message with the replies recorded after it, up to the next message.
    groups: list[tuple[int, dict, list[str]]] = []
    for line_no, record in records:
        if record.get("direction") == "tx":
            groups.append((line_no, record, []))
        elif record.get("direction") == "rx" and groups:
            groups[-1][2].append(str(record.get("data", "")))
    t0 = records[0][1].get("mono_ns", 0) if records else 0
    floor = 0.0  # seconds: not before the engine could have sent its previous reply
    for index, (line_no, record, rx) in enumerate(groups):
        now = max(floor, (int(record.get("mono_ns", t0)) - t0) / 1e9)
        sent = str(record.get("data", ""))
        answer = session.exchange(sent, now)
        floor = max(floor, answer.at)
        recorded = session.recorded("".join(rx))
        verdict = session.verdict(sent, recorded, answer.lines)
        if verdict == "skip":
            continue
        if verdict == "timing":
            result.timing_only += 1
            continue
        result.compared += 1
        if recorded == answer.lines:
            result.agreed += 1
        else:
            result.disagreements.append(
                Disagreement(name, index, line_no, sent.rstrip("\r\n"), "\n".join(recorded), "\n".join(answer.lines))
            )
    return result


def _initial_circuits(events: list[tuple[int, dict]]) -> dict[str, dict]:
    """The circuits each switch held when the run found it: its `fabric.initial` mark, or (a run recorded
    before the mark existed) what each device's first successful identify read.
    """
    for _, e in events:
        if e.get("op") == Op.FABRIC_INITIAL:
            circuits = e["data"].get("circuits")
            mapping = circuits.items() if isinstance(circuits, dict) else ()
            return {sw: c for sw, c in mapping if _port_pairs(c)}
    found: dict[str, dict] = {}
    for _, e in events:
        if str(e.get("op", "")).endswith(".identify") and e.get("type") == "ok" and e.get("device") not in found:
            value = e["data"].get("value")
            if isinstance(value, dict) and _port_pairs(value.get("circuits")):
                found[e["device"]] = value["circuits"]
    return found


def _port_pairs(circuits) -> bool:
    """Whether recorded circuits are ingress: egress port numbers (as a run records them: strings or numbers). Others
    (a damaged or forged history) are not handed to the emulator: the device replays from no circuits, and says so.
    """
    if not isinstance(circuits, dict):
        return False
    try:
        return all(int(i) > 0 and int(o) > 0 for i, o in circuits.items())
    except (TypeError, ValueError, OverflowError):
        return False


def _shown(reply: str) -> str:
    return repr(reply) if reply else "no reply"


# -- CLI -------------------------------------------------------------------------------------------


def print_report(report: ReplayReport, out: TextIO, limit: int = 20) -> None:
    for d in report.devices:
        if not d.replayed:
            out.write(f"{d.device}: {d.note} ({d.messages} messages)\n")
            continue
        status = "agrees" if not d.disagreements else f"{d.disagreed} disagreement(s)"
        extra = f", {d.timing_only} unanswered (timing only) not compared" if d.timing_only else ""
        out.write(
            f"{d.device}: {status}: {d.compared} queries compared, {d.agreed} agreed{extra} "
            f"({d.messages} messages; {d.note})\n"
        )
        for x in d.disagreements[:limit]:
            out.write(f"  {x}\n")
        if d.disagreed > limit:
            out.write(f"  ... and {d.disagreed - limit} more\n")
    out.write(f"replay: {report.summary()}\n")


def main(run_dir: str | Path, out: TextIO | None = None) -> int:
    """`testbed replay RUN_DIR`: 0 if the emulator agrees with every reply, 1 if not, 2 if it is no run."""
    out = out or sys.stdout
    try:
        report = replay_run(run_dir)
    except UserError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_BAD_INPUT
    print_report(report, out)
    return EXIT_OK if report.ok else EXIT_EXPERIMENT_FAILED
