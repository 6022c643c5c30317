"""The devices a run drives, brought up once and kept while they serve: the twin (when emulating), the device
locks, and the hub actors with every driver built. A `testbed run` brings them up for its one run; a warm
session (testbed.Lab) keeps them between runs that need the same devices (docs/architecture.md, "Runtime").
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from testbed.documents.inventory import Inventory
from testbed.engine.dispatch import RayDispatcher
from testbed.engine.job import watcher
from testbed.engine.locks import device_locks
from testbed.families import family_of
from testbed.families.interlocks import Policy
from testbed.leases.identity import device_identity
from testbed.plan import Plan

if TYPE_CHECKING:  # both imported where they are started (start_twin, _leases): a lab run never loads the twin
    from testbed.leases import HeldLeases
    from testbed.twin.bridge import TwinHandle


def devices_key(plan: Plan, emulate: bool, netns: bool = False) -> tuple:
    """What must be equal for a run to reuse devices brought up for another: the hubs' devices (the job's
    watchers included) and, for the twin, the seed its emulators are built from and its fault proxy.
    """
    job = plan.playbook.job
    watched: tuple[str, ...] = ()
    if job is not None:
        spares = job.spares if job.spares is not None else plan.inventory.spares
        watched = tuple(d for d in plan.devices if d in job.ranks or d in spares)
    twin = (plan.seed, bool(plan.transport_faults), netns) if emulate else None
    return tuple(sorted(plan.devices)), watched, twin


@dataclass
class Devices:
    """Devices up and serving: what the run's engine needs, and what stops them."""

    key: tuple
    inventory: Inventory  # pointed at the twin when emulating
    dispatcher: RayDispatcher
    twin: TwinHandle | None = None
    notes: list[str] = field(default_factory=list)
    startup_s: dict[str, float] = field(default_factory=dict)  # where bringing them up went (run.json)
    ray_session_dir: str | None = None  # the local Ray instance's folder (None on a cluster): heal's leftovers
    leases: HeldLeases | None = None  # on a lab (None emulated): checked before every command
    told_leased: bool = False  # the identities the devices told at identify leased too (a lab, once)
    runs: int = 0  # how many runs they served
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def close(self) -> None:
        """Drivers closed, hubs stopped, locks released, twin stopped (in that order)."""
        self._stack.close()


def bring_up(
    plan: Plan,
    ray_start,
    *,
    emulate: bool,
    truth_log: Path,
    owner: str,
    console: Console,
    wait_for_leases: bool = False,
    netns: bool = False,
) -> Devices:
    """The twin first (while Ray may still be starting on its thread), then the locks, then Ray, then a hub
    per node with every driver built. On a lab: Ray, the lab's leases (waited for with wait_for_leases), the
    locks, the hubs. `ray_start` is a testbed.engine.ray_session.RayStart.
    """
    startup: dict[str, float] = {}
    mark = time.monotonic()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        startup[name] = round(now - mark, 4)
        mark = now

    stack = contextlib.ExitStack()
    try:
        inventory, twin = plan.inventory, None
        if emulate:
            from testbed.twin.bridge import start_twin  # the only way a run reaches the emulators

            inventory, twin = stack.enter_context(start_twin(plan, truth_log, console, netns=netns))
            phase("twin")
        identities = {d: device_identity(inventory.devices[d].transport) for d in plan.devices}
        _refuse_one_device_twice(identities)
        leases = None
        if not emulate:
            ray = ray_start.get()
            phase("ray")
            # The lab's leases before this machine's locks: a device another user or run holds is refused (or
            # waited for) naming who holds it and until when. Held, like the locks, while the hubs serve.
            leases = stack.enter_context(_leases(ray_start, ray, identities, owner, wait_for_leases, console))
            phase("leases")
        # Held while the hubs hold connections, not only while a run drives: a warm session's serial
        # port or instrument session stays open between its runs.
        stack.enter_context(device_locks(identities, owner))
        if emulate:
            ray = ray_start.get()
            phase("ray")  # what was left of Ray's start once the twin was up
        hubs, notes = start_hubs(ray, plan, inventory, emulate=emulate)
        dispatcher = RayDispatcher(ray, hubs)
        stack.callback(stop_hubs, ray, dispatcher)
        _wait_until_up(dispatcher)
        dispatcher.open_direct()  # the engine's calls skip Ray's millisecond from here (testbed/engine/direct.py)
        phase("hubs")  # their processes started, every driver built, their direct channels open
    except BaseException:
        stack.close()
        raise
    return Devices(
        devices_key(plan, emulate, netns),
        inventory,
        dispatcher,
        twin,
        notes,
        startup,
        ray_start.session_dir,
        leases=leases,
        _stack=stack,
    )


def _refuse_one_device_twice(identities: dict[str, str]) -> None:
    """Two of the run's devices that are one device (two names, or two ways to reach it) would be driven as two:
    an inventory names each device once.
    """
    names: dict[str, list[str]] = {}
    for device, identity in identities.items():
        names.setdefault(identity, []).append(device)
    twice = {identity: found for identity, found in names.items() if len(found) > 1}
    if twice:
        from testbed.contracts.errors import UserError

        lines = [f"{' and '.join(found)} are one device ({identity})" for identity, found in twice.items()]
        raise UserError(
            "\n  ".join(["the inventory names one device twice:", *lines])
            + "\n  try: keep one entry per device (their addresses reach the same device, whatever their names)"
        )


def _leases(ray_start, ray, identities: dict[str, str], run_id: str, wait: bool, console: Console):
    """The run's leases: from the cluster's keeper when the run joined a cluster, else this machine's folder."""
    from testbed.leases import held, lease_store, me

    store = lease_store(ray if ray_start.address is not None else None)

    def waiting(blocking) -> None:
        console.print("waiting for the lab's leases (Ctrl-C to give up):", style="yellow")
        for lease in blocking:
            console.print(f"  {lease.describe()}", markup=False, soft_wrap=True)

    return held(store, identities, me(run_id), wait=wait, on_wait=waiting)


def _wait_until_up(dispatcher: RayDispatcher) -> None:
    """One call to each hub, all at once: it answers once its process is up and its drivers are built."""
    first = {id(hub): name for name, hub in reversed(dispatcher.hubs.items())}
    for pending in [dispatcher.call(name, "where") for name in first.values()]:
        pending.result()


def start_hubs(ray, plan: Plan, inv: Inventory, emulate: bool) -> tuple[dict, list[str]]:
    """A hub actor per node (testbed/engine/hub.py) serving the plan's devices, and one of its own for each
    device marked `isolated` or of a family that wants its own process (the switches). Returns {device or
    watcher name: its hub's handle} and notes on pins.
    """
    from testbed.engine.device_actor import MAX_RESTARTS
    from testbed.engine.hub import DeviceHub, DeviceSpec
    from testbed.engine.placement import actor_options

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


def stop_hubs(ray, dispatcher: RayDispatcher) -> None:
    """Close every device's driver (all at once, 5 s in all: a device still busy is not waited for), then stop
    the hubs.
    """
    closing = []
    for name in dispatcher.names():
        with contextlib.suppress(Exception):  # a hub already gone
            closing.append(dispatcher.call(name, "close"))
    deadline = time.monotonic() + 5.0
    for pending in closing:
        with contextlib.suppress(Exception):
            pending.result(timeout=max(0.0, deadline - time.monotonic()))
    dispatcher.close_direct()
    for hub in dispatcher.hub_handles():
        with contextlib.suppress(Exception):
            ray.kill(hub)
