"""Membership of a job that recovers in place: generations of members in a store that outlives every rank.

The controller (testbed's failover step, or a test) holds a `torch.distributed.TCPStore` server; the ranks and
the spares connect to it as clients (TESTBED_STORE=host:port). The keys, which the controller and the job share:

- `members/gen{G}`: generation G's members, JSON `{"members": {slot: rank}}` (a slot is a host's place in the job,
  e.g. its host name; the ranks are 0 .. W-1);
- `abort/gen{G}`: set once generation G is broken (a rank died or hangs): its members stop using its process group;
- `generation`: the newest G published;
- `gen{G}/...`: generation G's rendezvous, a prefix of its own (`PrefixStore(f"gen{G}/", store)`): each member's
  join key (`gen{G}/join/{rank}`: its slot and the newest step whose state it holds) and its process group's keys.

The controller publishes generation 0 before the ranks start, and on a failure generation G+1 (the spare in the
failed slot) with the abort mark of G: a rewired circuit sends no TCP reset, so nothing in the job notices unless
told. A rank whose own collective fails marks its generation aborted too, so its peers that were not wired to the
failed rank stop waiting at once instead of at the process group's timeout.

Standard library only: the store is any c10d store object (PyTorch is imported by `connect` alone, which a rank
calls anyway), so the controller's side runs where PyTorch is installed, and this module imports where it is not.
"""

from __future__ import annotations

import datetime
import json
import threading
from dataclasses import dataclass

GENERATION = "generation"
FOREVER = 10 * 365 * 86400.0  # "no bound": a parked spare waits as long as the store is up


def members_key(generation: int) -> str:
    return f"members/gen{generation}"


def abort_key(generation: int) -> str:
    return f"abort/gen{generation}"


def rendezvous_prefix(generation: int) -> str:
    return f"gen{generation}/"


def join_key(rank: int) -> str:
    return f"join/{rank}"


class MembershipError(RuntimeError):
    """A wait on the store ended without what it waited for (a bound passed, the store gone): the text says which."""


class StoreGone(MembershipError):
    """The controller's store closed the connection or cannot be reached: no generation can come any more."""


@dataclass(frozen=True)
class Generation:
    """Generation `number`: its members, each slot's rank."""

    number: int
    members: dict[str, int]

    @property
    def world_size(self) -> int:
        return len(self.members)

    def slot_of(self, rank: int) -> str:
        return next(slot for slot, r in self.members.items() if r == rank)

    def replaced(self, failed_slot: str, spare_slot: str) -> Generation:
        """The next generation: `spare_slot` in `failed_slot`'s place, with its rank; the others keep theirs."""
        if failed_slot not in self.members:
            raise MembershipError(f"slot {failed_slot!r} is not a member of generation {self.number}")
        if spare_slot in self.members:
            raise MembershipError(f"slot {spare_slot!r} is a member of generation {self.number} already")
        members = {(spare_slot if s == failed_slot else s): r for s, r in self.members.items()}
        return Generation(self.number + 1, members)


def connect(address: str, timeout: float):
    """A client of the controller's TCPStore at `address` (host:port); each thread that waits on it needs its own."""
    import torch.distributed as dist

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise MembershipError(f"the store's address {address!r} is not host:port")
    try:
        return dist.TCPStore(
            host, int(port), is_master=False, timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False
        )
    except RuntimeError as exc:
        raise StoreGone(f"the controller's store at {address} cannot be reached: {_first_line(exc)}") from None


# The controller's side.


def publish(store, generation: Generation, reason: str = "") -> None:
    """Make `generation` the current one: its members first, then the previous generation's abort mark (so a
    member that notices the mark finds its next generation there), then the `generation` key.
    """
    members = {"members": generation.members}
    store.set(members_key(generation.number), json.dumps(members))
    if generation.number > 0:
        abort(store, generation.number - 1, reason or f"generation {generation.number} published")
    store.set(GENERATION, str(generation.number))


def abort(store, generation: int, reason: str) -> None:
    """Mark `generation` broken: its members leave its process group (and wait for the next generation)."""
    store.set(abort_key(generation), reason)


def read_generation(store, number: int) -> Generation:
    """Generation `number` as published (the caller knows it exists: it waited for its key)."""
    return Generation(number, {s: int(r) for s, r in json.loads(store.get(members_key(number)))["members"].items()})


# The members' side.


def next_generation(store, slot: str, after: int, timeout: float) -> Generation:
    """The first generation after `after` that names `slot` and is not aborted already, waiting at most `timeout`
    seconds for each one to be published (a parked spare passes FOREVER).
    """
    number = after + 1
    while True:
        _wait(store, [members_key(number)], timeout, f"generation {number} was not published")
        generation = read_generation(store, number)
        if slot in generation.members and not store.check([abort_key(number)]):
            return generation
        number += 1


def join(store, generation: Generation, rank: int, held_step: int, timeout: float) -> dict[int, int]:
    """Announce this member in `generation`'s rendezvous (with the newest step whose state it holds, -1 for none)
    and wait for every other member's announcement; each rank's held step. A member that does not come within
    `timeout` seconds ends it with an error naming its slot.
    """
    rendezvous = _prefixed(store, generation.number)
    rendezvous.set(join_key(rank), json.dumps({"slot": generation.slot_of(rank), "step": held_step}))
    keys = [join_key(r) for r in range(generation.world_size)]
    try:
        _wait(rendezvous, keys, timeout, "")
    except StoreGone:
        raise
    except MembershipError:
        missing = [r for r in range(generation.world_size) if not rendezvous.check([join_key(r)])]
        named = ", ".join(f"slot {generation.slot_of(r)} (rank {r})" for r in missing)
        raise MembershipError(f"generation {generation.number}: {named} did not join within {timeout:g} s") from None
    return {r: int(json.loads(rendezvous.get(join_key(r)))["step"]) for r in range(generation.world_size)}


def rendezvous_store(store, generation: int):
    """Generation `generation`'s own prefix of the store, where its process group meets."""
    return _prefixed(store, generation)


class AbortWatch:
    """A thread that waits on its own store connection for the abort mark of the generation the rank is in, and
    calls `wake` when it comes (or when the store goes): a rank blocked in a collective learns of it at once.
    """

    def __init__(self, store, wake) -> None:
        self._store = store
        self._wake = wake
        self._lock = threading.Condition()
        self._watching = -1  # no generation yet
        self._aborted: set[int] = set()
        self.store_gone: str | None = None
        threading.Thread(target=self._run, name="abort-watch", daemon=True).start()

    def watch(self, generation: int) -> None:
        with self._lock:
            self._watching = generation
            self._lock.notify()

    def aborted(self, generation: int) -> bool:
        with self._lock:
            return generation in self._aborted

    def _run(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._watching >= 0 and self._watching not in self._aborted)
                generation = self._watching
            try:
                _wait(self._store, [abort_key(generation)], FOREVER, "")
            except MembershipError as exc:  # the store is gone: no abort mark can come any more
                self.store_gone = str(exc)
                self._wake()
                return
            with self._lock:
                self._aborted.add(generation)
            self._wake()


def _prefixed(store, generation: int):
    import torch.distributed as dist

    return dist.PrefixStore(rendezvous_prefix(generation), store)


def _wait(store, keys: list[str], timeout: float, what: str) -> None:
    """store.wait, its two failures told apart: the bound passed (DistStoreError) or the store is gone (any other
    error: the connection closed or refused).
    """
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout))
    except RuntimeError as exc:
        if type(exc).__name__ == "DistStoreError":
            raise MembershipError(f"{what or 'the wait'} within {timeout:g} s") from None
        raise StoreGone(f"the controller's store is gone: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
