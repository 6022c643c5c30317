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

from testbed.leases.file_store import lease_dir
from testbed.leases.table import Holder, Kind, Lease, LeaseTable, Refused

ACTOR_NAME = "testbed-leases"
NAMESPACE = "testbed"
FILE_NAME = "cluster-leases.json"


class LeaseKeeper:
    """The actor: the table in memory, written through to `path` on its node."""

    def __init__(self) -> None:
        self.path = lease_dir() / FILE_NAME
        self.table = LeaseTable()
        try:
            self.table = LeaseTable.from_json(json.loads(self.path.read_text()))
        except FileNotFoundError:
            pass
        except (OSError, ValueError):
            # Unreadable: kept aside for a person to look at, never silently overwritten.
            os.replace(self.path, self.path.with_suffix(f".unreadable-{int(time.time())}"))

    def where(self) -> str:
        return f"the Ray cluster's lease keeper on {socket.gethostname()}, kept in {self.path}"

    def acquire(self, devices, holder, kind, duration_s, note=""):
        result = self.table.acquire(devices, holder, kind, duration_s, time.time(), note)
        if not isinstance(result, Refused):
            self._save()
        return result

    def renew(self, ids, duration_s):
        renewed = self.table.renew(ids, duration_s, time.time())
        self._save()
        return renewed

    def release(self, ids=None, user=None, addresses=None):
        released = self.table.release(ids, user, addresses)
        if released:
            self._save()
        return released

    def leases(self):
        self.table.expire(time.time())
        return list(self.table.leases)

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.table.to_json(), indent=1))
        os.replace(tmp, self.path)  # a crash mid-write leaves the previous table, never half of one


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

    def release(self, ids=None, user=None, addresses=None) -> list[Lease]:
        return self._get(self._keeper.release.remote(ids, user, addresses))

    def list(self) -> list[Lease]:
        return self._get(self._keeper.leases.remote())

    def _get(self, ref):
        from testbed.contracts.errors import UserError

        try:
            return self._ray.get(ref, timeout=30)
        except Exception as exc:  # the keeper's node gone, the cluster unreachable
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
