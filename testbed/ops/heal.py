"""`testbed heal RUN_DIR`: restore the lab after a run whose runner died (kill -9, a crash, the machine's
power), from what the run recorded before it died.

What "restore the lab" means, and so what heal does, in this order:
- every invoke the run left open is closed with `info`: the runner died before its outcome was known;
- every fault the history leaves active (injected, or whose injection's outcome is unknown, without a
  later `fault.heal` ok) is healed by its kind (FaultKind.heal_after_crash, testbed/faults): process.hang
  is SIGCONT to the rank's process group; process.kill, and gpu.fail on a lab, leave nothing to undo but
  the rank's job (the rank was killed; the GPU was only marked failed in the run's events); the twin's own
  faults go through its control API (recover_gpu, power_on, stop_straggle, and proxy.reset for transport.*);
  on a lab, transport.* removes the run's toxic (or enables the proxy) through the device's Toxiproxy API;
  link.down enables the switch ports the run disabled, through the switch's own procedure;
- every rank the run started and did not see stop is stopped (SIGTERM, SIGCONT, SIGKILL after a grace);
- every switch returns to the circuits it held before the run (the `fabric.initial` mark), on the ports
  the run may change (its configurations and its job's fabric) and nowhere else. Not the state its history
  implies: the calls the runner had under way when it died have no known outcome, and the fabric the
  run found is what the lab's owner expects back (the design's rule: a run restores the fabric it found);
- the devices are locked while heal drives them, as a run locks them (a run still holding them is
  refused), and every write goes through the inventory's interlocks (the guard a run uses);
- what is left of the runner's local Ray instance is ended.
A photonic chip's heaters are left as they are: a run does not record their setting before it starts.

An emulated run's twin exits with its runner (stdin EOF), and its devices, faults, jobs and circuits go
with it: heal confirms in /proc that the twin process is gone and records that; the twin's leftover rank
processes, if any, are ended. A twin still alive is healed like a lab, through its endpoints and control.
A `--netns` twin removes its namespaces and links as it exits; one killed outright leaves them, and heal then
ends the processes inside them and removes them (docs/netns.md), recognising the run's by the tag in their names.

Heal appends what it found and did to the run's own history, so `testbed check RUN_DIR` can verify the
healed run: events (`info` closings, invoke/ok/fail of each heal operation, a `fabric.observed` mark for
each switch as heal found it, `fabric.final`, `run.healed`) and, in audit.jsonl, every byte it exchanged.
A last line torn by the kill is set aside (events.jsonl.torn) and said so.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from testbed.config.device import DeviceConfig
from testbed.contracts.errors import EXIT_EXPERIMENT_FAILED, EXIT_OK, UserError
from testbed.documents.inventory import Inventory
from testbed.engine.ray_session import leftovers, runner_alive, session_folder_problem
from testbed.engine.run_marks import (
    NETNS_MARKS,
    mark_problem,
    netns_mark_name,
    process_problem,
    ray_mark_name,
    read_process_records,
    unmark_netns,
)
from testbed.events import Event, Op, orphan_outcome, read_events, read_jsonl, set_aside_torn_line
from testbed.fabric_service.history import windows as service_windows
from testbed.families import family_of
from testbed.faults import FAULT_KINDS
from testbed.ops.remains import UNKNOWN, Findings, RunFolder, find, read_run
from testbed.ops.trust import refuse_foreign_folder, user_inventory
from testbed.results.folder import SummaryCollector, write_json
from testbed.results.recorder import Recorder, count_lines

# How long heal waits for the killed leftovers to be gone. A killed process exits once the kernel has freed its
# memory; only one stuck in the kernel (a hung disk) takes longer, and heal then says so.
LEFTOVER_EXIT_S = 10.0

# --- talking to the lab ------------------------------------------------------------------------------


class HealDevices:
    """The devices of the run as heal reaches them: in-process device actors (the runner's own code: its
    drivers, procedures and interlock guard), the twin's control when there is a live twin, and the
    run's history, which every call is appended to.
    """

    def __init__(self, inventory: Inventory, recorder: Recorder, control=None) -> None:
        self.inventory = inventory
        self.recorder = recorder
        self.control = control  # emulators.control.TwinControl, or None on a lab
        self.leases = None  # testbed.leases.HeldLeases on a lab: checked before every command
        self._actors: dict = {}

    def actor(self, device: str):
        from testbed.engine.device_actor import DeviceActor

        if device not in self._actors:
            dev: DeviceConfig = self.inventory.devices[device]
            transport: Any = dev.transport  # a union of the registered transports, built at run time
            # The run's own actor code, its family's interlocks on every write.
            policy = family_of(dev).policy(device, dev)
            self._actors[device] = DeviceActor(device, dev.driver, transport.settings(), policy, dev.kind)
        return self._actors[device]

    def operation(self, device: str, name: str) -> str:
        """The procedure that does `name` (read_fabric, reconfigure) on this device's family."""
        procedure = family_of(self.inventory.devices[device]).operation(name)
        if procedure is None:
            raise HealFailed(f"{device}: its family has no {name!r} operation")
        return procedure

    def call(self, device: str, procedure: str, kwargs: dict, step: str):
        """One procedure on a device, recorded as the runner records it (invoke, audit, marks, outcome)."""
        if self.leases is not None:
            self.leases.check()
        actor = self.actor(device)
        self.recorder.invoke(device, procedure, kwargs, step)
        result = actor.run(procedure, kwargs)
        self.recorder.outcome(device, step, procedure, result)
        if result.status != "ok":
            raise HealFailed(f"{device}: {procedure} {result.status}: {(result.error or '').strip()[:300]}")
        return result.value

    def close(self) -> None:
        for actor in self._actors.values():
            try:
                actor.close()
            except Exception:  # closing a connection that already broke
                pass
        if self.control is not None:
            self.control.close()


class HealFailed(Exception):
    """One heal operation did not succeed (the report says which; heal exits 1)."""


# --- heal ----------------------------------------------------------------------------------------------


@dataclass
class HealReport:
    done: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def heal_run(run_dir: Path, console: Console, inventory_file: str | None = None) -> int:
    """Heal the run in `run_dir`, driving the lab as the user's inventory describes it: the file the run recorded,
    or `inventory_file` (--inventory); see testbed.ops.trust for what heal believes of the folder.
    """
    run_dir = Path(run_dir)
    refuse_foreign_folder(run_dir, "heal")
    run = read_run(run_dir)
    host = run.info.get("host", {})
    runner = run.info.get("runner") or {"pid": host.get("pid"), "hostname": host.get("hostname")}
    if runner.get("hostname") not in (None, socket.gethostname()):
        raise UserError(
            f"{run_dir}: the run was started on {runner['hostname']}; run `testbed heal` there, where it can see "
            "whether the runner is gone (and its device locks, its twin, its Ray instance)"
        )
    if runner.get("pid") is not None and _runner_still_runs(runner):
        raise UserError(
            f"{run_dir}: its runner (pid {runner['pid']}) is still running; stop it first (Ctrl-C or SIGTERM "
            "heals and tears down by itself), and heal only what a runner that died left behind"
        )
    report = HealReport()
    for name in ("events.jsonl", "audit.jsonl"):
        torn = set_aside_torn_line(run_dir / name)
        if torn:
            report.notes.append(torn)
    run.events = read_events(run_dir / "events.jsonl").records
    found = find(run.events)
    netns_left = _netns_leftovers(run)
    if not found.anything and all(w.stop is not None for w in service_windows(run.events)) and not netns_left:
        for note in report.notes:
            console.print(f"note: {note}", soft_wrap=True, markup=False)
        what = "it was healed before" if found.healed_before else "the run ended and left nothing active"
        console.print(f"nothing to heal in {run_dir}: {what}", soft_wrap=True, markup=False, highlight=False)
        return EXIT_OK

    gone = _twin_gone(run.info)
    # The lab as the user describes it, never as run.json does (its addresses, interlocks and secrets); a twin that
    # went with its run leaves no device to drive.
    inventory = user_inventory(run_dir, run.info, inventory_file) if gone is None else None
    with contextlib.ExitStack() as stack:
        # The devices are locked before anything is written: a run holding one is refused, nothing done.
        recorder = Recorder.reopen(run_dir, run.run_id)
        stack.callback(recorder.close)
        lab = None if inventory is None else stack.enter_context(_lab_session(run, inventory, found, recorder, report))
        _heal(run, found, recorder, lab, gone, report)
    _update_run_files(run_dir, run.info, report)
    for line in report.notes:
        console.print(f"note: {line}", soft_wrap=True, markup=False, highlight=False)
    for line in report.done:
        console.print(f"healed: {line}", soft_wrap=True, markup=False, highlight=False)
    for line in report.problems:
        console.print(f"[red]not healed:[/] {escape(line)}", soft_wrap=True, highlight=False)
    return EXIT_EXPERIMENT_FAILED if report.problems else EXIT_OK


def _heal(
    run: RunFolder, found: Findings, recorder: Recorder, lab: HealDevices | None, gone: str | None, report
) -> None:
    """Everything heal appends to the run's history, in order (`lab` None: the twin went with the run)."""
    runner = run.info.get("runner") or {}
    recorder.emit(
        "mark",
        Op.HEAL_START,
        data={
            "by": {"pid": os.getpid(), "hostname": socket.gethostname()},
            "runner": runner,
            "torn": report.notes,
            "open_invokes": len(found.open_invokes),
            "faults": [f.name for f in found.faults],
            "jobs": [f"{j.get('host')}:{j.get('pid')}" for j in found.jobs],
        },
    )
    for e in found.open_invokes:
        recorder.emit(
            "info",
            e["op"],
            device=e.get("device"),
            step=e.get("step"),
            trial=e.get("trial"),
            data=orphan_outcome(e["op"], e.get("data") or {}, UNKNOWN, invoke_seq=e["seq"]),
        )
    if found.open_invokes:
        report.done.append(f"closed {len(found.open_invokes)} open operation(s) with info (outcome unknown)")
    _close_fabric_service(run.events, recorder, report)
    if gone is not None:
        _record_lab_gone(run.path, run.run_id, recorder, found, gone, report)
        _remove_netns(run, report)
    elif lab is not None:
        _heal_faults(lab, found, report)
        _stop_jobs(lab, found, report)
        _restore_fabric(lab, run.path, found, report)
    _end_ray_leftovers(run.info, recorder, report, run.path)
    _release_leases(run, report)
    recorder.emit(
        "mark", Op.RUN_HEALED, data={"ok": not report.problems, "problems": report.problems, "done": report.done}
    )


def _close_fabric_service(events: list[dict], recorder: Recorder, report: HealReport) -> None:
    """A job's fabric service that died with the runner: each request it never answered is recorded as such
    (its rank got no answer: the connection dropped), then the service's end.
    """
    for w in service_windows(events):
        if w.stop is not None:
            continue
        pending = w.unanswered()
        for r in pending:
            d = r["data"]
            data = {k: d.get(k) for k in ("conn", "rank", "op", "config", "id")}
            recorder.emit("mark", Op.FABRIC_SERVICE_UNANSWERED, data={**data, "why": "the run died before answering"})
        recorder.emit("mark", Op.FABRIC_SERVICE_STOP, data={"changes": w.changes})
        report.done.append(
            f"the job's fabric service died with the run: {len(pending)} request(s) recorded as never answered"
        )


def _netns_candidate(run: RunFolder) -> str | None:
    """The tag run.json gives an emulated run's namespaces and links (--netns): as its twin announced it, else from
    its id. Only a claim: see _netns_tag.
    """
    if not run.info.get("emulate"):
        return None
    from testbed.twin.netns import tag_of

    recorded = ((run.info.get("twin") or {}).get("netns") or {}).get("tag")
    return recorded if isinstance(recorded, str) and recorded.isalnum() else tag_of(run.run_id)


def _netns_tag(run: RunFolder) -> tuple[str | None, str | None]:
    """(the tag of the run's namespaces, why heal may not act on the tag run.json names): a tag is the run's only
    if the run marked it as its own when its twin made them (testbed.engine.run_marks), for this run and this folder.
    """
    tag = _netns_candidate(run)
    if tag is None:
        return None, None
    why = mark_problem(NETNS_MARKS, netns_mark_name(tag, run.run_id, run.path), run.run_id, run.path)
    return (tag, None) if why is None else (None, why)


def _netns_leftovers(run: RunFolder) -> bool:
    """Whether namespaces or links of the tag run.json names are there (the run's or not: heal then says which)."""
    tag = _netns_candidate(run)
    if tag is None:
        return False
    from testbed.twin.netns import leftovers

    return any(leftovers(tag).values())


def _remove_netns(run: RunFolder, report: HealReport) -> None:
    """What a --netns twin killed outright left: the processes in its namespaces, the namespaces, its links."""
    if not _netns_leftovers(run):
        return
    tag, why = _netns_tag(run)
    if tag is None:
        report.problems.append(
            f"network namespaces and links tagged testbed-{_netns_candidate(run)}-* are there, but {why}: heal "
            "removes only the run's own (another run's may carry the tag run.json names); look at them with "
            "`ip netns list` and `ip link`"
        )
        return
    from testbed.twin.netns import leftovers, remove

    try:
        report.done.extend(remove(tag))
    except OSError as exc:
        report.problems.append(f"the run's network namespaces (testbed-{tag}-*) could not be removed: {exc}")
        return
    left = leftovers(tag)
    if any(left.values()):
        report.problems.append(f"still there after removing the run's network namespaces: {left}")
    else:
        unmark_netns(tag, run.run_id, run.path)


def _runner_still_runs(runner: dict) -> bool:
    if runner.get("start_ticks") is not None:
        return runner_alive(runner)
    # A run recorded before the runner's start time was: its pid is alive and still a testbed process.
    try:
        cmdline = Path(f"/proc/{int(runner['pid'])}/cmdline").read_bytes()
    except OSError:
        return False
    return b"testbed" in cmdline


def _twin_gone(info: dict) -> str | None:
    """Why the run's lab no longer exists (its twin died with it), or None if there is a lab to heal."""
    if not info.get("emulate"):
        return None
    pid = info.get("twin_pid")
    if pid is not None:
        try:
            alive = b"emulators" in Path(f"/proc/{int(pid)}/cmdline").read_bytes()
        except OSError:
            alive = False
        if not alive:
            return (
                f"the run's twin (pid {pid}) is gone: it exits with its runner, and took its devices, faults and jobs"
            )
        return None
    from testbed.twin.bridge import twin_control

    control = twin_control(info.get("twin", {}).get("control", "127.0.0.1:1"), timeout=2.0)
    try:
        control.call(None, "ping")
        return None
    except (RuntimeError, OSError, ValueError):  # the twin refused or could not be reached
        return "the run's twin does not answer on its control address: it went with its runner"
    finally:
        control.close()


def _record_lab_gone(
    run_dir: Path, run_id: str, recorder: Recorder, found: Findings, why: str, report: HealReport
) -> None:
    for fault in found.faults:
        recorder.emit("invoke", Op.FAULT_HEAL, device=fault.device, data=fault.data)
        recorder.emit("ok", Op.FAULT_HEAL, device=fault.device, data={**fault.data, "how": why})
    records = read_process_records(run_dir)
    leftover = [_end_twin_rank(job, records, run_id) for job in found.jobs]
    recorder.emit(
        "mark",
        Op.HEAL_LAB_GONE,
        data={"why": why, "faults": [f.name for f in found.faults], "jobs": leftover},
    )
    recorder.emit("mark", Op.FABRIC_FINAL, data={"circuits": {}, "lab_gone": why})
    report.done.append(why)
    if found.faults:
        report.done.append(f"{len(found.faults)} fault(s) went with it: {', '.join(f.name for f in found.faults)}")
    ended = [j for j in leftover if j["result"] == "killed"]
    if ended:
        report.done.append(f"ended {len(ended)} rank process(es) the twin left: {[j['pid'] for j in ended]}")
    for j in leftover:
        if str(j["result"]).startswith("not ended"):
            report.problems.append(f"rank {str(j['name'])[:80]} (pid {j['pid']}) on {j['host']}: {j['result']}")


def _end_twin_rank(job: dict, records: dict, run_id: str) -> dict:
    """An emulated rank is a process of this machine, in its own session; the twin ends its ranks when it
    stops, but not if it was killed outright. Ended only if it is that very rank: the record the run took when it
    started (pid, start time, owner, run id: testbed.engine.run_marks) still holds, and its environment names the job.
    """
    recorded_pid = job.get("pid")
    pid = recorded_pid if isinstance(recorded_pid, int) else 0
    out = {"host": job.get("host"), "pid": pid, "name": job.get("name")}
    problem = process_problem(records.get((job.get("host"), pid)), run_id)
    if problem == "it is gone":
        return {**out, "result": "gone"}
    if problem is not None:
        return {**out, "result": f"not ended: {problem}"}
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        leader = os.getpgid(pid) == pid
    except OSError:
        return {**out, "result": "gone"}
    if f"TESTBED_JOB={job.get('name')}".encode() not in environ or not leader:
        return {**out, "result": "not ended: its environment names another job, or it leads no process group"}
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError as exc:
        return {**out, "result": f"could not end it: {exc}"}
    return {**out, "result": "killed"}


@contextlib.contextmanager
def _lab_session(run: RunFolder, inventory: Inventory, found: Findings, recorder: Recorder, report: HealReport):
    """The lab, with every device heal may touch locked; on an emulated run, the twin that outlived it."""
    from testbed.engine.locks import device_locks
    from testbed.leases.identity import device_identity

    control = None
    if run.info.get("emulate"):  # a twin that outlived its runner: its endpoints and its control
        from testbed.twin.bridge import point_at_twin, twin_control

        inventory = point_at_twin(inventory, run.info["twin"])
        control = twin_control(run.info["twin"]["control"])
    named = {f.job.get("host") or f.device for f in found.faults if f.job} | {f.device for f in found.faults}
    named |= {j["host"] for j in found.jobs} | set(found.initial)
    devices: dict[str, DeviceConfig] = {d: inventory.devices[d] for d in named if d in inventory.devices}
    identities = {d: device_identity(dev.transport) for d, dev in devices.items()}
    lab = HealDevices(inventory, recorder, control)
    try:
        with device_locks(identities, f"heal of {run.run_id}"), _heal_leases(run, identities, report) as leases:
            report.done.append(f"the run's devices were free to lock: {', '.join(sorted(identities)) or 'none'}")
            lab.leases = leases
            yield lab
    finally:
        lab.close()
    for start in found.unknown_jobs:
        report.notes.append(
            f"job {start.get('name')} may have started (its start's outcome is unknown and no pid was recorded): "
            "look for a process with TESTBED_JOB=" + str(start.get("name")) + " on its host"
        )


def _heal_faults(lab: HealDevices, found: Findings, report: HealReport) -> None:
    for fault in found.faults:
        lab.recorder.emit("invoke", Op.FAULT_HEAL, device=fault.device, step="heal", data=fault.data)
        try:
            if fault.kind not in FAULT_KINDS:
                raise HealFailed(f"{fault.name}: heal does not know the fault kind {fault.kind!r} (testbed.faults)")
            how = FAULT_KINDS.get(fault.kind).heal_after_crash(lab, fault)
        except Exception as exc:  # a device that refuses, a twin op that fails: say so, heal the rest
            lab.recorder.emit(
                "fail", Op.FAULT_HEAL, device=fault.device, step="heal", data={**fault.data, "error": str(exc)}
            )
            report.problems.append(f"fault {fault.name}: {exc}")
            continue
        lab.recorder.emit("ok", Op.FAULT_HEAL, device=fault.device, step="heal", data={**fault.data, "how": how})
        report.done.append(f"fault {fault.name}: {how}")


def _stop_jobs(lab: HealDevices, found: Findings, report: HealReport) -> None:
    for job in found.jobs:
        try:
            value = lab.call(job["host"], "gpu.stop_job", {"job": job}, "heal: stop the run's job")
        except Exception as exc:
            report.problems.append(f"job {job.get('name')} (pid {job.get('pid')}) on {job.get('host')}: {exc}")
            continue
        report.done.append(f"job {job.get('name')} (pid {job['pid']}) on {job['host']}: {value['result']}")


def _restore_fabric(lab: HealDevices, run_dir: Path, found: Findings, report: HealReport) -> None:
    from testbed.families.switching import circuit_diff

    final: dict[str, dict] = {}
    for switch, before in found.initial.items():
        try:
            audit_line = count_lines(run_dir / "audit.jsonl")
            read = lab.operation(switch, "read_fabric")
            now = lab.call(switch, read, {}, "heal: read the switch")
            lab.recorder.emit(
                "mark",
                Op.FABRIC_OBSERVED,
                device=switch,
                data={"circuits": now, "audit_line": audit_line, "why": "heal: the switch as the dead run left it"},
            )
            now = {int(i): int(o) for i, o in now.items()}
            ports = found.managed.get(switch)
            if ports is None:  # not recorded: every port whose circuit differs, within the interlocks
                ports = sorted({p for i, o in set(now.items()) ^ set(before.items()) for p in (i, o)})
            target = [(i, o) for i, o in sorted(before.items()) if i in ports or o in ports]
            remove, add = circuit_diff(now, target, ports)
            if remove or add:
                lab.call(
                    switch,
                    lab.operation(switch, "reconfigure"),
                    {"circuits": target, "managed": list(ports), "verify_light": False},
                    "heal: the circuits before the run",
                )
                report.done.append(
                    f"{switch}: back to the circuits before the run on its {len(ports)} managed ports "
                    f"({len(remove)} removed, {len(add)} restored)"
                )
            else:
                report.done.append(f"{switch}: already holds the circuits it held before the run")
            final[switch] = lab.call(switch, read, {}, "heal: final read-back")
        except Exception as exc:
            report.problems.append(f"{switch}: {exc}")
    lab.recorder.emit("mark", Op.FABRIC_FINAL, data={"circuits": final, "healed": True})


@contextlib.contextmanager
def _lab_leases(run: RunFolder):
    """The store of the lab's leases the run used (the cluster's keeper, or this machine's folder), for the block;
    None for an emulated run, which took none.
    """
    info = run.info
    if info.get("emulate", True):
        yield None
        return
    from testbed.leases import lease_store

    ray_start = None
    try:
        if info.get("ray_address"):
            from testbed.engine.ray_session import RayStart

            ray_start = RayStart(info["ray_address"], background=False)
        yield lease_store(ray_start.get() if ray_start is not None else None)
    finally:
        if ray_start is not None:
            ray_start.shutdown()


def _release_dead_run_leases(store, run: RunFolder, report: HealReport) -> None:
    """The dead run's leases (docs/leases.md): they would lapse within a minute by themselves; heal gives them back
    now, as the run would have at its end.
    """
    ids = [lease.id for lease in store.list() if lease.holder.run == run.run_id]
    released = store.release(ids=ids) if ids else []
    if released:
        report.done.append(f"released the run's leases on {', '.join(lease.device for lease in released)}")


@contextlib.contextmanager
def _heal_leases(run: RunFolder, identities: dict[str, str], report: HealReport):
    """On a lab, heal drives the run's devices only under leases of its own, as a run would: the dead run's are
    given back, then heal takes the devices; if another user or run holds one by now, heal is refused before it
    writes anything (its holder named), and is run again once they are free. Yields its HeldLeases, or None.
    """
    from testbed.leases import held, me

    with _lab_leases(run) as store:
        if store is None or not identities:
            yield None
            return
        _release_dead_run_leases(store, run, report)
        with held(store, identities, me(f"heal-{run.run_id}")) as leases:
            report.done.append(f"heal holds the lab's leases on {', '.join(sorted(identities))}")
            yield leases


def _release_leases(run: RunFolder, report: HealReport) -> None:
    """What is left of the dead run's leases when heal did not take the devices itself (no device to heal)."""
    try:
        with _lab_leases(run) as store:
            if store is not None:
                _release_dead_run_leases(store, run, report)
    except UserError as exc:
        report.notes.append(f"the run's leases were not released ({exc}); they lapse by themselves within a minute")


def _end_ray_leftovers(info: dict, recorder: Recorder, report: HealReport, run_dir: Path) -> None:
    """The agents a SIGKILLed runner's Ray instance leaves for a while (see testbed.engine.ray_session): ended only if
    the session's folder carries the mark this run left in it (testbed.engine.run_marks), and only this account's.
    """
    session = (info.get("ray") or {}).get("session_dir")
    if not session or (info.get("runner") or {}).get("hostname") != socket.gethostname():
        return
    recorded_run = info.get("run")
    run_id = recorded_run if isinstance(recorded_run, str) else run_dir.name
    problem = session_folder_problem(session) if isinstance(session, str) else "not a path"
    if problem is None:  # a session folder of this account, but perhaps another run's: the run's mark says
        problem = mark_problem(Path(session), ray_mark_name(run_id, run_dir), run_id, run_dir)
        problem = None if problem is None else f"a Ray session, but {problem}"
    if problem is not None:  # run.json is a file anyone who can write the results folder may have changed
        report.problems.append(
            f"run.json names {str(session)[:200]!r} as its Ray instance's folder, which is {problem}: no process "
            "was ended for it; look for the run's Ray processes yourself (`ray status`, `ps`)"
        )
        return
    ended, exiting = [], {}
    for pid, name in leftovers(session):
        if not _owned_by_me(pid):
            continue  # another account's process with a file in the folder: never this run's
        try:
            # A pidfd names this very process (never a later one with its pid) and tells when it has exited.
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue  # exited meanwhile
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:  # exited between the pidfd and the signal
            os.close(pidfd)
            continue
        ended.append({"pid": pid, "name": name})
        exiting[pidfd] = pid
    # SIGKILL only starts the end: a large process holds its files for a while as it exits, and the next run
    # must not find them. "Ended" is said of processes that are gone.
    still = _wait_exited(exiting, LEFTOVER_EXIT_S)
    if ended:
        recorder.emit("mark", Op.RUNNER_LEFTOVERS, data={"ray_session": session, "ended": ended, "still": still})
        report.done.append(f"ended {len(ended)} leftover process(es) of the run's Ray instance: {ended}")
    if still:
        report.problems.append(
            f"leftover process(es) {still} of the run's Ray instance had not exited {LEFTOVER_EXIT_S:.0f} s after "
            "SIGKILL (a process stuck in the kernel, e.g. on a hung disk): look at them with `ps -o pid,stat,wchan -p "
            f"{','.join(map(str, still))}`"
        )


def _owned_by_me(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.geteuid()
    except OSError:
        return False


def _wait_exited(pidfds: dict[int, int], timeout_s: float) -> list[int]:
    """Waits until the processes behind these pidfds (pidfd -> pid) have exited, up to timeout_s; closes the
    pidfds and returns the pids that had not.
    """
    poller = select.poll()
    for fd in pidfds:
        poller.register(fd, select.POLLIN)  # readable once the process has exited
    waiting, deadline = set(pidfds), time.monotonic() + timeout_s
    try:
        while waiting and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(left * 1000):
                waiting.discard(fd)
                poller.unregister(fd)
        return sorted(pidfds[fd] for fd in waiting)
    finally:
        for fd in pidfds:
            os.close(fd)


def _update_run_files(run_dir: Path, info: dict, report: HealReport) -> None:
    """run.json says what became of the run; a run killed before its end gets its summary and trials.csv
    from the events it recorded (as the runner would have written them).
    """
    if info.get("status") == "running":
        info["status"] = "aborted"
        info["error"] = "the runner died before the run ended; the lab was healed by `testbed heal`"
    info["healed"] = {"ok": not report.problems, "done": report.done, "problems": report.problems}
    write_json(run_dir / "run.json", info)
    if (run_dir / "summary.json").is_file():
        return
    collector = SummaryCollector()
    for e in read_jsonl(run_dir / "events.jsonl").records:
        fields: dict[str, Any] = {k: e.get(k) for k in Event.__dataclass_fields__ if k in e}
        collector.on_event(Event(**fields))
    collector.write_trials_csv(run_dir / "trials.csv")
    summary = collector.summary(info["run"], info["playbook"]["name"], info["status"], int(info.get("trials") or 0))
    write_json(run_dir / "summary.json", summary)
