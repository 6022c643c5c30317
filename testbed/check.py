"""`testbed check RUN_DIR`: verify a run from what it saved, in the manner of Jepsen's checkers.

- every invoke is closed by exactly one ok / fail / info, in order, per device;
- every fault injected (or whose injection's outcome is unknown) was healed;
- the fabric read back at the end of the run equals the fabric its history implies: the commands in
  audit.jsonl replayed through the Polatis protocol engine (the same grammar model the emulator runs).
  Where a switch was read back mid-history (`fabric.observed`: after its actor was restarted, or by
  `testbed heal` after the runner died), the reading must equal the replay up to it, unless calls on that
  switch whose bytes were lost with a process (`info` with audit_lost) explain the difference within the
  ports the run may change; the replay then goes on from the reading;
- no command wrote to a port the inventory reserves or does not allow, or to a read-only device.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from emulators.polatis import PolatisEngine
from emulators.scpi import parse_channel_list
from emulators.spec import OcsSpec
from testbed.config.inventory import Inventory, OcsDevice
from testbed.errors import UserError
from testbed.events import InvokeLedger, Op, read_jsonl

# Polatis SCPI commands that change the switch (short forms, upper case) and whether they carry ports.
WRITE_HEADERS = (
    ":OXC:SWIT:CONN:ADD",
    ":OXC:SWIT:CONN:SUB",
    ":OXC:SWIT:CONN:ONLY",
    ":OXC:SWIT:DISC:ALL",
    ":OXC:SWIT:PORT:DIS",
    ":OXC:SWIT:PORT:ENAB",
    "*RST",
)


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
        info = json.loads((run_dir / "run.json").read_text())
        inventory = Inventory.model_validate(info["inventory"])
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"{run_dir}: not a readable run folder ({exc}); pass a folder `testbed run` wrote") from None
    events_file, audit_file = read_jsonl(run_dir / "events.jsonl"), read_jsonl(run_dir / "audit.jsonl")
    events, audit = events_file.records, audit_file.records
    result = CheckResult()
    result.notes += [f.torn for f in (events_file, audit_file) if f.torn]
    result.checks["every invoke closed"] = _invokes_closed(events)
    result.checks["every fault healed"] = _faults_healed(events)
    result.checks["final fabric matches history"] = _fabric_matches(events, audit, inventory, result.notes)
    result.checks["writes within the inventory's interlocks"] = _writes_allowed(audit, inventory)
    return result


def _invokes_closed(events: list[dict]) -> list[str]:
    """Each completion closes the oldest open invoke of the same operation on the same device (an
    operation such as fault.inject may wrap device operations, so a device can have several open)."""
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
    active: dict[str, dict] = {}
    for e in events:
        if e["op"] == Op.FAULT_INJECT and e["type"] in ("ok", "info"):  # info: it may have happened
            active[e.get("data", {}).get("fault", str(e["seq"]))] = e
        elif e["op"] == Op.FAULT_HEAL and e["type"] == "ok":
            active.pop(e.get("data", {}).get("fault", ""), None)
    return [f"fault {name} injected at seq {e['seq']} was never healed" for name, e in active.items()]


def _fabric_matches(events: list[dict], audit: list[dict], inv: Inventory, notes: list[str]) -> list[str]:
    final = next((e for e in reversed(events) if e["op"] == Op.FABRIC_FINAL), None)
    if final is None:
        return ["no final read-back recorded (the run ended before it): cannot compare"]
    if final["data"].get("lab_gone"):
        notes.append(f"nothing to read back at the end: {final['data']['lab_gone']}")
        return []
    problems = []
    initial = {
        e["device"]: e["data"]["value"]["circuits"] for e in events if e["op"] == "ocs.identify" and e["type"] == "ok"
    }
    marked = next((e["data"] for e in events if e["op"] == Op.FABRIC_INITIAL), {})
    initial.update({d: c for d, c in marked.get("circuits", {}).items() if isinstance(c, dict)})
    managed = marked.get("managed", {})
    for device, circuits in final["data"]["circuits"].items():
        dev = inv.devices.get(device)
        if not isinstance(dev, OcsDevice):
            continue
        start_circuits = initial.get(device)
        if not isinstance(start_circuits, dict):
            problems.append(f"{device}: no circuits recorded when the run identified it: cannot replay")
            continue
        state = _circuits(start_circuits)
        commands = [(n, a["data"]) for n, a in enumerate(audit) if a["device"] == device and a["direction"] == "tx"]
        replayed_to, since_seq = 0, 0  # audit position and event seq the replay has reached
        for seen_at in (e for e in events if e["op"] == Op.FABRIC_OBSERVED and e.get("device") == device):
            upto = seen_at["data"]["audit_line"]
            state = _replay(dev.size, state, [c for n, c in commands if replayed_to <= n < upto])
            seen = _circuits(seen_at["data"]["circuits"])
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
                outside = sorted(ports - set(managed[device])) if device in managed else []
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
        implied = _replay(dev.size, state, [c for n, c in commands if n >= replayed_to])
        seen = _circuits(circuits)
        if implied != seen:
            missing = sorted(set(implied.items()) - set(seen.items()))
            extra = sorted(set(seen.items()) - set(implied.items()))
            problems.append(
                f"{device}: the switch holds {len(seen)} circuits, the history implies {len(implied)}; "
                f"implied but absent {missing[:8]}, present but not implied {extra[:8]}"
            )
    return problems


def _circuits(raw: dict) -> dict[int, int]:
    return {int(i): int(e) for i, e in raw.items()}


def _replay(size: int, start: dict[int, int], commands: list[str]) -> dict[int, int]:
    """The circuits the switch holds after `commands`, from the circuits it held when the run identified it."""
    engine = PolatisEngine(OcsSpec(name="model", size=size, switching_time_ms=0, jitter_ms=0), clock=lambda: 0.0)
    engine.conn.update(start)
    session = engine.new_session()
    for line in commands:
        session.handle(line.rstrip("\r\n"), 0.0)
    return dict(engine.conn)


def _writes_allowed(audit: list[dict], inv: Inventory) -> list[str]:
    problems = []
    for a in audit:
        if a["direction"] != "tx":
            continue
        dev = inv.devices.get(a["device"])
        text = a["data"].strip()
        header = text.split(" ", 1)[0].upper()
        if not isinstance(dev, OcsDevice) or not any(header.startswith(h) for h in WRITE_HEADERS):
            continue
        where = f"{a['device']} at {a['mono_ns']}: {text[:80]!r}"
        if dev.read_only:
            problems.append(f"{where}: write to a read-only device")
            continue
        if header.startswith((":OXC:SWIT:DISC:ALL", "*RST")):
            if dev.reserved_ports or dev.allowed_ports is not None:
                problems.append(f"{where}: removes every circuit, including reserved or disallowed ports")
            continue
        ports: list[int] = []
        for chunk in text.split("(@")[1:]:
            ports += parse_channel_list("(@" + chunk.split(")", 1)[0] + ")")
        bad = sorted({p for p in ports if not dev.port_allowed(p)})
        if bad:
            problems.append(f"{where}: touches port(s) {bad}, reserved or not allowed by the inventory")
    return problems
