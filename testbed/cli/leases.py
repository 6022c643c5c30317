"""`testbed lease acquire / list / release`: a lab's leases by hand (docs/leases.md).

    testbed lease acquire ocs1 'gpu[01:04]' --for 2h --note "tonight's sweep" --inventory lab.yaml
    testbed lease list
    testbed lease release ocs1

A target is a device name, a name range (gpu[01:08]), a shell pattern (gpu*), a family kind (ocs, gpu_host)
or `all`, over the inventory's devices. The store is the Ray cluster's keeper with --ray-address, else this
machine's lease folder.
"""

from __future__ import annotations

import fnmatch
import re
import time

from rich.console import Console

from testbed.contracts.errors import EXIT_OK, UserError

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)([dhms]))")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
MAX_LEASE_S = 14 * 86400  # a reservation longer than two weeks is a typo, or a lab that needs no leases


def parse_duration(text: str) -> float:
    """'2h', '90m', '1h30m', '45s', '1d' -> seconds. Raises UserError saying how to write one."""
    compact = text.strip().lower().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise UserError(f"--for {text!r}: write a duration such as 2h, 90m, 1h30m or 45s")
    seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if not 0 < seconds <= MAX_LEASE_S:
        raise UserError(f"--for {text!r}: a lease lasts more than 0 s and at most {MAX_LEASE_S // 86400} days")
    return seconds


def resolve_targets(targets: list[str], inventory) -> dict[str, str]:
    """Device name -> identity (testbed.leases.identity) for every target, in the inventory's order. A range is
    matched against the inventory's devices, never listed, and holds at most as many names as an inventory may.
    Raises UserError for a target that names no device, listing what the inventory has.
    """
    from testbed.config.expand import MAX_EXPANDED, parse_range
    from testbed.leases import identities

    devices = inventory.devices
    chosen: set[str] = set()
    for target in targets:
        if target == "all":
            found = list(devices)
        elif target in devices:
            found = [target]
        else:
            try:
                rng = parse_range(target)
            except ValueError as exc:
                raise UserError(f"lease target {target!r}: {exc}") from None
            if rng is not None:
                if len(rng) > MAX_EXPANDED:
                    raise UserError(
                        f"lease target {target!r}: {len(rng)} names, more than an inventory may hold "
                        f"({MAX_EXPANDED}); give the range of your devices"
                    )
                found = [name for name in devices if rng.contains(name)]
            elif any(c in target for c in "*?"):
                found = fnmatch.filter(devices, target)
            else:
                found = [name for name, dev in devices.items() if dev.kind == target]
        if not found:
            kinds = sorted({dev.kind for dev in devices.values()})
            raise UserError(
                f"lease target {target!r} names no device of {inventory.name}: give a device name, a range such "
                f"as gpu[01:04], a pattern such as gpu*, a kind ({', '.join(kinds)}) or all"
            )
        chosen.update(found)
    return identities(inventory, [name for name in devices if name in chosen])


def cmd_lease(args, console: Console) -> int:
    from testbed.leases import acquire, lease_store, me

    ray_start = None
    try:
        if args.ray_address:
            from testbed.engine.ray_session import RayStart

            ray_start = RayStart(args.ray_address, background=False)
        store = lease_store(ray_start.get() if ray_start is not None else None)
        if args.action == "list":
            leases, notes, servers = _with_served(store.list())
            _print_leases(console, leases, store.where, notes=notes)
            for line in servers:
                console.print(line, markup=False, soft_wrap=True, highlight=False)
            for damaged in getattr(store, "damaged", []):
                console.print(
                    f"warning: {damaged.path} {damaged.why}: its device is refused until it is gone",
                    markup=False,
                    soft_wrap=True,
                )
            return EXIT_OK
        if args.action == "acquire":
            duration = parse_duration(args.duration)
            devices = resolve_targets(args.targets, _lab_inventory(args))
            leases = acquire(
                store,
                devices,
                me(),
                "reservation",
                duration,
                note=args.note or "",
                wait=args.wait,
                on_wait=lambda blocking: console.print(
                    "waiting (Ctrl-C to give up):\n  " + "\n  ".join(lease.describe() for lease in blocking),
                    markup=False,
                ),
            )
            _print_leases(console, leases, store.where, title="leased")
            return EXIT_OK
        # release
        user = me().user
        if args.id:
            mine = {lease.id for lease in store.list() if lease.holder.user == user or args.force}
            unknown = [i for i in args.id if i not in mine]
            if unknown:
                raise UserError(
                    f"no lease of yours with id {', '.join(unknown)} (testbed lease list shows the ids; another "
                    "user's lease ends at its time, or with --force)"
                )
            released = store.release(ids=list(args.id))
        else:
            targets = list(resolve_targets(args.targets, _lab_inventory(args)).values()) if args.targets else None
            released = store.release(user=user, identities=targets)
        if not released:
            console.print("nothing to release: you hold no reservation on those devices", markup=False)
        else:
            _print_leases(console, released, store.where, title="released")
        return EXIT_OK
    finally:
        if ray_start is not None:
            ray_start.shutdown()


def _lab_inventory(args):
    from testbed.documents import load_inventory
    from testbed.lab import DEFAULT_INVENTORY

    file = args.inventory or DEFAULT_INVENTORY
    inventory = load_inventory(file).model
    if inventory.emulated_only:
        raise UserError(f"{file} describes an emulated lab: emulated runs take no lease; pass your lab's inventory")
    return inventory


def _with_served(leases: list) -> tuple[list, dict[str, str], list[str]]:
    """The store's leases with what each server answering on this host (testbed serve) holds: its leases that this
    store does not show (a server with another lease folder) added, each of its leases noted with the run under way
    and whose it is, and a line a server. Only read: a lease is taken and given back by its own user (the server
    takes none in another's name).
    """
    from testbed.leases.table import Lease
    from testbed.serve.client import Client, find_servers

    leases, notes, lines = list(leases), {}, []
    for socket_path in find_servers():
        try:
            answer = Client(socket_path).leases()
        except UserError:  # one of an older version (no GET /leases), or gone since: the store's view alone
            continue
        holder, running = answer["holder"], answer["running"]
        held = [Lease.from_json(data) for data in answer["leases"]]
        known = {lease.id for lease in leases}
        leases += [lease for lease in held if lease.id not in known]
        held_ids = {lease.id for lease in held}
        for lease in leases:  # the store's own view of them, matched by the holder's process
            if lease.holder.pid == holder["pid"] and lease.holder.host == holder["host"]:
                held_ids.add(lease.id)
        doing = f"run {running['id']} of {running['user']}" if running else "no run under way"
        for lease_id in held_ids:
            notes[lease_id] = f"testbed serve: {doing}"
        who = f"{holder['user']}@{holder['host']} pid {holder['pid']}"
        queued = f", {answer['queued']} queued" if answer["queued"] else ""
        lines.append(f"testbed serve at {socket_path} ({who}): {len(held_ids)} lease(s), {doing}{queued}")
    return leases, notes, lines


def _print_leases(console: Console, leases, where: str, title: str = "leases", notes: dict | None = None) -> None:
    """One line per lease (a table would wrap every cell on an 80-column terminal):
    ocs1  reserved by alice@ctrl-a pid 4242  11-23 21:00:00 -> 11-23 23:00:00  id 3f2a9c01b7e4  "sweep"  (address)
    """
    if not leases:
        console.print(f"no leases ({where})", markup=False, soft_wrap=True)
        return
    console.print(f"{title} ({where}):", markup=False, soft_wrap=True)

    def when(t: float) -> str:
        return time.strftime("%m-%d %H:%M:%S", time.localtime(t))

    width = max(len(lease.device) for lease in leases)
    for lease in sorted(leases, key=lambda lease: (lease.device, lease.since)):
        what = "reserved" if lease.holder.run is None else f"run {lease.holder.run}"
        note = f'  "{lease.note}"' if lease.note else ""
        served = f"  [{notes[lease.id]}]" if notes and lease.id in notes else ""  # the server's run, and whose
        console.print(
            f"  {lease.device:<{width}}  {what} by {lease.holder} pid {lease.holder.pid}  "
            f"{when(lease.since)} -> {when(lease.until)}  id {lease.id}{note}  ({lease.identity}){served}",
            markup=False,
            soft_wrap=True,
            highlight=False,
        )
