"""`testbed check RUN_DIR`: verify a run from what it saved, in the manner of Jepsen's checkers.

- every invoke is closed by exactly one ok / fail / info, in order, per device;
- every fault injected (or whose injection's outcome is unknown) was healed;
- the fabric read back at the end of the run equals the fabric its history implies: the commands in
  audit.jsonl replayed through the driver's own audit model of its protocol (DriverSpec.audit_model,
  e.g. drivers/scpi/audit.py), never through an emulator.
  Where a switch was read back mid-history (`fabric.observed`: after its actor was restarted, or by
  `testbed heal` after the runner died), the reading must equal the replay up to it, unless calls on that
  switch whose bytes were lost with a process (`info` with audit_lost) explain the difference within the
  ports the run may change; the replay then goes on from the reading. The fabric is the circuits: taking
  ports out of service and back (link.down) changes none; a port left out of service is an unhealed fault;
- no command wrote to a port the inventory reserves or does not allow, or to a read-only device (a port
  disable or enable is a write naming its ports);
- the job's fabric service (testbed/fabric_service/history.py) answered every request a rank made, or `testbed heal`
  recorded it as never answered; and while it ran, every circuit on its ports belonged to one of the
  configurations it may set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drivers.audit import ALL_PORTS
from testbed.contracts.errors import UserError
from testbed.documents.inventory import Inventory
from testbed.events import InvokeLedger, Op, active_faults, read_events, read_jsonl
from testbed.events.run_info import read_run_info
from testbed.events.safe_files import owner
from testbed.fabric_service.history import fabric_within_allowed, requests_answered
from testbed.families.drivers import driver_spec


@dataclass
class CheckResult:
    checks: dict[str, list[str]] = field(default_factory=dict)  # check name -> problems (empty: passed)
    notes: list[str] = field(default_factory=list)  # what a reader should know, e.g. what heal could not see

    @property
    def ok(self) -> bool:
        return not any(self.checks.values())


def check_run(run_dir: Path) -> CheckResult:
    run_dir = Path(run_dir)
    try:
        info = read_run_info(run_dir)  # a link, a FIFO, too large, too deep, a field of a wrong type: exit 2
        inventory = Inventory.model_validate(info["inventory"])
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"{run_dir}: not a readable run folder ({exc}); pass a folder `testbed run` wrote") from None
    events_file, audit_file = read_events(run_dir / "events.jsonl"), read_jsonl(run_dir / "audit.jsonl")
    events, audit = events_file.records, audit_file.records
    result = CheckResult()
    folder_owner = owner(run_dir)
    if folder_owner is not None:  # read, never written: check writes nothing anywhere
        result.notes.append(f"{run_dir} is owned by {folder_owner}: read as another's record, not as your run")
    result.notes += [f.torn for f in (events_file, audit_file) if f.torn]
    try:
        _check(result, events, audit, inventory)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
        # A record of a shape the recorder never writes (each envelope is checked as read; a payload is the
        # operation's own). The checks only read: what they met is said, and nothing was done.
        raise UserError(
            f"{run_dir}: a record of its history is not one `testbed run` writes ({type(exc).__name__}: "
            f"{str(exc)[:200]}); the folder is damaged or forged"
        ) from None
    return result


def _check(result: CheckResult, events: list[dict], audit: list[dict], inventory: Inventory) -> None:
    result.checks["every invoke closed"] = _invokes_closed(events)
    result.checks["every fault healed"] = _faults_healed(events)
    result.checks["final fabric matches history"] = _fabric_matches(events, audit, inventory, result.notes)
    result.checks["writes within the inventory's interlocks"] = _writes_allowed(audit, inventory)
    result.checks["every job request answered"] = requests_answered(events)
    initial = {d: _circuits(c) for d, c in _initial(events).items()}
    result.checks["fabric within the job's allowed configurations"] = fabric_within_allowed(
        events, audit, initial, lambda device: _audit_model(inventory.devices.get(device))
    )


def _invokes_closed(events: list[dict]) -> list[str]:
    """Each completion closes the oldest open invoke of the same operation on the same device (an
    operation such as fault.inject may wrap device operations, so a device can have several open).
    """
    ledger = InvokeLedger()
    problems = []
    for e in events:
        if not ledger.add(e.get("device"), e["op"], e["type"], e):
            problems.append(f"seq {e['seq']}: {e['type']} {e['op']} on {e.get('device') or '(run)'} closes no invoke")
    problems += [
        f"seq {e['seq']}: invoke {e['op']} on {e.get('device') or '(run)'} never closed" for e in ledger.still_open()
    ]
    return problems


def _faults_healed(events: list[dict]) -> list[str]:
    """Every fault that may still be in place (testbed/events/faults.py: not refused, not healed ok)."""
    unsure = {"ok": "", "info": ", its outcome unknown,", None: ", its injection never ended,"}
    return [
        f"fault {f.key} injected at seq {f.inject_seq}{unsure[f.injected]} was never healed"
        for f in active_faults(events)
    ]


def _fabric_matches(events: list[dict], audit: list[dict], inv: Inventory, notes: list[str]) -> list[str]:
    final = next((e for e in reversed(events) if e["op"] == Op.FABRIC_FINAL), None)
    if final is None:
        return ["no final read-back recorded (the run ended before it): cannot compare"]
    if final["data"].get("lab_gone"):
        notes.append(f"nothing to read back at the end: {final['data']['lab_gone']}")
        return []
    problems = []
    initial = _initial(events)
    marked: dict = next((e["data"] for e in events if e["op"] == Op.FABRIC_INITIAL), {})
    managed = _mapping(marked.get("managed"))
    for device, circuits in _mapping(final["data"].get("circuits")).items():
        dev = inv.devices.get(device)
        model = _audit_model(dev)
        if model is None:
            if dev is not None:
                notes.append(f"{device}: its driver {dev.driver} has no audit model: its history is not replayed")
            continue
        start_circuits = initial.get(device)
        if not isinstance(start_circuits, dict):
            problems.append(f"{device}: no circuits recorded when the run identified it: cannot replay")
            continue
        state = _circuits(start_circuits)
        commands = [(n, a["data"]) for n, a in enumerate(audit) if a["device"] == device and a["direction"] == "tx"]
        replayed_to, since_seq = 0, 0  # audit position and event seq the replay has reached
        for seen_at in (e for e in events if e["op"] == Op.FABRIC_OBSERVED and e.get("device") == device):
            upto = seen_at["data"].get("audit_line")
            if not isinstance(upto, int) or isinstance(upto, bool):
                problems.append(f"{device}: read back at seq {seen_at['seq']} with no audit line: cannot replay to it")
                break
            state = model.replay(state, [c for n, c in commands if replayed_to <= n < upto])
            seen = _circuits(seen_at["data"].get("circuits"))
            if seen != state:
                lost = [
                    e["seq"]
                    for e in events
                    if e.get("device") == device
                    and e["type"] == "info"
                    and (e.get("data") or {}).get("audit_lost")
                    and since_seq < e["seq"] < seen_at["seq"]
                ]
                ports = {p for pair in set(seen.items()) ^ set(state.items()) for p in pair}
                outside = sorted(ports - set(_ports(managed[device]))) if device in managed else []
                where = f"{device}: read back at seq {seen_at['seq']} ({seen_at['data'].get('why', '')})"
                if not lost or outside:
                    why = f"port(s) {outside} are not the run's" if lost else "no call's outcome is unknown"
                    problems.append(f"{where} differs from its history on ports {sorted(ports)}, and {why}")
                else:
                    notes.append(
                        f"{where}: ports {sorted(ports)} differ from the history, explained by the calls "
                        f"whose bytes were lost (seq {lost}); replayed on from the reading"
                    )
            state, replayed_to, since_seq = seen, upto, seen_at["seq"]
        implied = model.replay(state, [c for n, c in commands if n >= replayed_to])
        seen = _circuits(circuits)
        if implied != seen:
            missing = sorted(set(implied.items()) - set(seen.items()))
            extra = sorted(set(seen.items()) - set(implied.items()))
            problems.append(
                f"{device}: the switch holds {len(seen)} circuits, the history implies {len(implied)}; "
                f"implied but absent {missing[:8]}, present but not implied {extra[:8]}"
            )
    return problems


def _initial(events: list[dict]) -> dict[str, dict]:
    """What each switch held when the run identified it (as recorded: string keys)."""
    initial = {  # a run from before the fabric.initial mark: what each switch's identify read
        e["device"]: e["data"]["value"]["circuits"]
        for e in events
        if e["op"].endswith(".identify")
        and e["type"] == "ok"
        and isinstance(_mapping(e["data"].get("value")).get("circuits"), dict)
    }
    marked: dict = next((e["data"] for e in events if e["op"] == Op.FABRIC_INITIAL), {})
    initial.update({d: c for d, c in _mapping(marked.get("circuits")).items() if isinstance(c, dict)})
    return initial


def _ports(value) -> list:
    return value if isinstance(value, list) else []


def _mapping(value) -> dict:
    """A recorded object, or {} where the history holds something else (a damaged or forged one)."""
    return value if isinstance(value, dict) else {}


def _circuits(raw) -> dict[int, int]:
    """Recorded circuits (ingress -> egress port, as strings or numbers) as numbers; UserError if they are not."""
    try:
        return {int(i): int(e) for i, e in raw.items()}
    except (AttributeError, TypeError, ValueError, OverflowError):
        raise UserError(
            f"circuits recorded as {json.dumps(raw, default=str)[:80]}, not ingress: egress port numbers; the "
            "run's history is damaged (not what `testbed run` records)"
        ) from None


def _audit_model(dev):
    """The driver's model of what its commands do to the device (None: the driver has none)."""
    if dev is None or not hasattr(dev, "size"):
        return None
    spec = driver_spec(dev.driver)
    return spec.audit_model(dev.size) if spec is not None and spec.audit_model is not None else None


def _writes_allowed(audit: list[dict], inv: Inventory) -> list[str]:
    problems: list[str] = []
    models: dict[str, Any] = {}  # device -> its driver's audit model (None: it has none)
    for a in audit:
        if a["direction"] != "tx":
            continue
        dev: Any = inv.devices.get(a["device"])  # a switch's config (size, port_allowed, read_only) when it has a model
        if a["device"] not in models:
            models[a["device"]] = _audit_model(dev)
        model = models[a["device"]]
        if model is None or dev is None:
            continue
        text = a["data"].strip()
        where = f"{a['device']} at {a['mono_ns']}: {text[:80]!r}"
        for write in model.writes(text):
            if dev.read_only:
                problems.append(f"{where}: write to a read-only device")
                break
            if write.ports is ALL_PORTS:
                if any(not dev.port_allowed(p) for p in range(1, 2 * dev.size + 1)):
                    problems.append(f"{where}: removes every circuit, including reserved or disallowed ports")
                continue
            bad = sorted({p for p in write.ports if not dev.port_allowed(p)})
            if bad:
                problems.append(f"{where}: touches port(s) {bad}, reserved or not allowed by the inventory")
    return problems
