"""Checks that span several keys (references, port ranges), each reported at its key path.

Device-specific checks are the device's family's (DeviceFamily.check); step-specific ones are the step kind's
(StepModel.check); what spans the whole file is here.
"""

from __future__ import annotations

from collections.abc import Callable

from testbed.config.common import LINK_PATTERN, Name
from testbed.config.device import SwitchConfig
from testbed.config.yamlfile import format_loc
from testbed.documents.inventory import Inventory, Trunk
from testbed.families import family_of
from testbed.families.drivers import ENTRY_POINT_GROUP, available_drivers, driver_spec
from testbed.steps import CheckContext, walk_located

Problem = tuple[tuple, str]  # (key path, message)
KNOWN_SHOWN = 12  # names listed after "no GPU host named ...": enough to show the naming, not all 256
# Under --netns a GPU host's name becomes its network namespace's, a file name under /run/netns (at most 255
# characters): testbed-<6-hex-digit tag>-<host> (emulators/netns.py ns_name). Checked at validate, not found out as
# "File name too long" once the twin is half made. The characters are Name's (NAME_PATTERN), all valid there.
NETNS_NAME_MAX = 255
MAX_HOST_NAME = NETNS_NAME_MAX - len("testbed-") - 6 - len("-")


def check_inventory(inv: Inventory, describe: Callable[[tuple], str] = format_loc) -> list[Problem]:
    """`describe` names another entry in a message as the file does (a pattern's fibre: `fibres[0] with n=3`)."""
    problems: list[Problem] = []
    for name, dev in inv.devices.items():
        problems += _check_driver(name, dev)
        problems += family_of(dev).check(name, dev, inv)
    seen_switch_ports: dict[tuple[str, int], tuple] = {}  # (switch, port) -> what cables it, e.g. ("fibres", 3)
    seen_host_ports: dict[tuple[str, str], int] = {}
    hosts = inv.hosts()
    for name in hosts:
        if len(name) > MAX_HOST_NAME:
            problems.append(
                (
                    ("devices", name),
                    f"a GPU host's name is at most {MAX_HOST_NAME} characters, not {len(name)}: it becomes the name of "
                    "its network namespace under --netns (testbed-<tag>-<host>, a file name of at most "
                    f"{NETNS_NAME_MAX} characters)",
                )
            )
    for i, f in enumerate(inv.fibres):
        loc = ("fibres", i)
        host = hosts.get(f.host)
        if host is None:
            problems.append(((*loc, "host"), _unknown("GPU host", f.host, inv, hosts)))
        elif f.port not in (ports := host.ports):  # type: ignore[attr-defined]  # a host family's model has them
            problems.append(((*loc, "port"), f"host {f.host} has no port {f.port!r} (its ports: {', '.join(ports)})"))
        switch = inv.devices.get(f.switch)
        if not isinstance(switch, SwitchConfig):
            problems.append(((*loc, "switch"), _unknown("switch", f.switch, inv, inv.switches())))
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
            other = seen_switch_ports.setdefault((f.switch, port), loc)
            if other != loc:
                problems.append(((*loc, key), f"{f.switch} port {port} is already cabled by {describe(other)}"))
        first = seen_host_ports.setdefault((f.host, f.port), i)
        if first != i:
            problems.append(((*loc, "port"), f"{f.host}:{f.port} is already cabled by {describe(('fibres', first))}"))
    for i, t in enumerate(inv.trunks):
        problems += _check_trunk(inv, i, t, seen_switch_ports, describe)
    for i, spare in enumerate(inv.spares):
        if spare not in hosts:
            problems.append(((("spares", i)), _unknown("GPU host", spare, inv, hosts)))
    return problems


def _check_driver(name: str, dev) -> list[Problem]:
    """The driver exists, drives this kind of device, and runs over this transport."""
    loc = ("devices", name, "driver")
    try:
        spec = driver_spec(dev.driver)
    except Exception as exc:  # a third-party package that fails to import: say which, at the key
        return [(loc, f"driver {dev.driver!r} could not be loaded from its package: {type(exc).__name__}: {exc}")]
    if spec is None:
        known = ", ".join(sorted(available_drivers()))
        return [(loc, f"unknown driver {dev.driver!r} (known: {known}; others register under {ENTRY_POINT_GROUP!r})")]
    if spec.family is not None and spec.family != dev.kind:
        fits = ", ".join(n for n in sorted(available_drivers()) if _family_of_driver(n) == dev.kind) or "none"
        return [(loc, f"{dev.driver} drives kind {spec.family}, not {dev.kind} (drivers for {dev.kind}: {fits})")]
    if spec.transports is not None and dev.transport.type not in spec.transports:
        return [
            (
                ("devices", name, "transport", "type"),
                f"{dev.driver} runs over {' or '.join(spec.transports)}, not {dev.transport.type}",
            )
        ]
    return []


def _check_trunk(
    inv: Inventory, i: int, t: Trunk, seen_switch_ports: dict[tuple[str, int], tuple], describe: Callable[[tuple], str]
) -> list[Problem]:
    """A trunk joins the egress of one switch to the ingress of another, on ports nothing else cables and
    a run may touch.
    """
    loc = ("trunks", i)
    problems: list[Problem] = []
    if t.from_ == t.to:
        problems.append(((*loc, "to"), f"a trunk joins two different switches; from and to are both {t.to}"))
    for key, switch, side, port in (("from", t.from_, "egress", t.egress), ("to", t.to, "ingress", t.ingress)):
        dev = inv.devices.get(switch)
        if not isinstance(dev, SwitchConfig):
            problems.append(((*loc, key), _unknown("switch", switch, inv, inv.switches())))
            continue
        n = dev.size
        low, high = (n + 1, 2 * n) if side == "egress" else (1, n)
        if not low <= port <= high:
            problems.append(
                ((*loc, side), f"{side} port {port} is out of range for {switch} ({side} ports are {low}..{high})")
            )
            continue
        if dev.port_reserved(port):
            problems.append(
                (
                    (*loc, side),
                    f"{switch} port {port} is reserved (reserved_ports): a run never touches it, so no circuit "
                    "could use this trunk; cable the trunk to another port",
                )
            )
        other = seen_switch_ports.setdefault((switch, port), loc)
        if other != loc:
            problems.append(((*loc, side), f"{switch} port {port} is already cabled by {describe(other)}"))
    return problems


def _family_of_driver(name: str) -> str | None:
    try:
        spec = driver_spec(name)
    except Exception:  # another package's driver that does not load: not one to suggest
        return None
    return spec.family if spec is not None else None


def check_playbook(pb, inv: Inventory | None) -> list[Problem]:
    """Problems in the playbook itself, and (given an inventory) in its references to the lab."""
    problems: list[Problem] = []
    ctx = CheckContext(pb, inv)
    for section in ("setup", "steps", "teardown"):
        for loc, step in walk_located(getattr(pb, section), (section,)):
            unmet = step.unmet_needs(ctx)
            found = unmet or step.check(ctx)  # a kind's own check may rely on its needs
            problems += [((*loc, *key), message) for key, message in found]
    if pb.job is not None and pb.job.fabric is not None:
        problems += _check_job_fabric(pb.job.fabric, len(pb.job.ranks))
    if pb.job is not None and pb.job.fabric_service is not None:
        for i, name in enumerate(pb.job.fabric_service.configurations):
            if name not in pb.configurations:
                known = ", ".join(pb.configurations) or "none defined"
                problems.append(
                    (
                        ("job", "fabric_service", "configurations", i),
                        f"no configuration named {name!r} (configurations: {known})",
                    )
                )
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
        if workload.static is not None and workload.static not in pb.configurations:
            problems.append((("workloads", wname, "static"), f"no configuration named {workload.static!r}"))
    if inv is None:
        return problems
    hosts = inv.hosts()
    if pb.job is not None:
        for i, host in enumerate(pb.job.ranks):
            if host not in hosts:
                problems.append((("job", "ranks", i), _unknown("GPU host", host, inv, hosts)))
        for i, host in enumerate(pb.job.spares or []):
            if host not in hosts:
                problems.append((("job", "spares", i), _unknown("GPU host", host, inv, hosts)))
            elif host in pb.job.ranks:
                problems.append((("job", "spares", i), f"{host} runs a rank of the job; a spare must be free"))
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
            assert m is not None  # the configuration's model accepted only links of this pattern
            for host, port in ((m.group(1), m.group(2)), (m.group(4), m.group(5))):
                if inv.fibre_of(host, port) is None:
                    problems.append(
                        ((*loc, "links", i), f"{host}:{port} is not in the inventory's fibre map ({inv.name})")
                    )
        for switch, pairs in conf.circuits.items():
            dev = inv.devices.get(switch)
            if not isinstance(dev, SwitchConfig):
                problems.append(((*loc, "circuits", switch), _unknown("switch", switch, inv, inv.switches())))
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


def _check_job_fabric(fabric, world: int) -> list[Problem]:
    """torus2d keys go with torus2d only; a torus fits the ranks and can order them along a cycle; every
    direction has its own port.
    """
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


def _unknown(what: str, name: Name, inv: Inventory, of_kind: dict) -> str:
    names = list(of_kind)
    known = ", ".join(names[:KNOWN_SHOWN]) + (f", ... ({len(names)} in all)" if len(names) > KNOWN_SHOWN else "")
    return f"no {what} named {name!r} in the inventory (known: {known or 'none'})"
