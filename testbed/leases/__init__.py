"""Leases on a shared lab's devices: who holds which device, until when, and why (docs/leases.md).

    store = lease_store(ray)            # the cluster's keeper when the run joined one, else this machine's file
    with held(store, {"ocs1": address}, me(run_id), wait=False):
        ...                             # the devices are this run's; renewed in the background; released after

`testbed lease acquire / list / release` are the same operations by hand (testbed/cli/leases.py).
Emulated runs take no lease: the twin is nobody else's.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
import threading
import time
from typing import Protocol

from testbed.contracts.errors import UserError
from testbed.leases.table import Holder, Kind, Lease, LeaseTable, Refused

RUN_LEASE_S = 60.0  # a run's lease: renewed every third of it while the run lives, so a dead run's lapses soon
WAIT_POLL_S = 1.0


class LeaseStore(Protocol):
    where: str

    def acquire(
        self, devices: dict[str, str], holder: Holder, kind: Kind, duration_s: float, note: str = ""
    ) -> list[Lease] | Refused: ...

    def renew(self, ids: list[str], duration_s: float) -> list[Lease]: ...

    def release(self, ids=None, user=None, addresses=None) -> list[Lease]: ...

    def list(self) -> list[Lease]: ...


def lease_store(ray=None) -> LeaseStore:
    """The cluster's lease keeper when given the ray module of a joined cluster, else this machine's file."""
    if ray is not None:
        from testbed.leases.ray_store import RayLeaseStore

        return RayLeaseStore(ray)
    from testbed.leases.file_store import FileLeaseStore

    return FileLeaseStore()


def me(run: str | None = None) -> Holder:
    """This user on this control host, in this process (and run)."""
    return Holder(getpass.getuser(), socket.gethostname(), os.getpid(), run)


def run_lease_s() -> float:
    value = os.environ.get("TESTBED_LEASE_TTL_S")
    try:
        return float(value) if value else RUN_LEASE_S
    except ValueError:
        raise UserError(f"TESTBED_LEASE_TTL_S={value!r}: give the seconds a run's lease lasts, e.g. 60") from None


class LeaseHeld(UserError):
    """A device is another's: names each blocking lease (holder, until, note) and what to do."""

    def __init__(self, refused: Refused, store: LeaseStore) -> None:
        lines = [lease.describe() for lease in refused.blocking]
        super().__init__(
            "\n  ".join(["the lab's leases refuse this:", *lines])
            + f"\n  try: --wait to run once they are free; `testbed lease list` shows every lease ({store.where})"
        )
        self.blocking = refused.blocking


def acquire(
    store: LeaseStore,
    devices: dict[str, str],
    holder: Holder,
    kind: Kind,
    duration_s: float,
    *,
    note: str = "",
    wait: bool = False,
    on_wait=None,
) -> list[Lease]:
    """Take the leases, all or none; with wait, try again until they are free (on_wait(blocking) is told
    whenever what blocks changes). Raises LeaseHeld otherwise.
    """
    seen: set[str] = set()
    while True:
        result = store.acquire(devices, holder, kind, duration_s, note)
        if not isinstance(result, Refused):
            return result
        if not wait:
            raise LeaseHeld(result, store)
        ids = {lease.id for lease in result.blocking}
        if on_wait is not None and ids != seen:
            on_wait(result.blocking)
        seen = ids
        time.sleep(WAIT_POLL_S)  # polls the store: a lease may end by expiry, which nobody announces


@contextlib.contextmanager
def held(store: LeaseStore, devices: dict[str, str], holder: Holder, *, wait: bool = False, on_wait=None):
    """A run's leases on `devices` for the block: taken (or waited for), renewed on a thread while the block
    runs, released at its end. Yields the leases.
    """
    ttl = run_lease_s()
    leases = acquire(store, devices, holder, "run", ttl, wait=wait, on_wait=on_wait)
    ids = [lease.id for lease in leases]
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(ttl / 3):
            with contextlib.suppress(Exception):  # a store briefly unreachable: tried again a third later
                store.renew(ids, ttl)

    renewer = threading.Thread(target=renew, name="lease-renewal", daemon=True)
    renewer.start()
    try:
        yield leases
    finally:
        stop.set()
        renewer.join(timeout=5)
        with contextlib.suppress(Exception):  # unreleased, it lapses within the lease's time
            store.release(ids=ids)


__all__ = [
    "Holder",
    "Lease",
    "LeaseHeld",
    "LeaseStore",
    "LeaseTable",
    "Refused",
    "acquire",
    "held",
    "lease_store",
    "me",
    "run_lease_s",
]
