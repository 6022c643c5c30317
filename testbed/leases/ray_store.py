"""Leases kept by the lab's Ray cluster: one detached, named actor on the head node (`testbed-leases` in the
`testbed` namespace) that every control host's runs and `testbed lease` commands reach, whichever node they
run on. It writes its table to a file on the head node after every change and reads it back when it starts,
so a restarted actor (or a restarted cluster) keeps the reservations (docs/leases.md).

The actor is made by the first client that needs it (get_if_exists): a lab sets nothing up for it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import replace

from testbed.leases.file_store import boot_clock, lease_dir, with_boot_clock
from testbed.leases.table import Holder, Kind, Lease, LeaseTable, Refused

ACTOR_NAME = "testbed-leases"
NAMESPACE = "testbed"
FILE_NAME = "testbed-cluster-leases.json"


class LeaseKeeper:
    """The actor: the table in memory, written through to `path` on its node (written whole to a new file, synced,
    renamed into place, the folder synced). A table it cannot read stops it: every call is refused naming the file,
    rather than starting empty and giving every device to the first comer (a person moves the file away).
    """

    def __init__(self) -> None:
        self.path = lease_dir() / FILE_NAME
        self.table = LeaseTable()
        self.broken: str | None = None
        self._ends: dict[str, float] = {}  # lease id -> its end on this boot's boot-time clock
        try:
            self._load(json.loads(_read_own(self.path)))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            self.broken = f"the cluster's lease table {self.path} on {socket.gethostname()} cannot be read ({exc})"

    def where(self) -> str:
        return f"the Ray cluster's lease keeper on {socket.gethostname()}, kept in {self.path}"

    def acquire(self, devices, holder, kind, duration_s, note=""):
        self._ready()
        result = self.table.acquire(devices, holder, kind, duration_s, time.time(), note)
        if not isinstance(result, Refused):
            self._save()
        return result

    def renew(self, ids, duration_s):
        self._ready()
        renewed = self.table.renew(ids, duration_s, time.time())
        self._save()
        return renewed

    def release(self, ids=None, user=None, identities=None):
        self._ready()
        released = self.table.release(ids, user, identities)
        if released:
            self._save()
        return released

    def leases(self):
        self._ready()
        self.table.expire(time.time())
        return list(self.table.leases)

    def _ready(self) -> None:
        """Refuse while the table is broken; else set every lease's wall-clock end from its boot-time end, so a
        step of the head node's wall clock neither ends a lease early nor keeps it late.
        """
        if self.broken is not None:
            raise RuntimeError(f"{self.broken}\n  try: move it away (its leases are lost) and ask again")
        now_wall, now_boot = time.time(), time.clock_gettime(time.CLOCK_BOOTTIME)
        self.table.leases = [
            replace(lease, until=now_wall + (self._ends[lease.id] - now_boot)) if lease.id in self._ends else lease
            for lease in self.table.leases
        ]

    def _load(self, data) -> None:
        if not isinstance(data, dict) or data.get("version") != 2 or not isinstance(data.get("leases"), list):
            raise ValueError("not a version 2 lease table")
        for item in data["leases"]:
            if not isinstance(item, dict):
                raise ValueError(f"not a lease entry: {item!r:.60}")
            lease = with_boot_clock(Lease.from_json(item.get("lease")), item.get("clock"))
            self.table.leases.append(lease)

    def _save(self) -> None:
        now_wall, now_boot = time.time(), time.clock_gettime(time.CLOCK_BOOTTIME)
        self._ends = {lease.id: now_boot + (lease.until - now_wall) for lease in self.table.leases}
        data = {
            "version": 2,
            "leases": [{"lease": lease.to_json(), "clock": boot_clock(lease.until)} for lease in self.table.leases],
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{FILE_NAME}.{os.getpid()}.{time.monotonic_ns()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, json.dumps(data, indent=1).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)  # a crash mid-write leaves the previous table, never half of one
        folder = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def _read_own(path) -> str:
    """The keeper's table, if it is a regular file of the keeper's own account that nobody else may write: the
    folder is shared (/var/tmp), so a table planted there by another account is refused, not believed.
    """
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise ValueError(f"not the keeper's own file (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})")
        return os.read(fd, 1 << 24).decode()
    finally:
        os.close(fd)


class RayLeaseStore:
    """The client side: the same operations as FileLeaseStore, answered by the cluster's LeaseKeeper."""

    def __init__(self, ray) -> None:
        self._ray = ray
        self._keeper = _keeper(ray)
        self._where: str | None = None

    @property
    def where(self) -> str:
        if self._where is None:
            self._where = self._get(self._keeper.where.remote())
        return self._where

    def acquire(
        self, devices: dict[str, str], holder: Holder, kind: Kind, duration_s: float, note: str = ""
    ) -> list[Lease] | Refused:
        return self._get(self._keeper.acquire.remote(devices, holder, kind, duration_s, note))

    def renew(self, ids: list[str], duration_s: float) -> list[Lease]:
        return self._get(self._keeper.renew.remote(ids, duration_s))

    def release(self, ids=None, user=None, identities=None) -> list[Lease]:
        return self._get(self._keeper.release.remote(ids, user, identities))

    def list(self) -> list[Lease]:
        return self._get(self._keeper.leases.remote())

    def _get(self, ref):
        from testbed.contracts.errors import UserError

        try:
            return self._ray.get(ref, timeout=30)
        except Exception as exc:  # the keeper's node gone, the cluster unreachable, its table unreadable
            raise UserError(
                f"the lease keeper ({ACTOR_NAME}) on the Ray cluster did not answer: {type(exc).__name__}: {exc}\n"
                "  try: `ray status` on the head node; leases cannot be checked while it is unreachable"
            ) from None


def _keeper(ray):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    head = _head_node_id(ray)
    options = dict(name=ACTOR_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0)
    if head is not None:  # its file lives on the head node, which outlives the other nodes
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(head, soft=False)
    return ray.remote(LeaseKeeper).options(max_restarts=-1, **options).remote()


def _head_node_id(ray) -> str | None:
    for node in ray.nodes():
        if node.get("Alive") and "node:__internal_head__" in node.get("Resources", {}):
            return node["NodeID"]
    return None
