"""What the panel's commands do to its circuits, for `testbed check` (DriverSpec.audit_model)."""

from __future__ import annotations

from dataclasses import dataclass

from patchpanel.protocol import CONN, DISC


@dataclass(frozen=True)
class Write:
    command: str
    ports: frozenset[int]


class PanelAuditModel:
    def __init__(self, size: int) -> None:
        self.size = size

    def writes(self, line: str) -> list[Write]:
        line = line.strip()
        if m := CONN.match(line):
            return [Write(line, frozenset({int(m.group(1)), int(m.group(2))}))]
        if m := DISC.match(line):
            return [Write(line, frozenset({int(m.group(1))}))]
        return []

    def replay(self, circuits: dict[int, int], lines: list[str]) -> dict[int, int]:
        state = dict(circuits)
        for line in lines:
            line = line.strip()
            if m := CONN.match(line):
                i, e = int(m.group(1)), int(m.group(2))
                if 1 <= i <= self.size < e <= 2 * self.size and e not in state.values():
                    state[i] = e
            elif m := DISC.match(line):
                state.pop(int(m.group(1)), None)
        return state
