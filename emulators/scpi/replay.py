"""Replaying a run's audit log through a fresh emulator front end (`testbed replay`, testbed/ops/audit_replay.py).

A replay session takes the messages a driver sent, one audit record at a time, and says what the emulator
answers. It also says which answers are worth comparing and how a reply's text is compared, because that is
the protocol's business, not the replayer's: an SCPI set command answers nothing, a TL1 response carries the
device's date and time, a NETCONF reply its message-id. Every front end that can replay gives a class with
this shape (testbed.ops.audit_replay.ReplaySession names it as a Protocol).
"""

from __future__ import annotations

from dataclasses import dataclass

from emulators.scpi.ocs import PolatisEngine
from emulators.spec import OcsSpec

TIMING_QUERIES = frozenset({"*OPC?"})  # answers that only say when, never what


@dataclass(frozen=True)
class Exchange:
    """What the emulator answered to one recorded message: reply lines (terminators stripped) and the
    time (s, the replay's clock) by which it could have sent the last of them.
    """

    lines: list[str]
    at: float


def text_lines(text: str) -> list[str]:
    """Reply text -> its lines without terminators ("1\\r\\n" -> ["1"]; "\\r\\n" -> [""])."""
    if not text:
        return []
    parts = text.split("\n")
    if parts[-1] == "":
        parts.pop()
    return [p.rstrip("\r") for p in parts]


def engine_with(spec: OcsSpec, circuits: dict | None) -> PolatisEngine:
    """A fresh switch model as `--emulate` boots it, holding the circuits a run found (ingress -> egress)."""
    engine = PolatisEngine(spec, clock=lambda: 0.0)
    if circuits is not None:
        engine.conn = {int(i): int(e) for i, e in circuits.items()}
        engine.conn_to = {e: i for i, e in engine.conn.items()}
    return engine


class ScpiReplay:
    """The SCPI front end's replay: each recorded message is one or more program messages (lines)."""

    def __init__(self, engine: PolatisEngine) -> None:
        self.session = engine.new_session()

    def exchange(self, message: str, now: float) -> Exchange:
        lines, at = [], now
        for line in text_lines(message):
            if not line.strip():
                continue
            for reply in self.session.handle(line, now):
                if not reply.cancelled:
                    lines += text_lines(reply.data.decode("latin-1"))
                    at = max(at, reply.at)
        return Exchange(lines, at)

    def recorded(self, text: str) -> list[str]:
        return text_lines(text)

    def verdict(self, message: str, recorded: list[str], emulated: list[str]) -> str:
        """Says "compare", "skip" (a set command that answered nothing: its effect shows in later answers and
        in :SYST:ERR?) or "timing" (an *OPC? the device never answered: a timeout says only when).
        """
        command = message.rstrip("\r\n")
        is_query = any(unit.strip().split(" ", 1)[0].endswith("?") for unit in command.split(";"))
        if not (is_query or recorded or emulated):
            return "skip"
        if command.strip().upper() in TIMING_QUERIES and not recorded:
            return "timing"
        return "compare"
