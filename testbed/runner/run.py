"""`testbed run`: results folder, twin (when emulating), Ray, one actor per device, the coordinator, and
the summary at the end. Each of those is its own module; this one only puts them in order."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from drivers.transports import TransportSettings
from testbed.config.inventory import (
    Inventory,
    OcsDevice,
    SerialTransport,
    SshTransport,
    VisaTransport,
    transport_address,
)
from testbed.errors import ExperimentFailed, UserError
from testbed.plan import Plan
from testbed.progress import ProgressDisplay
from testbed.recorder import Recorder
from testbed.results import SummaryCollector, make_run_dir, run_info, write_json
from testbed.runner.clocks import measure_clocks
from testbed.runner.coordinator import Coordinator
from testbed.runner.guard import Policy
from testbed.runner.locks import device_locks
from testbed.runner.ray_session import ray_session


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
    write_json(run_dir / "run.json", info)
    collector = SummaryCollector()
    recorder = Recorder(run_dir, run_id, observers=[collector])
    status, error = "failed", None
    try:
        with contextlib.ExitStack() as stack:
            inventory, twin = plan.inventory, None
            if options.emulate:
                inventory, endpoints, twin = stack.enter_context(_twin(plan, console))
                info["twin"] = endpoints
                stack.callback(_record_dataplane, twin, info)  # runs before the twin stops, on every path
            stack.enter_context(
                device_locks({d: transport_address(inventory.devices[d].transport) for d in plan.devices}, run_id)
            )
            with ray_session(options.ray_address) as ray:
                actors, notes = _start_actors(ray, plan, inventory, emulate=options.emulate)
                stack.callback(_stop_actors, ray, actors)
                for note in notes:
                    console.print(f"[dim]{note}[/]")
                info["placement"] = measure_clocks(ray, actors)
                truth = _ground_truth(twin) if twin is not None else None
                coordinator = Coordinator(plan, actors, recorder, ray, artifacts=run_dir, ground_truth=truth)
                if plan.playbook.job is not None:
                    coordinator.jobs = _job_controller(ray, plan, inventory, coordinator, twin, options.emulate)
                stack.callback(coordinator.close)
                info["devices"] = coordinator.identify()
                write_json(run_dir / "run.json", info)
                display = stack.enter_context(ProgressDisplay(console, len(plan.trials)))
                recorder.add_observer(display)
                status, error = _execute(plan, coordinator, recorder)
    except KeyboardInterrupt:
        status, error = "aborted", "interrupted (Ctrl-C)"
        recorder.emit("mark", "run.aborted", data={"reason": error})
    except ExperimentFailed as exc:
        status, error = "failed", str(exc)
        recorder.emit("mark", "run.failed", data={"error": error})
    except UserError as exc:  # refused before the experiment began (a lock, a pin): recorded, then reported
        status, error = "failed", str(exc)
        recorder.emit("mark", "run.refused", data={"error": error})
        raise
    finally:
        recorder.close()
        collector.write_trials_csv(run_dir / "trials.csv")
        summary = collector.summary(run_id, plan.playbook.name, status, len(plan.trials))
        write_json(run_dir / "summary.json", summary)
        info["status"] = status
        info["error"] = error
        write_json(run_dir / "run.json", info)
    return RunOutcome(run_dir, status, summary, error)


def _execute(plan: Plan, coordinator: Coordinator, recorder: Recorder) -> tuple[str, str | None]:
    recorder.emit("mark", "run.start", data={"trials": len(plan.trials), "seed": plan.seed})
    failures: list[str] = []
    try:
        coordinator.execute_steps(plan.setup)
        for trial in plan.trials:
            recorder.trial = trial.index
            recorder.emit("mark", "trial.start", data={"sweep": trial.sweep_point})
            try:
                coordinator.execute_steps(trial.steps)
            except ExperimentFailed as exc:
                recorder.emit("mark", "trial.end", data={"status": "failed", "error": str(exc)})
                failures.append(f"trial {trial.index}: {exc}")
                if plan.playbook.on_failure == "abort":
                    raise
                continue
            finally:
                recorder.trial = None
            recorder.emit("mark", "trial.end", trial=trial.index, data={"status": "ok"})
    finally:
        # Teardown runs even after a failure or Ctrl-C, so the lab is left as the playbook says; then the
        # fabric is read back, so `testbed check` can compare it with what the history implies.
        if coordinator.jobs is not None and coordinator.jobs.handles:
            try:
                coordinator.jobs.stop(label="stop job (abort)")
            except ExperimentFailed as exc:
                failures.append(f"stopping the job: {exc}")
        for step in plan.teardown:
            try:
                coordinator.execute(step)
            except ExperimentFailed as exc:
                failures.append(f"teardown: {exc}")
        try:
            recorder.emit("mark", "fabric.final", data={"circuits": coordinator.read_fabric()})
        except ExperimentFailed as exc:
            failures.append(f"final read-back: {exc}")
    recorder.emit("mark", "run.end", data={"failures": len(failures)})
    if failures:
        return "failed", "\n".join(failures)
    return "ok", None


@contextlib.contextmanager
def _twin(plan: Plan, console: Console):
    from emulators.twin import TwinProcess
    from testbed.twin import assert_loopback, not_emulated, point_at_twin, twin_spec

    missing = not_emulated(plan.inventory, plan.devices)
    if missing:
        raise UserError(f"--emulate: no emulator yet for {', '.join(missing)}")
    spec = twin_spec(plan.inventory, plan.seed, only=set(plan.devices))
    with TwinProcess(spec) as twin:
        endpoints = twin.endpoints.to_json()
        inventory = point_at_twin(plan.inventory, endpoints)
        assert_loopback(inventory, plan.devices)
        console.print(f"[dim]emulated twin: {', '.join(endpoints['devices'])} (control {endpoints['control']})")
        yield inventory, endpoints, twin


def _job_controller(ray, plan: Plan, inv: Inventory, coordinator: Coordinator, twin, emulate: bool):
    """The job's ranks, a watcher actor per host (its own connection; two threads so the coordinator can
    wait for it to be watching), and how faults are injected here."""
    from testbed.runner.device_actor import DeviceActor
    from testbed.runner.jobs import FaultInjector, JobController
    from testbed.runner.placement import actor_options

    remote_cls = ray.remote(DeviceActor)
    watchers = {}
    # The job's hosts, and the spares a failover may move a rank to (the plan includes them then).
    job = plan.playbook.job
    spares = job.spares if job.spares is not None else inv.spares
    hosts = [d for d in plan.devices if d in job.ranks or d in spares]
    for host in hosts:
        options, _ = actor_options(ray, host, inv.devices[host].node, emulate=emulate)
        watchers[host] = remote_cls.options(**options, max_concurrency=2).remote(
            host, inv.devices[host].driver, driver_settings(inv, host)
        )

    def address_of(host: str) -> str:
        # Emulated ranks all run on this machine; on a lab, ranks reach each other at the host's address.
        t = inv.devices[host].transport
        return "127.0.0.1" if emulate else getattr(t, "host", host)

    faults = FaultInjector(coordinator, twin.control if twin is not None else None)
    link = None
    if twin is not None:

        def link(src_host: str, src_port: str, dst_host: str, dst_port: str, target_port: int) -> str:
            return twin.control.call(
                None,
                "dataplane.link",
                src_host=src_host,
                src_port=src_port,
                dst_host=dst_host,
                dst_port=dst_port,
                target_port=target_port,
            )

    return JobController(
        coordinator,
        plan.playbook.job,
        watchers,
        address_of,
        faults,
        inventory=inv,
        managed=plan.job_managed,
        seed=plan.seed,
        link=link,
    )


def _record_dataplane(twin, info: dict) -> None:
    """The twin's own account of its data plane: evidence that the job's traffic crossed the emulated fabric
    (bytes relayed, connections refused or cut because a path was dark)."""
    with contextlib.suppress(Exception):  # a twin that already died has nothing more to tell
        info["twin_dataplane"] = twin.control.call(None, "dataplane.state")["totals"]


def _ground_truth(twin):
    """What only the twin knows of a device (a chip's transfer matrix), for measurements a lab cannot make."""

    def transfer(device: str) -> list[list[float]]:
        return twin.control.call(device, "transfer_power")

    return transfer


def driver_settings(inv: Inventory, name: str) -> TransportSettings:
    t = inv.devices[name].transport
    if isinstance(t, VisaTransport):
        return TransportSettings(
            "visa",
            t.resource,
            t.timeout_ms / 1000,
            write_termination=t.write_termination,
            read_termination=t.read_termination,
        )
    if isinstance(t, SerialTransport):
        return TransportSettings(
            "serial",
            t.port,
            t.timeout_ms / 1000,
            baudrate=t.baudrate,
            write_termination=t.write_termination,
            read_termination=t.read_termination,
        )
    if isinstance(t, SshTransport):
        from drivers.ssh import SshSettings

        return SshSettings(
            host=t.host,
            port=t.port,
            user=t.user,
            key_file=t.key_file,
            known_hosts=t.known_hosts,
            timeout_s=t.timeout_ms / 1000,
        )
    raise UserError(f"{name}: transport {t.type!r} is not supported for a {inv.devices[name].kind} yet")


def _start_actors(ray, plan: Plan, inv: Inventory, emulate: bool) -> tuple[dict, list[str]]:
    from testbed.runner.device_actor import DeviceActor
    from testbed.runner.placement import actor_options

    # Every pin and transport is resolved before the first actor starts: a mistake leaves nothing running.
    placed = {name: actor_options(ray, name, inv.devices[name].node, emulate=emulate) for name in plan.devices}
    settings = {name: driver_settings(inv, name) for name in plan.devices}
    remote_cls = ray.remote(DeviceActor)
    actors = {
        name: remote_cls.options(**placed[name][0]).remote(name, inv.devices[name].driver, settings[name])
        for name in plan.devices
    }
    return actors, [note for _, note in placed.values() if note]


def policy(inv: Inventory, name: str) -> Policy | None:
    """The interlocks the actor enforces for a switch (None for devices without ports to guard)."""
    dev = inv.devices[name]
    if not isinstance(dev, OcsDevice):
        return None
    allowed = frozenset(dev.allowed_ports) if dev.allowed_ports is not None else None
    return Policy(name, transport_address(dev.transport), dev.read_only, allowed, frozenset(dev.reserved_ports))


def _stop_actors(ray, actors: dict) -> None:
    for actor in actors.values():
        with contextlib.suppress(Exception):
            ray.get(actor.close.remote(), timeout=5)
        with contextlib.suppress(Exception):
            ray.kill(actor)
