"""One run: its results folder, its record, the engine over devices already serving, and the summary at the
end. The devices (twin, locks, hubs) come from testbed.engine.devices, brought up for this run or kept warm
by a testbed.Lab; each piece is its own module, this one only puts them in order.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from testbed.catalog import index_at_end
from testbed.catalog.index import IndexBehind
from testbed.contracts.errors import ActorDied, ExperimentFailed, Terminated, UserError, interruption
from testbed.documents.inventory import Inventory
from testbed.engine.clocks import ClocksKept
from testbed.engine.coordinator import Coordinator
from testbed.engine.devices import Devices
from testbed.engine.dispatch import ActorLost
from testbed.engine.job import JobController
from testbed.engine.ray_session import runner_identity
from testbed.engine.run_marks import ProcessLedger, mark_netns, mark_ray_session
from testbed.events import Op
from testbed.families import family_of
from testbed.plan import Plan
from testbed.results.accuracy import TRUTH_FILE, failover_accuracy
from testbed.results.folder import SummaryCollector, make_run_dir, run_info, write_json
from testbed.results.progress import ProgressDisplay
from testbed.results.recorder import Recorder


@dataclass(frozen=True)
class RunOptions:
    playbook_file: str
    inventory_file: str
    results_root: Path
    emulate: bool = False
    ray_address: str | None = None
    wait_for_leases: bool = False  # on a lab: wait for leased devices instead of refusing


@dataclass(frozen=True)
class Run:
    """A finished run: its folder, how it ended, its summary (summary.json) and its spans."""

    run_dir: Path
    status: str  # "ok", "failed", "aborted"
    summary: dict
    error: str | None = None

    @property
    def folder(self) -> Path:
        return self.run_dir

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def spans(self) -> list[dict]:
        """Every measured span, one row each (trials.csv: trial, sweep, step, span, duration_ms, start_utc),
        typed: `pandas.DataFrame(run.spans)` is the table.
        """
        path = self.run_dir / "trials.csv"
        if not path.is_file():
            return []
        with path.open(newline="") as f:
            return [
                {
                    "trial": int(row["trial"]),
                    "sweep": json.loads(row["sweep"]) if row["sweep"] else {},
                    "step": row["step"],
                    "span": row["span"],
                    "duration_ms": float(row["duration_ms"]),
                    "start_utc": row["start_utc"],
                }
                for row in csv.DictReader(f)
            ]

    def events(self) -> list[dict]:
        """The run's events (events.jsonl), one dict each (results/README.md says what they hold)."""
        from testbed.events import read_jsonl

        return read_jsonl(self.run_dir / "events.jsonl").records

    def __repr__(self) -> str:
        return f"Run({self.run_dir.name!r}, status={self.status!r})"


# (plan, the run's ground-truth file, the run's id) -> the devices serving it, up and warm
DevicesFor = Callable[[Plan, Path, str], Devices]


def execute_run(
    plan: Plan,
    options: RunOptions,
    console: Console,
    devices_for: DevicesFor,
    *,
    clocks: ClocksKept | None = None,
    index_behind: IndexBehind | None = None,
) -> Run:
    """One run of `plan` on the devices `devices_for` gives it. A run on a lab has passed
    testbed.lab.refuse_on_a_lab (testbed.Lab.run calls it). A warm session passes its `clocks` (the devices' clocks,
    reused while true) and may pass `index_behind` (the run indexed into the catalog after the next one starts);
    without them the clocks are measured and the run indexed here, before it returns.
    """
    clocks = clocks if clocks is not None else ClocksKept()
    run_id, run_dir = make_run_dir(options.results_root, plan.playbook.name)
    info = run_info(
        run_id,
        options.playbook_file,
        plan.playbook.model_dump(mode="json"),
        options.inventory_file,
        plan.inventory.model_dump(mode="json"),
        plan.seed,
        len(plan.trials),
        options.emulate,
        options.ray_address,
    )
    # `testbed heal` tells from it whether this run's process is gone (and that it was this account's, this run's).
    info["runner"] = {**runner_identity(), "uid": os.geteuid(), "run": run_id}
    write_json(run_dir / "run.json", info)
    collector = SummaryCollector()
    # An emulated run's ranks are processes of this machine: each recorded as it starts, for heal (run_marks).
    ledger = ProcessLedger(run_dir, run_id) if options.emulate else None
    recorder = Recorder(run_dir, run_id, observers=[collector] + ([ledger] if ledger is not None else []))
    status, error = "failed", None
    # Where the run's first seconds go (run.json "startup_s"; bench/RESULTS.md's start-up rows read it).
    started = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            devices = devices_for(plan, run_dir / TRUTH_FILE, run_id)
            startup: dict[str, float | bool] = (
                dict(devices.startup_s) if devices.runs == 0 else {"devices_reused": True}
            )
            mark = time.monotonic()
            inventory, twin, dispatcher = devices.inventory, devices.twin, devices.dispatcher
            if twin is not None:
                if devices.runs > 0:  # a warm twin: this run's ground truth in this run's folder, counters anew
                    twin.open_truth(run_dir / TRUTH_FILE)
                    twin.call(None, "dataplane.reset")
                info["twin"] = twin.endpoints
                netns_tag = (twin.endpoints.get("netns") or {}).get("tag")
                if netns_tag is not None:  # the namespaces heal may remove after a crash: marked as this run's
                    _note(console, mark_netns(netns_tag, run_id, run_dir))
                info["twin_pid"] = twin.pid  # heal looks for it in /proc: did the twin die with the run?
                info["twin_clock"] = twin.clock()
                stack.callback(_record_dataplane, twin, info)  # runs before the twin stops, on every path
            devices.runs += 1
            stack.enter_context(_sigterm_as_interrupt())
            info["ray"] = {"session_dir": devices.ray_session_dir}
            if devices.ray_session_dir is not None:  # the instance heal may end after a crash: marked as this run's
                _note(console, mark_ray_session(devices.ray_session_dir, run_id, run_dir))
            for note in devices.notes:
                console.print(f"[dim]{note}[/]")
            measured = clocks.for_run(dispatcher, dispatcher.names(), run_id)
            info["placement"], info["placement_clocks"] = measured.placement, measured.record(run_id)
            truth = twin.transfer_power if twin is not None else None
            coordinator = Coordinator(
                plan, dispatcher, recorder, artifacts=run_dir, twin=twin, ground_truth=truth, leases=devices.leases
            )
            if plan.playbook.job is not None:
                coordinator.jobs = _job_controller(plan, inventory, coordinator, twin, options.emulate)
            stack.callback(coordinator.close)
            startup["clocks"] = round(time.monotonic() - mark, 4)
            mark = time.monotonic()
            info["devices"] = coordinator.identify()
            _lease_told_identities(devices, info["devices"], run_id)  # before any write: one device, one holder
            pids = coordinator.actor_pids()
            info["actors"] = {name: {"pid": pid} for name, pid in pids.items()}
            startup["identify"] = round(time.monotonic() - mark, 4)  # the first command to each device
            startup["to_first_command"] = round(time.monotonic() - started, 4)
            if index_behind is not None:  # the run before this one is indexed now, behind this one's start
                index_behind.next_run_started()
            # Reused clocks stand only if the same actor processes serve: a hub restarted since is measured again.
            measured = clocks.still_true(measured, pids, dispatcher, run_id)
            info["placement"] = measured.placement
            info["placement_clocks"] = measured.record(run_id)
            info["startup_s"] = startup
            # What the run found, and the ports it may change: `testbed heal` restores these after a crash.
            recorder.emit("mark", Op.FABRIC_INITIAL, data=_initial_fabric(plan, info["devices"]))
            write_json(run_dir / "run.json", info)
            display = stack.enter_context(ProgressDisplay(console, len(plan.trials)))
            recorder.add_observer(display)
            status, error = _execute(plan, coordinator, recorder)
    except KeyboardInterrupt as exc:
        status, error = "aborted", interruption(exc)
        recorder.emit("mark", Op.RUN_ABORTED, data={"reason": error})
    except ExperimentFailed as exc:
        status, error = "failed", str(exc)
        recorder.emit("mark", Op.RUN_FAILED, data={"error": error})
    except UserError as exc:  # refused before the experiment began (a lock, a pin): recorded, then reported
        status, error = "failed", str(exc)
        recorder.emit("mark", Op.RUN_REFUSED, data={"error": error})
        raise
    finally:
        recorder.close()
        if ledger is not None:
            ledger.close()
        collector.write_trials_csv(run_dir / "trials.csv")
        summary = collector.summary(run_id, plan.playbook.name, status, len(plan.trials))
        if plan.playbook.job is not None:  # the twin's ground truth against the measured failovers
            accuracy = failover_accuracy(run_dir, plan.playbook.job.progress)
            if accuracy is not None:
                summary["ground_truth"] = accuracy
        write_json(run_dir / "summary.json", summary)
        info["status"] = status
        info["error"] = error
        write_json(run_dir / "run.json", info)
        # The folder is whole: into the results folder's catalog (docs/catalog.md); a failure there only warns.
        if index_behind is not None:
            index_behind.add(run_dir)
        else:
            warning = index_at_end(run_dir)
            if warning is not None:
                console.print(f"[yellow]{escape(warning)}[/]", soft_wrap=True)
    return Run(run_dir, status, summary, error)


def _note(console: Console, note: str | None) -> None:
    if note is not None:
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)


def _execute(plan: Plan, coordinator: Coordinator, recorder: Recorder) -> tuple[str, str | None]:
    recorder.emit("mark", Op.RUN_START, data={"trials": len(plan.trials), "seed": plan.seed})
    failures: list[str] = []
    try:
        coordinator.execute_steps(plan.setup)
        for trial in plan.trials:
            recorder.trial = trial.index
            recorder.emit("mark", Op.TRIAL_START, data={"sweep": trial.sweep_point})
            try:
                coordinator.execute_steps(trial.steps)
            except Exception as exc:
                died = _actor_death(exc)
                if died is None and not isinstance(exc, ExperimentFailed):
                    raise
                if died is not None:
                    # The callers of the dead call (fault.inject, a watch) cannot close what they opened.
                    coordinator.open_invokes.close_all(recorder, f"outcome unknown: {died}")
                    coordinator.wait_until_alive()  # what follows needs them back
                end = {"status": "failed", "error": str(exc)} | ({"actor_died": died} if died else {})
                recorder.emit("mark", Op.TRIAL_END, data=end)
                failures.append(f"trial {trial.index}: {exc}")
                _stop_job(coordinator, failures)  # the next trial starts its own
                if died is not None:
                    if plan.playbook.on_actor_death == "stop":
                        raise ExperimentFailed(f"{died}; the run stops there (on_actor_death: stop)") from None
                    continue
                if plan.playbook.on_failure == "abort":
                    raise
                continue
            finally:
                recorder.trial = None
            recorder.emit("mark", Op.TRIAL_END, trial=trial.index, data={"status": "ok"})
    finally:
        coordinator.stopping.set()  # a fault still under way in a `parallel` step heals now, not after its time
        # Teardown runs even after a failure or Ctrl-C, so the lab is left as the playbook says; then the
        # fabric is read back, so `testbed check` can compare it with what the history implies.
        _stop_job(coordinator, failures, label="stop job (abort)")
        for step in plan.teardown:
            try:
                coordinator.execute(step)
            except ExperimentFailed as exc:
                failures.append(f"teardown: {exc}")
        try:
            recorder.emit("mark", Op.FABRIC_FINAL, data={"circuits": coordinator.read_fabric()})
        except ExperimentFailed as exc:
            failures.append(f"final read-back: {exc}")
    recorder.emit("mark", Op.RUN_END, data={"failures": len(failures)})
    if failures:
        return "failed", "\n".join(failures)
    return "ok", None


def _stop_job(coordinator: Coordinator, failures: list[str], label: str = "stop job (failed trial)") -> None:
    if coordinator.jobs is not None and coordinator.jobs.handles:
        try:
            coordinator.jobs.stop(label=label)
        except ExperimentFailed as exc:
            failures.append(f"stopping the job: {exc}")
    if coordinator.jobs is not None:
        coordinator.jobs.close_service()  # a job.start that failed after starting it leaves no handles


def _actor_death(exc: BaseException) -> str | None:
    """What died, if `exc` is a device actor's death: ActorDied from the coordinator, or ActorLost from code
    that waits on an actor directly (the job's watchers).
    """
    if isinstance(exc, ActorDied):
        return str(exc)
    if isinstance(exc, ActorLost):
        return f"a device actor died ({exc.actor}: {exc})"
    return None


@contextlib.contextmanager
def _sigterm_as_interrupt():
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread; a run started elsewhere keeps the default
        return

    def interrupt(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        # None: the handler was not set from Python (Ray's own, in C); the default ends the process too.
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _initial_fabric(plan: Plan, identified: dict[str, dict]) -> dict:
    """The circuits each switch held when the run identified it, and every port the run may change on it
    (the playbook's configurations and the job's fabric): what `testbed heal` restores after a crash.
    """
    managed = plan.managed()
    switches = [d for d in plan.devices if family_of(plan.inventory.devices[d]).holds_fabric]
    return {
        "circuits": {sw: identified.get(sw, {}).get("circuits") for sw in switches},
        "managed": {sw: sorted(managed.get(sw, ())) for sw in switches},
    }


def _job_controller(plan: Plan, inv: Inventory, coordinator: Coordinator, twin, emulate: bool):
    """The job's ranks, watched over the watcher connections start_hubs opened with the devices (so a hub
    that restarts brings them back).
    """

    job = plan.playbook.job
    assert job is not None  # called only for a playbook with a job
    over_fabric = job.fabric is not None or job.fabric_service is not None

    def management_of(host: str) -> str:
        # Where the control side reaches the host (the fabric service looks up its route there): on a lab the host's
        # address; emulated, loopback or (--netns) its management address in its namespace (docs/netns.md).
        if emulate:
            return twin.host_address(host) if twin is not None else "127.0.0.1"
        return getattr(inv.devices[host].transport, "host", host)

    def address_of(host: str) -> str:
        # Where the ranks reach each other: with --netns the host's data address when the job's traffic crosses the
        # optical fabric; else where the host is reached (in the twin, the management network stands in for a lab's
        # Ethernet).
        if emulate and twin is not None and over_fabric:
            return twin.rank_address(host)
        return management_of(host)

    return JobController(
        coordinator,
        job,
        address_of,
        management_of=management_of,
        inventory=inv,
        managed=plan.job_managed,
        seed=plan.seed,
        link=twin.dataplane_link if twin is not None else None,
        commit=twin.dataplane_commit if twin is not None else None,
        plane=(lambda: twin.call(None, "dataplane.state")) if twin is not None else None,
    )


def _record_dataplane(twin, info: dict) -> None:
    """The twin's own account of its data plane: evidence that the job's traffic crossed the emulated fabric
    (bytes relayed, connections refused or cut because a path was dark).
    """
    with contextlib.suppress(Exception):  # a twin that already died has nothing more to tell
        info["twin_dataplane"] = twin.call(None, "dataplane.state")["totals"]


def _lease_told_identities(devices: Devices, identified: dict, run_id: str) -> None:
    """On a lab, lease each device's told identity too (its vendor, model and serial number): the same switch
    reached by another run under another address is then refused here, before anything is written to it.
    """
    if devices.leases is None or devices.told_leased:
        return
    from testbed.leases import me, told_identity

    told = {}
    for device, value in identified.items():
        identity = told_identity(value) if isinstance(value, dict) else None
        if identity is not None:
            told[f"{device} (serial)"] = identity
    if told:
        devices.leases.add(told, me(run_id))
    devices.told_leased = True
