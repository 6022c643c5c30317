"""Leases on a shared lab's devices: who holds which device, until when, and why (docs/leases.md).

    store = lease_store(ray)            # the cluster's keeper when the run joined one, else this machine's folder
    with held(store, {"ocs1": identity}, me(run_id), wait=False) as leases:
        leases.check()                  # before every write: raises LeaseLapsed once the leases are not held
        ...                             # the devices are this run's; renewed in the background; released after

`testbed lease acquire / list / release` are the same operations by hand (testbed/cli/leases.py).
Emulated runs take no lease: the twin is nobody else's.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import threading
import time
from typing import Protocol

from testbed.contracts.errors import ExperimentFailed, UserError
from testbed.leases.identity import device_identity, told_identity
from testbed.leases.table import Holder, Kind, Lease, LeaseTable, Refused

RUN_LEASE_S = 60.0  # a run's lease: renewed every third of it while the run lives, so a dead run's lapses soon
WAIT_POLL_S = 1.0


class LeaseStore(Protocol):
    @property
    def where(self) -> str: ...

    def acquire(
        self, devices: dict[str, str], holder: Holder, kind: Kind, duration_s: float, note: str = ""
    ) -> list[Lease] | Refused: ...

    def renew(self, ids: list[str], duration_s: float) -> list[Lease]: ...

    def release(self, ids=None, user=None, identities=None) -> list[Lease]: ...

    def list(self) -> list[Lease]: ...


def lease_store(ray=None) -> LeaseStore:
    """The cluster's lease keeper when given the ray module of a joined cluster, else this machine's folder."""
    if ray is not None:
        from testbed.leases.ray_store import RayLeaseStore

        return RayLeaseStore(ray)
    from testbed.leases.file_store import FileLeaseStore

    return FileLeaseStore()


def me(run: str | None = None) -> Holder:
    """This account on this control host, in this process (and run). The account is the process's own, not what
    $USER says: a lease file is believed only if the account its lease names owns it.
    """
    uid = os.geteuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return Holder(user, socket.gethostname(), os.getpid(), run)


def run_lease_s() -> float:
    value = os.environ.get("TESTBED_LEASE_TTL_S")
    try:
        return float(value) if value else RUN_LEASE_S
    except ValueError:
        raise UserError(f"TESTBED_LEASE_TTL_S={value!r}: give the seconds a run's lease lasts, e.g. 60") from None


class LeaseHeld(UserError):
    """A device is another's: names each blocking lease (holder, until, note) and what to do."""

    def __init__(self, refused: Refused, store: LeaseStore | str) -> None:
        where = store if isinstance(store, str) else store.where
        lines = [lease.describe() for lease in refused.blocking]
        super().__init__(
            "\n  ".join(["the lab's leases refuse this:", *lines])
            + f"\n  try: --wait to run once they are free; `testbed lease list` shows every lease ({where})"
        )
        self.blocking = refused.blocking
        self.where = where

    def __reduce__(self):
        return (LeaseHeld, (Refused(self.blocking), self.where))


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


class LeaseLapsed(ExperimentFailed):
    """The run's leases are no longer certainly held (they lapsed, or could not be renewed in time): another user
    may hold the devices by now, so the run stops driving them.
    """


class HeldLeases:
    """A run's leases while it holds them: `check()` before every write. Renewed on a thread every third of their
    life; they count as held until the last renewal's end (by the boot-time clock, which a suspend or a paused
    process cannot fool, and by the wall clock), and not at all once a renewal says one has lapsed.
    """

    def __init__(self, store: LeaseStore, leases: list[Lease], ttl: float) -> None:
        self.store = store
        self.leases = list(leases)
        self.ttl = ttl
        self._lock = threading.Lock()
        self._lapsed: str | None = None
        now_boot, now_wall = _clocks()
        self._until_boot, self._until_wall = now_boot + ttl, now_wall + ttl

    def check(self) -> None:
        """Raises LeaseLapsed unless every lease is still certainly held."""
        with self._lock:
            lapsed = self._lapsed
            until_boot, until_wall = self._until_boot, self._until_wall
        now_boot, now_wall = _clocks()
        if lapsed is None and (now_boot >= until_boot or now_wall >= until_wall):
            lapsed = f"not renewed since {time.strftime('%H:%M:%S', time.localtime(until_wall - self.ttl))}"
        if lapsed is not None:
            raise LeaseLapsed(
                f"the run's leases on {', '.join(lease.device for lease in self.leases)} lapsed ({lapsed}): another "
                f"user may hold these devices now, so the run stopped before its next command ({self.store.where})"
            )

    def renew_once(self) -> None:
        """One renewal: the leases held for another `ttl` from now, or lapsed if the store says one is gone."""
        started_boot, started_wall = _clocks()
        ids = [lease.id for lease in self.leases]
        renewed = self.store.renew(ids, self.ttl)
        with self._lock:
            missing = sorted(set(ids) - {lease.id for lease in renewed})
            if missing:
                gone = [lease.device for lease in self.leases if lease.id in missing]
                self._lapsed = self._lapsed or f"{', '.join(gone)} no longer held when renewed"
            else:
                self._until_boot, self._until_wall = started_boot + self.ttl, started_wall + self.ttl

    def add(self, devices: dict[str, str], holder: Holder) -> None:
        """Lease more identities of the run's devices (a serial number the devices told at identify), all or none;
        raises LeaseHeld if another holds one (the same device under another address).
        """
        leases = acquire(self.store, devices, holder, "run", self.ttl)
        with self._lock:
            self.leases.extend(leases)

    @property
    def lapsed(self) -> bool:
        try:
            self.check()
        except LeaseLapsed:
            return True
        return False


def _clocks() -> tuple[float, float]:
    return time.clock_gettime(time.CLOCK_BOOTTIME), time.time()


@contextlib.contextmanager
def held(store: LeaseStore, devices: dict[str, str], holder: Holder, *, wait: bool = False, on_wait=None):
    """A run's leases on `devices` (name -> identity) for the block: taken (or waited for), renewed on a thread while
    the block runs, released at its end. Yields a HeldLeases.
    """
    ttl = run_lease_s()
    leases = HeldLeases(store, acquire(store, devices, holder, "run", ttl, wait=wait, on_wait=on_wait), ttl)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(ttl / 3) and not leases.lapsed:
            with contextlib.suppress(Exception):  # a store briefly unreachable: tried again; check() says when
                leases.renew_once()  # the leases can no longer be counted on

    renewer = threading.Thread(target=renew, name="lease-renewal", daemon=True)
    renewer.start()
    try:
        yield leases
    finally:
        stop.set()
        renewer.join(timeout=5)
        with contextlib.suppress(Exception):  # unreleased, they lapse within the lease's time
            store.release(ids=[lease.id for lease in leases.leases])


def identities(inventory, devices) -> dict[str, str]:
    """Device name -> identity (testbed.leases.identity) for these devices of an inventory."""
    return {d: device_identity(inventory.devices[d].transport) for d in devices}


__all__ = [
    "HeldLeases",
    "Holder",
    "Lease",
    "LeaseHeld",
    "LeaseLapsed",
    "LeaseStore",
    "LeaseTable",
    "Refused",
    "acquire",
    "device_identity",
    "held",
    "identities",
    "lease_store",
    "me",
    "run_lease_s",
    "told_identity",
]
