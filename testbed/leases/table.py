"""The lease rules, apart from where leases are kept: one table of leases on devices, and what may be
taken while others hold some (docs/leases.md).

Two kinds of lease:
- a *reservation*, taken by hand (`testbed lease acquire ocs1 --for 2h`): the device is its holder's; another
  user's run or reservation is refused, the holder's own runs go ahead;
- a *run* lease, taken by `testbed run` on a lab for the devices it drives, renewed while it runs, released at
  its end: no other run, the holder's own included, drives those devices meanwhile.

A lease ends at `until` whatever happens to its holder, so a crashed client, a killed run or a cancelled CI
job never leaves the lab locked: a run's lease lives a short time (renewed while the run is alive), a
reservation as long as asked. Conflicts are keyed by the device's identity (testbed/leases/identity.py), not its
name nor the words that reach it: two inventories that name the same switch differently, or log in to it as two
users, still contend for it. Times are the store's clock (seconds since the epoch), so holders on several
machines agree on them.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Literal

Kind = Literal["reservation", "run"]


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: a user on a control host, and the process (and run) that took it."""

    user: str
    host: str
    pid: int = 0
    run: str | None = None  # the run that holds it; None for a reservation by hand

    def __str__(self) -> str:
        return f"{self.user}@{self.host}"


@dataclass(frozen=True)
class Lease:
    id: str
    device: str  # as the holder's inventory names it
    identity: str  # the device itself (testbed.leases.identity): what conflicts are keyed by
    holder: Holder
    kind: Kind
    since: float
    until: float
    note: str = ""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> Lease:
        """Raises ValueError for anything but a lease as to_json writes it."""
        if not isinstance(data, dict) or not isinstance(data.get("holder"), dict):
            raise ValueError(f"not a lease: {data!r:.80}")
        h = data["holder"]
        holder = Holder(_field(h, "user", str), _field(h, "host", str), _field(h, "pid", int), h.get("run"))
        if holder.run is not None and not isinstance(holder.run, str):
            raise ValueError(f"lease holder's run: {holder.run!r:.40} is not a run id")
        kind = _field(data, "kind", str)
        if kind not in ("reservation", "run"):
            raise ValueError(f"lease kind {kind!r:.40}: reservation or run")
        return cls(
            _field(data, "id", str),
            _field(data, "device", str),
            _field(data, "identity" if "identity" in data else "address", str),  # "address": a version 1 table
            holder,
            kind,
            float(_field(data, "since", (int, float))),
            float(_field(data, "until", (int, float))),
            _field(data, "note", str),
        )

    def describe(self) -> str:
        """'ocs1 (TCPIP0::...) is reserved by alice@ctrl-a until 21:40 ("tonight's sweep")'."""
        import time

        until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.until))
        what = "reserved" if self.kind == "reservation" else f"in use by run {self.holder.run}"
        note = f' ("{self.note}")' if self.note else ""
        who = f"{self.holder} (pid {self.holder.pid})"
        return f"{self.device} ({self.identity}) is {what} by {who} until {until}{note}"


def _field(data: dict, name: str, types):
    value = data.get(name)
    if not isinstance(value, types) or isinstance(value, bool):
        raise ValueError(f"lease field {name}: {value!r:.40} is not a {getattr(types, '__name__', 'number')}")
    return value


def new_id() -> str:
    return uuid.uuid4().hex[:12]


def replaced_by(lease: Lease, identity: str, holder: Holder) -> bool:
    """Whether taking a reservation on `identity` as `holder` replaces `lease` (the holder's own reservation)."""
    return lease.identity == identity and lease.kind == "reservation" and lease.holder.user == holder.user


@dataclass
class Refused:
    """What stood in the way of an acquire: the leases that block it (nothing was taken)."""

    blocking: list[Lease] = field(default_factory=list)


class LeaseTable:
    """Every lease of a store, with the rules for taking, renewing and releasing them. Pure: the caller passes
    the time and keeps the table (a file, an actor).
    """

    def __init__(self, leases: list[Lease] | None = None) -> None:
        self.leases: list[Lease] = list(leases or [])

    def expire(self, now: float) -> list[Lease]:
        """Drop the leases whose time is up; returns them."""
        gone = [lease for lease in self.leases if lease.until <= now]
        self.leases = [lease for lease in self.leases if lease.until > now]
        return gone

    def blocking(self, identity: str, holder: Holder, kind: Kind) -> list[Lease]:
        """The leases that keep `holder` from taking a `kind` lease on a device (expired ones already gone)."""
        found = []
        for lease in self.leases:
            if lease.identity != identity:
                continue
            if lease.holder.user != holder.user:
                found.append(lease)  # another user's lease, of either kind, keeps the device theirs
            elif kind == "run" and lease.kind == "run":
                found.append(lease)  # two runs never drive a device at once, whoever runs them
        return found

    def acquire(
        self,
        devices: dict[str, str],
        holder: Holder,
        kind: Kind,
        duration_s: float,
        now: float,
        note: str = "",
    ) -> list[Lease] | Refused:
        """Lease every device (name -> identity), or none of them. A reservation a user takes again on a device
        they already reserve replaces the old one (a new end, a new note).
        """
        if duration_s <= 0:
            raise ValueError(f"a lease must last a positive time, not {duration_s} s")
        self.expire(now)
        blocking = [lease for identity in devices.values() for lease in self.blocking(identity, holder, kind)]
        if blocking:
            return Refused(blocking)
        taken = []
        for device, identity in devices.items():
            if kind == "reservation":
                self.leases = [lease for lease in self.leases if not replaced_by(lease, identity, holder)]
            lease = Lease(new_id(), device, identity, holder, kind, now, now + duration_s, note)
            self.leases.append(lease)
            taken.append(lease)
        return taken

    def renew(self, ids: list[str], duration_s: float, now: float) -> list[Lease]:
        """Extend the leases still held (to now + duration_s); returns those renewed. A lease that expired
        meanwhile is not brought back: someone else may hold the device by now.
        """
        self.expire(now)
        wanted, renewed, kept = set(ids), [], []
        for lease in self.leases:
            if lease.id in wanted:
                lease = Lease(**{**lease.__dict__, "until": max(lease.until, now + duration_s)})
                renewed.append(lease)
            kept.append(lease)
        self.leases = kept
        return renewed

    def release(self, ids: list[str] | None = None, user: str | None = None, identities: list[str] | None = None):
        """Release leases by id, or a user's reservations (on the given devices' identities, or all of them);
        returns what was released.
        """

        def matches(lease: Lease) -> bool:
            if ids is not None:
                return lease.id in ids
            if user is None or lease.holder.user != user or lease.kind != "reservation":
                return False
            return identities is None or lease.identity in identities

        released = [lease for lease in self.leases if matches(lease)]
        self.leases = [lease for lease in self.leases if not matches(lease)]
        return released

    # -- persistence --------------------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {"version": 1, "leases": [lease.to_json() for lease in self.leases]}

    @classmethod
    def from_json(cls, data: dict) -> LeaseTable:
        if not isinstance(data, dict) or data.get("version") != 1 or not isinstance(data.get("leases"), list):
            raise ValueError("not a testbed lease table (version 1)")
        return cls([Lease.from_json(item) for item in data["leases"]])
