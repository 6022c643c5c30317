"""Leases kept in a file on this machine: the store of a lab with no Ray cluster, where every run starts on one
control host. Needs no set-up: the folder is made on first use, shared by every account on the machine (the
sticky bit keeps it like /tmp: anyone may add, nobody may delete another's file).

Leases are cooperative, as labgrid's reservations are: they keep well-meaning users of testbed out of each
other's way; access to the devices themselves is the lab's (SSH keys, BMC credentials).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from testbed.leases.table import Holder, Kind, Lease, LeaseTable, Refused

DEFAULT_DIR = "/var/tmp/testbed-leases"  # survives a reboot, unlike /tmp on many systems; a reservation may too
FILE_NAME = "leases.json"


def lease_dir() -> Path:
    return Path(os.environ.get("TESTBED_LEASE_DIR") or DEFAULT_DIR)


class FileLeaseStore:
    def __init__(self, folder: Path | None = None) -> None:
        self.path = (folder or lease_dir()) / FILE_NAME

    @property
    def where(self) -> str:
        return f"this machine's lease file {self.path}"

    def acquire(
        self, devices: dict[str, str], holder: Holder, kind: Kind, duration_s: float, note: str = ""
    ) -> list[Lease] | Refused:
        with self._table() as table:
            return table.acquire(devices, holder, kind, duration_s, time.time(), note)

    def renew(self, ids: list[str], duration_s: float) -> list[Lease]:
        with self._table() as table:
            return table.renew(ids, duration_s, time.time())

    def release(self, ids=None, user=None, addresses=None) -> list[Lease]:
        with self._table() as table:
            return table.release(ids, user, addresses)

    def list(self) -> list[Lease]:
        with self._table() as table:
            table.expire(time.time())
            return list(table.leases)

    @contextlib.contextmanager
    def _table(self):
        """The table, read and written back under an exclusive flock (every change is one read-modify-write)."""
        from testbed.contracts.errors import UserError

        try:
            _make_shared_dir(self.path.parent)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise UserError(
                f"cannot open the lease file {self.path}: {exc.strerror}\n  try: set TESTBED_LEASE_DIR to a folder "
                "every user of this machine may write to"
            ) from None
        try:
            with contextlib.suppress(OSError):  # only its creator may; the mode it was made with stays
                os.fchmod(fd, 0o666)  # every account on the machine shares the table
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, 1 << 24, 0)
            try:
                table = LeaseTable.from_json(json.loads(raw)) if raw.strip() else LeaseTable()
            except ValueError as exc:
                raise UserError(
                    f"the lease file {self.path} is not a lease table ({exc}); move it away to start afresh"
                ) from None
            before = table.to_json()
            yield table
            after = table.to_json()
            if after != before:
                data = json.dumps(after, indent=1).encode()
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)
                os.fsync(fd)
        finally:
            os.close(fd)


def _make_shared_dir(path: Path) -> None:
    if path.is_dir():
        return
    path.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o1777)
