"""Checks that span several keys (references, port ranges), each reported at its key path."""

from __future__ import annotations

from collections.abc import Iterator

from testbed.config.common import Name
from testbed.config.inventory import GpuHostDevice, Inventory, MeshDevice, OcsDevice, Trunk
from testbed.config.playbook import (
    LINK_PATTERN,
    PARAM_REF,
    DeviceCalibrate,
    FabricApply,
    FabricCycle,
    Failover,
    FaultDetect,
    FaultInject,
    HostsHealth,
    JobFabric,
    JobMeasure,
    JobStart,
    JobStop,
    Parallel,
    Playbook,
    RailIterate,
    Wait,
    param_name,
)

Problem = tuple[tuple, str]  # (key path, message)


def check_inventory(inv: Inventory) -> list[Problem]:
    problems: list[Problem] = []
    for name, dev in inv.devices.items():
        if isinstance(dev, OcsDevice):
            top = 2 * dev.size
            for key in ("allowed_ports", "reserved_ports"):
                for port in getattr(dev, key) or []:
                    if not 1 <= port <= top:
                        problems.append(
                            (
                                (("devices", name, key)),
                                f"port {port} is out of range for a {dev.size}x{dev.size} switch (ports 1..{top})",
                            )
                        )
                        break
            seen: set[int] = set()
            for j, (ingress, egress) in enumerate(dev.emulation.circuits):
                loc = ("devices", name, "emulation", "circuits", j)
                if not (1 <= ingress <= dev.size < egress <= top):
                    problems.append(
                        (loc, f"({ingress}, {egress}) is not (ingress 1..{dev.size}, egress {dev.size + 1}..{top})")
                    )
                elif ingress in seen or egress in seen:
                    problems.append((loc, f"({ingress}, {egress}) reuses a port: a port carries one circuit"))
                seen.update((ingress, egress))
    seen_switch_ports: dict[tuple[str, int], str] = {}  # (switch, port) -> what cables it, e.g. "fibres[3]"
    seen_host_ports: dict[tuple[str, str], int] = {}
    for i, f in enumerate(inv.fibres):
        loc = ("fibres", i)
        host = inv.devices.get(f.host)
        if not isinstance(host, GpuHostDevice):
            problems.append(((*loc, "host"), _unknown("GPU host", f.host, inv, GpuHostDevice)))
        elif f.port not in host.ports:
            problems.append(
                ((*loc, "port"), f"host {f.host} has no port {f.port!r} (its ports: {', '.join(host.ports)})")
            )
        switch = inv.devices.get(f.switch)
        if not isinstance(switch, OcsDevice | MeshDevice):
            problems.append(((*loc, "switch"), _unknown("switch", f.switch, inv, OcsDevice | MeshDevice)))
        else:
            n = switch.size
            if not 1 <= f.ingress <= n:
                problems.append(
                    (
                        (*loc, "ingress"),
                        f"ingress port {f.ingress} is out of range for {f.switch} (ingress ports are 1..{n})",
                    )
                )
            if not n < f.egress <= 2 * n:
                problems.append(
                    (
                        (*loc, "egress"),
                        f"egress port {f.egress} is out of range for {f.switch} (egress ports are {n + 1}..{2 * n})",
                    )
                )
        for key, port in (("ingress", f.ingress), ("egress", f.egress)):
            other = seen_switch_ports.setdefault((f.switch, port), f"fibres[{i}]")
            if other != f"fibres[{i}]":
                problems.append(((*loc, key), f"{f.switch} port {port} is already cabled by {other}"))
        other = seen_host_ports.setdefault((f.host, f.port), i)
        if other != i:
            problems.append(((*loc, "port"), f"{f.host}:{f.port} is already cabled by fibres[{other}]"))
    for i, t in enumerate(inv.trunks):
        problems += _check_trunk(inv, i, t, seen_switch_ports)
    for i, spare in enumerate(inv.spares):
        if not isinstance(inv.devices.get(spare), GpuHostDevice):
            problems.append(((("spares", i)), _unknown("GPU host", spare, inv, GpuHostDevice)))
    return problems


def _check_trunk(inv: Inventory, i: int, t: Trunk, seen_switch_ports: dict[tuple[str, int], str]) -> list[Problem]:
    """A trunk joins the egress of one switch to the ingress of another, on ports nothing else cables and
    a run may touch."""
    loc = ("trunks", i)
    problems: list[Problem] = []
    if t.from_ == t.to:
        problems.append(((*loc, "to"), f"a trunk joins two different switches; from and to are both {t.to}"))
    for key, switch, side, port in (("from", t.from_, "egress", t.egress), ("to", t.to, "ingress", t.ingress)):
        dev = inv.devices.get(switch)
        if not isinstance(dev, OcsDevice | MeshDevice):
            problems.append(((*loc, key), _unknown("switch", switch, inv, OcsDevice | MeshDevice)))
            continue
        n = dev.size
        low, high = (n + 1, 2 * n) if side == "egress" else (1, n)
        if not low <= port <= high:
            problems.append(
                ((*loc, side), f"{side} port {port} is out of range for {switch} ({side} ports are {low}..{high})")
            )
            continue
        if isinstance(dev, OcsDevice) and port in dev.reserved_ports:
            problems.append(
                (
                    (*loc, side),
                    f"{switch} port {port} is reserved (reserved_ports): a run never touches it, so no circuit "
                    "could use this trunk; cable the trunk to another port",
                )
            )
        other = seen_switch_ports.setdefault((switch, port), f"trunks[{i}]")
        if other != f"trunks[{i}]":
            problems.append(((*loc, side), f"{switch} port {port} is already cabled by {other}"))
    return problems


def check_playbook(pb: Playbook, inv: Inventory | None) -> list[Problem]:
    """Problems in the playbook itself, and (given an inventory) in its references to the lab."""
    problems: list[Problem] = []
    for section in ("setup", "steps", "teardown"):
        for loc, step in _walk(getattr(pb, section), (section,)):
            if isinstance(step, FabricApply) and step.configuration not in pb.configurations:
                known = ", ".join(pb.configurations) or "none defined"
                problems.append(
                    (
                        (*loc, "configuration"),
                        f"no configuration named {step.configuration!r} (configurations: {known})",
                    )
                )
            if isinstance(step, FabricCycle) and step.schedule not in pb.schedules:
                known = ", ".join(pb.schedules) or "none defined"
                problems.append(((*loc, "schedule"), f"no schedule named {step.schedule!r} (schedules: {known})"))
            if isinstance(step, DeviceCalibrate) and inv is not None and step.device not in inv.devices:
                problems.append(((*loc, "device"), f"no device named {step.device!r} in the inventory"))
            if isinstance(step, RailIterate):
                if step.workload not in pb.workloads:
                    known = ", ".join(pb.workloads) or "none defined"
                    problems.append(((*loc, "workload"), f"no workload named {step.workload!r} (workloads: {known})"))
                for key in ("mode", "delay_ms"):
                    value = getattr(step, key)
                    if isinstance(value, str) and PARAM_REF.match(value) and param_name(value) not in pb.sweep:
                        problems.append(((*loc, key), f"{value} names no parameter under `sweep`"))
            if isinstance(step, Failover) and (pb.job is None or pb.job.fabric is None):
                problems.append(((*loc, "action"), "failover needs a `job:` with a `fabric:` to rewire"))
            if isinstance(step, JobMeasure) and pb.job is not None and step.rank >= len(pb.job.ranks):
                problems.append(((*loc, "rank"), f"rank {step.rank} does not exist: the job has {len(pb.job.ranks)}"))
            if (
                isinstance(step, FaultInject)
                and isinstance(step.fault.duty, str)
                and param_name(step.fault.duty) not in pb.sweep
            ):
                problems.append(((*loc, "fault", "duty"), f"{step.fault.duty} names no parameter under `sweep`"))
            if isinstance(step, JobStart | JobStop | JobMeasure | FaultDetect | FaultInject) and pb.job is None:
                problems.append(((*loc, "action"), f"{step.action} needs a `job:` section in the playbook"))
            if (
                isinstance(step, FaultDetect | FaultInject)
                and pb.job is not None
                and step.fault.target != "rank:random"
            ):
                rank = int(step.fault.target.split(":")[1])
                if rank >= len(pb.job.ranks):
                    problems.append(
                        (
                            (*loc, "fault", "target"),
                            f"rank {rank} does not exist: the job has "
                            f"{len(pb.job.ranks)} ranks (0..{len(pb.job.ranks) - 1})",
                        )
                    )
            if isinstance(step, HostsHealth) and inv is not None:
                for i, host in enumerate(step.hosts or []):
                    if not isinstance(inv.devices.get(host), GpuHostDevice):
                        problems.append(((*loc, "hosts", i), _unknown("GPU host", host, inv, GpuHostDevice)))
            if isinstance(step, Wait) and isinstance(step.ms, str) and param_name(step.ms) not in pb.sweep:
                problems.append(((*loc, "ms"), f"{step.ms} names no parameter under `sweep`"))
    if pb.job is not None and pb.job.fabric is not None:
        problems += _check_job_fabric(pb.job.fabric, len(pb.job.ranks))
    for key, values in pb.sweep.items():
        if not values:
            problems.append((("sweep", key), "a swept parameter needs at least one value"))
    for wname, workload in pb.workloads.items():
        for i, phase in enumerate(workload.phases):
            if phase.configuration not in pb.configurations:
                problems.append(
                    (
                        (("workloads", wname, "phases", i, "configuration")),
                        f"no configuration named {phase.configuration!r}",
                    )
                )
    if inv is not None and pb.job is not None:
        for i, host in enumerate(pb.job.ranks):
            if not isinstance(inv.devices.get(host), GpuHostDevice):
                problems.append((("job", "ranks", i), _unknown("GPU host", host, inv, GpuHostDevice)))
        for i, host in enumerate(pb.job.spares or []):
            if not isinstance(inv.devices.get(host), GpuHostDevice):
                problems.append((("job", "spares", i), _unknown("GPU host", host, inv, GpuHostDevice)))
            elif host in pb.job.ranks:
                problems.append((("job", "spares", i), f"{host} runs a rank of the job; a spare must be free"))
    if inv is not None:
        for sname, schedule in pb.schedules.items():
            for i, host in enumerate(schedule.hosts):
                if inv.fibre_of(host, schedule.port) is None:
                    problems.append(
                        (
                            (("schedules", sname, "hosts", i)),
                            f"{host}:{schedule.port} is not in the inventory's fibre map ({inv.name})",
                        )
                    )
        for cname, conf in pb.configurations.items():
            loc = ("configurations", cname)
            for i, link in enumerate(conf.links):
                m = LINK_PATTERN.match(link)
                for host, port in ((m.group(1), m.group(2)), (m.group(4), m.group(5))):
                    if inv.fibre_of(host, port) is None:
                        problems.append(
                            ((*loc, "links", i), f"{host}:{port} is not in the inventory's fibre map ({inv.name})")
                        )
            for switch, pairs in conf.circuits.items():
                dev = inv.devices.get(switch)
                if not isinstance(dev, OcsDevice | MeshDevice):
                    problems.append(
                        ((*loc, "circuits", switch), _unknown("switch", switch, inv, OcsDevice | MeshDevice))
                    )
                    continue
                for j, (ing, egr) in enumerate(pairs):
                    if not (1 <= ing <= dev.size and dev.size < egr <= 2 * dev.size):
                        problems.append(
                            (
                                (*loc, "circuits", switch, j),
                                f"({ing}, {egr}) is not (ingress 1..{dev.size}, egress "
                                f"{dev.size + 1}..{2 * dev.size}) on {switch}",
                            )
                        )
    return problems


def _check_job_fabric(fabric: JobFabric, world: int) -> list[Problem]:
    """torus2d keys go with torus2d only; a torus fits the ranks and can order them along a cycle; every
    direction has its own port."""
    loc = ("job", "fabric")
    problems: list[Problem] = []
    torus_keys = ("dims", "y_port", "y_reverse_port")
    if fabric.topology != "torus2d":
        for key in torus_keys:
            if getattr(fabric, key) is not None:
                problems.append(
                    ((*loc, key), f"{key} is for topology torus2d only (this fabric is a {fabric.topology})")
                )
        return problems
    if fabric.dims is None:
        problems.append(((*loc, "topology"), "torus2d needs dims: rows, cols (rows * cols = the number of ranks)"))
    else:
        rows, cols = fabric.dims
        if rows * cols != world:
            problems.append(
                ((*loc, "dims"), f"a {rows}x{cols} torus has {rows * cols} places, but the job has {world} ranks")
            )
        elif rows % 2 and cols % 2:
            problems.append(
                (
                    (*loc, "dims"),
                    f"a {rows}x{cols} torus: ranks are laid out along the torus row by row (an even number of "
                    "rows) or column by column (an even number of columns), so that each rank's ring neighbour is "
                    "a torus neighbour; use an even number of rows or columns",
                )
            )
    if fabric.y_port is None:
        problems.append(((*loc, "topology"), "torus2d needs y_port: the host port towards the next host in its column"))
    if (fabric.reverse_port is None) != (fabric.y_reverse_port is None):
        given, missing = (
            ("reverse_port", "y_reverse_port") if fabric.y_reverse_port is None else ("y_reverse_port", "reverse_port")
        )
        problems.append(
            ((*loc, given), f"a duplex torus needs both reverse_port and y_reverse_port; {missing} is missing")
        )
    seen: dict[str, str] = {}
    for key in ("port", "reverse_port", "y_port", "y_reverse_port"):
        value = getattr(fabric, key)
        if value is not None and seen.setdefault(value, key) != key:
            problems.append(
                ((*loc, key), f"{value} is already the fabric's {seen[value]}; each torus direction needs its own port")
            )
    return problems


def _walk(steps, loc) -> Iterator[tuple[tuple, object]]:
    for i, step in enumerate(steps):
        yield (*loc, i), step
        if isinstance(step, Parallel):
            yield from _walk(step.steps, (*loc, i, "steps"))


def _unknown(what: str, name: Name, inv: Inventory, kind) -> str:
    known = [n for n, d in inv.devices.items() if isinstance(d, kind)]
    return f"no {what} named {name!r} in the inventory (known: {', '.join(known) or 'none'})"
