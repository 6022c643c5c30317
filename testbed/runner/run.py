"""`testbed run`: results folder, twin (when emulating), Ray, one actor per device, the coordinator, and
the summary at the end. Each of those is its own module; this one only puts them in order."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from testbed.config.inventory import Inventory
from testbed.errors import ExperimentFailed, UserError
from testbed.events import Op
from testbed.families import family_of
from testbed.interlocks import Policy
from testbed.plan import Plan
from testbed.progress import ProgressDisplay
from testbed.recorder import Recorder
from testbed.results import SummaryCollector, make_run_dir, run_info, write_json
from testbed.runner.clocks import measure_clocks
from testbed.runner.coordinator import Coordinator
from testbed.runner.dispatch import ActorLost, RayDispatcher
from testbed.runner.errors import ActorDied
from testbed.runner.jobs import JobController, watcher
from testbed.runner.locks import device_locks
from testbed.runner.ray_session import local_session_dir, ray_session, runner_identity
from testbed.truth import TRUTH_FILE, failover_accuracy


@dataclass(frozen=True)
class RunOptions:
    playbook_file: str
    inventory_file: str
    results_root: Path
    emulate: bool = False
    ray_address: str | None = None


@dataclass(frozen=True)
class RunOutcome:
    run_dir: Path
    status: str  # "ok", "failed", "aborted"
    summary: dict
    error: str | None = None


def run_plan(plan: Plan, options: RunOptions, console: Console) -> RunOutcome:
    if plan.transport_faults and not options.emulate:
        raise UserError(
            "the playbook has transport.* faults, which the twin's fault proxy applies; run it with --emulate "
            "(on a lab, break the network with your own tools, e.g. tc netem on the control host)"
        )
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
    info["runner"] = runner_identity()  # `testbed heal` tells from it whether this run's process is gone
    write_json(run_dir / "run.json", info)
    collector = SummaryCollector()
    recorder = Recorder(run_dir, run_id, observers=[collector])
    status, error = "failed", None
    # Where the run's first seconds go (run.json "startup_s"; bench/startup.py reads it).
    startup: dict[str, float] = {}
    mark = time.monotonic()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        startup[name] = round(now - mark, 4)
        mark = now

    try:
        with contextlib.ExitStack() as stack:
            inventory, twin = plan.inventory, None
            if options.emulate:
                from testbed.twin import start_twin  # the only way a run reaches the emulators

                inventory, twin = stack.enter_context(start_twin(plan, run_dir / TRUTH_FILE, console))
                info["twin"] = twin.endpoints
                info["twin_pid"] = twin.pid  # heal looks for it in /proc: did the twin die with the run?
                info["twin_clock"] = twin.clock()
                stack.callback(_record_dataplane, twin, info)  # runs before the twin stops, on every path
                phase("twin")
            stack.enter_context(
                device_locks({d: inventory.devices[d].transport.address() for d in plan.devices}, run_id)
            )
            # Ray is shut down after the actors are stopped and their drivers closed (callbacks run last-in first-out).
            ray = stack.enter_context(ray_session(options.ray_address))
            phase("ray")
            stack.enter_context(_sigterm_as_interrupt())  # after ray.init, which installs its own handler
            info["ray"] = {"session_dir": local_session_dir(ray) if options.ray_address is None else None}
            write_json(run_dir / "run.json", info)
            actors, notes = _start_actors(ray, plan, inventory, emulate=options.emulate)
            dispatcher = RayDispatcher(ray, actors)
            stack.callback(_stop_actors, ray, dispatcher)
            for note in notes:
                console.print(f"[dim]{note}[/]")
            info["placement"] = measure_clocks(dispatcher, list(actors))
            phase("actors")  # the hubs started, every driver built, each device's clock offset measured
            truth = twin.transfer_power if twin is not None else None
            coordinator = Coordinator(plan, dispatcher, recorder, artifacts=run_dir, twin=twin, ground_truth=truth)
            if plan.playbook.job is not None:
                coordinator.jobs = _job_controller(plan, inventory, coordinator, twin, options.emulate)
            stack.callback(coordinator.close)
            info["devices"] = coordinator.identify()
            info["actors"] = {name: {"pid": pid} for name, pid in coordinator.actor_pids().items()}
            phase("identify")  # the first command to each device: connections made here
            info["startup_s"] = startup
            # What the run found, and the ports it may change: `testbed heal` restores these after a crash.
            recorder.emit("mark", Op.FABRIC_INITIAL, data=_initial_fabric(plan, info["devices"]))
            write_json(run_dir / "run.json", info)
            display = stack.enter_context(ProgressDisplay(console, len(plan.trials)))
            recorder.add_observer(display)
            status, error = _execute(plan, coordinator, recorder)
    except KeyboardInterrupt as exc:
        status, error = "aborted", "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted (Ctrl-C)"
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
    return RunOutcome(run_dir, status, summary, error)


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


def _actor_death(exc: BaseException) -> str | None:
    """What died, if `exc` is a device actor's death: ActorDied from the coordinator, or ActorLost from code
    that waits on an actor directly (the job's watchers)."""
    if isinstance(exc, ActorDied):
        return str(exc)
    if isinstance(exc, ActorLost):
        return f"a device actor died ({exc.actor}: {exc})"
    return None


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: the step's faults are healed, teardown runs, the fabric is read back."""


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
    (the playbook's configurations and the job's fabric): what `testbed heal` restores after a crash."""
    managed = plan.managed()
    switches = [d for d in plan.devices if family_of(plan.inventory.devices[d]).holds_fabric]
    return {
        "circuits": {sw: identified.get(sw, {}).get("circuits") for sw in switches},
        "managed": {sw: sorted(managed.get(sw, ())) for sw in switches},
    }


def _job_controller(plan: Plan, inv: Inventory, coordinator: Coordinator, twin, emulate: bool):
    """The job's ranks, watched over the watcher connections _start_actors opened with the devices (so a hub
    that restarts brings them back)."""

    def address_of(host: str) -> str:
        # Emulated ranks all run on this machine; on a lab, ranks reach each other at the host's address.
        t = inv.devices[host].transport
        return "127.0.0.1" if emulate else getattr(t, "host", host)

    return JobController(
        coordinator,
        plan.playbook.job,
        address_of,
        inventory=inv,
        managed=plan.job_managed,
        seed=plan.seed,
        link=twin.dataplane_link if twin is not None else None,
    )


def _record_dataplane(twin, info: dict) -> None:
    """The twin's own account of its data plane: evidence that the job's traffic crossed the emulated fabric
    (bytes relayed, connections refused or cut because a path was dark)."""
    with contextlib.suppress(Exception):  # a twin that already died has nothing more to tell
        info["twin_dataplane"] = twin.call(None, "dataplane.state")["totals"]


def _start_actors(ray, plan: Plan, inv: Inventory, emulate: bool) -> tuple[dict, list[str]]:
    """A hub actor per node (testbed/runner/hub.py) serving the plan's devices, and one of its own for each
    device marked `isolated` or of a family that wants its own process (the switches). Returns {device or
    watcher name: its hub's handle} and notes on pins."""
    from testbed.runner.device_actor import MAX_RESTARTS
    from testbed.runner.hub import DeviceHub, DeviceSpec
    from testbed.runner.placement import actor_options

    # Every pin and transport is resolved before the first hub starts: a mistake leaves nothing running.
    placed = {name: actor_options(ray, name, inv.devices[name].node, emulate=emulate) for name in plan.devices}
    # Every write passes the inventory's interlocks in the hub itself, whatever the planner checked: a
    # switch's circuits are only known at run time (another group's circuit may hold a port a change needs).
    specs = {}
    for name in plan.devices:
        dev = inv.devices[name]
        specs[name] = DeviceSpec(name, dev.driver, dev.transport.settings(), policy(inv, name), dev.kind)
    job = plan.playbook.job
    if job is not None:
        # The job's hosts and the spares a failover may move a rank to: each gets a second connection that
        # follows a rank's log (two threads, so the engine can wait for it to be watching).
        spares = job.spares if job.spares is not None else inv.spares
        for host in [d for d in plan.devices if d in job.ranks or d in spares]:
            dev = inv.devices[host]
            specs[watcher(host)] = DeviceSpec(watcher(host), dev.driver, dev.transport.settings(), None, dev.kind, 2)
    groups: dict[object, list[DeviceSpec]] = {}
    for spec in specs.values():
        where = placed[spec.device][0].get("scheduling_strategy")
        dev = inv.devices[spec.device]
        alone = dev.isolated or family_of(dev).own_process
        key = ("alone", spec.device) if alone else getattr(where, "node_id", None)
        groups.setdefault(key, []).append(spec)
    remote_cls = ray.remote(DeviceHub)
    hubs: dict[str, object] = {}
    for group in groups.values():
        options = placed[group[0].device][0]
        hub = remote_cls.options(**options, max_restarts=MAX_RESTARTS).remote(group)
        hubs.update(dict.fromkeys((spec.name for spec in group), hub))
    return hubs, [note for _, note in placed.values() if note]


def policy(inv: Inventory, name: str) -> Policy | None:
    """The interlocks the device's actor enforces on every write (its family's; None: nothing to guard)."""
    dev = inv.devices[name]
    return family_of(dev).policy(name, dev)


def _stop_actors(ray, dispatcher: RayDispatcher) -> None:
    """Close every device's driver (all at once, 5 s in all: a device still busy is not waited for), then stop
    the hubs."""
    closing = []
    for name in dispatcher.names():
        with contextlib.suppress(Exception):  # a hub already gone
            closing.append(dispatcher.call(name, "close"))
    deadline = time.monotonic() + 5.0
    for pending in closing:
        with contextlib.suppress(Exception):
            pending.result(timeout=max(0.0, deadline - time.monotonic()))
    for hub in dispatcher.hub_handles():
        with contextlib.suppress(Exception):
            ray.kill(hub)
