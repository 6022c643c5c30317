"""Which faults a run injected and what became of each, read from its events: the one reader for `testbed check`,
`testbed heal` (ops/remains.py), the catalog and the report.

A fault is a `fault.inject` invoke closed by ok (applied), fail (certainly not applied) or info (outcome unknown:
it may have happened), then, later, `fault.heal` with the same payload (testbed/faults/recording.py). The rules:
- a fault's key is the name its payload gives it (`fault`); a fault recorded without one (a history from before
  the schema required it) is keyed `seq<N>`, N the seq of its injection's invoke. `testbed heal` names that key
  in its `fault.heal` events, so a heal finds the fault it healed;
- an injection's outcome closes its open invoke: the one with the same key, or for an unnamed fault the one its
  `invoke_seq` names (an orphan's info, events/ledger.py) or else the oldest open unnamed one on its device (the
  ledger's rule);
- a heal outcome belongs to the latest injection of its key; its last outcome is the heal's;
- a fault is active unless its injection failed or a heal of it ended ok: an injection never closed, or closed
  with info, may have happened.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from testbed.events.schema import Op

UNKNOWN_KIND = "?"  # a fault whose payload names no kind
# What an outcome adds to the fault's payload (testbed/faults/recording.py, events/ledger.py): not the fault's own.
_OUTCOME_KEYS = ("error", "audit_lost", "invoke_seq", "how")


@dataclass(frozen=True)
class FaultRecord:
    """One injection of a fault and what became of it, as the run's events tell it."""

    key: str  # the fault's name, or seq<N> for an unnamed one (N: its invoke's seq); what fault.heal names
    name: str | None  # the name its payload gave it (None: recorded without one)
    kind: str  # its kind (testbed/faults), UNKNOWN_KIND if the payload names none
    device: str | None  # the device of its fault.inject events (the host, or the proxied device)
    target: str | None  # where it hit, from its payload: its host, device or rank
    trial: int | None
    step: str | None
    data: dict = field(hash=False, compare=False)  # its payload as the injection's invoke recorded it
    inject_seq: int = 0  # the seq of its injection's invoke (of its outcome when no invoke was recorded)
    inject_ns: int | None = None
    inject_wall: float | None = None
    injected: str | None = None  # the injection's outcome: ok, fail, info; None: never closed
    inject_end_seq: int | None = None  # the seq of that outcome
    inject_error: str = ""
    healed: str | None = None  # the last heal's outcome: ok, fail, info; None: no heal ended
    heal_ns: int | None = None
    heal_wall: float | None = None
    heal_error: str = ""

    @property
    def certain(self) -> bool:
        """Whether the injection certainly took effect (ok); an active fault that is not certain may have."""
        return self.injected == "ok"

    @property
    def active(self) -> bool:
        """Whether the fault may still be in place: its injection did not fail and no heal of it ended ok."""
        return self.injected != "fail" and self.healed != "ok"

    def heal_payload(self, **extra) -> dict:
        """The payload of a `fault.heal` event for this fault: its injection's, naming it by its key."""
        return {**self.data, "fault": self.key, "kind": self.kind, **extra}


def fault_key(data: dict, invoke_seq: int) -> str:
    """The key of a fault: the name its payload gives it, else seq<N> (N: its injection's invoke seq)."""
    name = _name(data)
    return name if name is not None else f"seq{invoke_seq}"


def read_faults(events: list[dict]) -> list[FaultRecord]:
    """Every fault injection in a run's events, in the order injected, each with its outcome and its heal's."""
    records: list[FaultRecord] = []
    open_named: dict[str, list[int]] = {}  # key -> indices into records of its open injections, oldest first
    open_unnamed: dict[str | None, list[int]] = {}  # device -> the same, for faults recorded without a name
    latest: dict[str, int] = {}  # key -> index of its latest injection
    for e in events:
        if e["op"] == Op.FAULT_INJECT:
            _inject(e, records, open_named, open_unnamed, latest)
        elif e["op"] == Op.FAULT_HEAL and e["type"] in ("ok", "fail", "info"):
            data = e.get("data") or {}
            name = _name(data)
            index = latest.get(name) if name is not None else None
            if index is None:  # a heal of no fault this history injected (or an unnamed one before heal named it)
                continue
            records[index] = replace(
                records[index],
                healed=e["type"],
                heal_ns=e.get("mono_ns"),
                heal_wall=e.get("wall"),
                heal_error=str(data.get("error", "")) if e["type"] != "ok" else "",
            )
    return records


def active_faults(events: list[dict]) -> list[FaultRecord]:
    """The faults a run's events leave possibly in place (FaultRecord.active)."""
    return [f for f in read_faults(events) if f.active]


def _inject(e: dict, records: list, open_named: dict, open_unnamed: dict, latest: dict) -> None:
    data = e.get("data") or {}
    name = _name(data)
    device = e.get("device")
    if e["type"] == "invoke":
        record = _record(e, data)
        records.append(record)
        index = len(records) - 1
        latest[record.key] = index
        if name is not None:
            open_named.setdefault(name, []).append(index)
        else:
            open_unnamed.setdefault(device, []).append(index)
        return
    if e["type"] not in ("ok", "fail", "info"):
        return
    closed = _closes(name, data, device, records, open_named, open_unnamed)
    if closed is None:  # an outcome with no invoke recorded: the outcome stands for both
        records.append(_record(e, data))
        closed = len(records) - 1
        latest[records[closed].key] = closed
    records[closed] = replace(
        records[closed],
        injected=e["type"],
        inject_end_seq=e["seq"],
        inject_error=str(data.get("error", "")) if e["type"] != "ok" else "",
    )


def _closes(name, data: dict, device, records: list, open_named: dict, open_unnamed: dict) -> int | None:
    """The open injection an outcome closes (its index in records), removed from the open ones; None if none."""
    if name is not None:
        queue = open_named.get(name) or []
        return queue.pop(0) if queue else None
    queue = open_unnamed.get(device) or []
    named_seq = data.get("invoke_seq")
    for i, index in enumerate(queue):
        if records[index].inject_seq == named_seq:
            return queue.pop(i)
    return queue.pop(0) if queue else None


def _name(data: dict) -> str | None:
    """The name a fault's payload gives it (None: none, or not a string)."""
    name = data.get("fault")
    return name if isinstance(name, str) and name else None


def _record(e: dict, data: dict) -> FaultRecord:
    name = _name(data)
    kind = data.get("kind")
    target = next((str(data[k]) for k in ("host", "device", "rank") if data.get(k) is not None), None)
    return FaultRecord(
        key=fault_key(data, e["seq"]),
        name=name,
        kind=kind if isinstance(kind, str) and kind else UNKNOWN_KIND,
        device=e.get("device"),
        target=target,
        trial=e.get("trial"),
        step=e.get("step"),
        data={k: v for k, v in data.items() if k not in _OUTCOME_KEYS},
        inject_seq=e["seq"],
        inject_ns=e.get("mono_ns"),
        inject_wall=e.get("wall"),
    )
