"""Leases kept on this machine, for a lab with no Ray cluster: one file per lease, created by its holder in a folder
every account shares, and written by nobody else (docs/leases.md has the threat model).

The folder is /var/tmp (it survives a reboot, as a reservation may), which root owns and which has the sticky bit:
anyone may add a file, only its owner may replace or remove it. So a lease file is its holder's alone: it is
written to a temporary file, synced and renamed into place (a crash leaves the old lease or the new one, never half
of either), renewed the same way, removed by its holder at release, and ignored once expired. Nothing in the
folder is followed through a symbolic link, and a file is believed only if it is a regular file of one link, owned
by the account its lease names, writable by that account alone, and named after its device and its id; any other
file under a lease's name makes its device refused (fails closed), naming the file, until its owner or root
removes it.

Taking a lease is "write, then look": the new lease files are written first, then every lease of the folder is
read again; if another holder's lease now blocks one of them, the new files are removed and the take is refused
(two holders writing at once may both be refused, never both granted). Expiry is kept by the wall clock for a
later boot, and by the boot-time clock (which neither a wall-clock step nor a suspend fools) within one boot.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import json
import os
import pwd
import random
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from testbed.contracts.errors import UserError
from testbed.leases.table import Holder, Kind, Lease, LeaseTable, Refused, new_id, replaced_by

DEFAULT_DIR = "/var/tmp"  # root's and sticky: nobody may replace another's file there; it survives a reboot
VERSION = 2
MAX_FILE = 64 * 1024  # a lease file is a few hundred bytes
# The longest a lease lasts (as `testbed lease acquire --for` allows, testbed/cli/leases.py), counted from when its
# file was last written (its ctime, which the kernel sets and no one can set back): a hand-written file asking for
# ten years holds its device no longer than one written by testbed.
LIFETIME_CAP_S = 14 * 86400
RACE_RETRIES = 3  # takes tried again when they lost only to a lease written at the same moment
RACE_WINDOW_S = 2.0
_NAME = re.compile(r"^testbed-lease-(?P<key>[0-9a-f]{20})-(?P<id>[0-9a-f]{12})\.json$")


def lease_dir() -> Path:
    return Path(os.environ.get("TESTBED_LEASE_DIR") or DEFAULT_DIR)


def device_key(identity: str) -> str:
    """The part of a lease file's name that says which device it is on."""
    return hashlib.sha256(identity.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Damaged:
    """A file under a lease's name that cannot be believed: its device is refused until it is gone."""

    path: Path
    key: str
    why: str


class LeaseFolderError(UserError):
    """The lease folder itself cannot be trusted (a link, another user's folder, no sticky bit) or reached."""


class FileLeaseStore:
    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder or lease_dir()
        self.damaged: list[Damaged] = []  # what the last list() found that cannot be believed

    @property
    def where(self) -> str:
        return f"this machine's lease folder {self.folder}"

    # --- the store's operations (testbed.leases.LeaseStore) ----------------------------------------------

    def acquire(
        self, devices: dict[str, str], holder: Holder, kind: Kind, duration_s: float, note: str = ""
    ) -> list[Lease] | Refused:
        if duration_s <= 0:
            raise ValueError(f"a lease must last a positive time, not {duration_s} s")
        for attempt in range(RACE_RETRIES + 1):
            with self._folder() as fd:
                self._sweep(fd)
                result = self._try(fd, devices, holder, kind, duration_s, note)
            if not isinstance(result, Refused) or attempt == RACE_RETRIES or not _lost_a_race(result):
                return result
            time.sleep(random.uniform(0.01, 0.05))  # both sides of a race back off; one of them wins next time
        return result

    def renew(self, ids: list[str], duration_s: float) -> list[Lease]:
        """Extend this account's leases with these ids, if each is still live; a lapsed one is not brought back."""
        renewed = []
        with self._folder() as fd:
            mine = {lease.id: (lease, name) for lease, name in self._own(fd)}
            now = time.time()
            for lease_id in ids:
                found = mine.get(lease_id)
                if found is None or found[0].until <= now:
                    continue
                lease, name = found
                longer = Lease(**{**lease.__dict__, "until": max(lease.until, now + duration_s)})
                self._write(fd, name, longer)
                renewed.append(longer)
            if renewed:
                os.fsync(fd)
        return renewed

    def release(self, ids=None, user=None, identities=None) -> list[Lease]:
        """This account's leases by id, or its reservations (on these identities, or all). Another account's lease
        file cannot be removed from the sticky folder: it ends at its time (or root removes it).
        """
        table = LeaseTable()
        with self._folder() as fd:
            own = self._own(fd)
            table.leases = [lease for lease, _ in own]
            released = table.release(ids, user, identities)
            names = {lease.id: name for lease, name in own}
            for lease in released:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(names[lease.id], dir_fd=fd)
            os.fsync(fd)
            if ids is not None:
                foreign = set(ids) - {lease.id for lease in released}
                others = [lease for lease in self._scan(fd)[0] if lease.id in foreign]
                if others:
                    raise UserError(
                        "only its holder (or root) can end another account's lease: "
                        + "; ".join(lease.describe() for lease in others)
                    )
        return released

    def list(self) -> list[Lease]:
        with self._folder() as fd:
            leases, damaged = self._scan(fd)
        self.damaged = damaged
        now = time.time()
        return [lease for lease in leases if lease.until > now]

    # --- taking ------------------------------------------------------------------------------------------

    def _try(self, fd: int, devices, holder: Holder, kind: Kind, duration_s: float, note: str):
        leases, damaged = self._scan(fd)
        _refuse_damaged(damaged, devices)
        now = time.time()
        table = LeaseTable([lease for lease in leases if lease.until > now])
        blocking = [lease for identity in devices.values() for lease in table.blocking(identity, holder, kind)]
        if blocking:
            return Refused(blocking)
        taken = [
            Lease(new_id(), device, identity, holder, kind, now, now + duration_s, note)
            for device, identity in devices.items()
        ]
        for lease in taken:
            self._write(fd, _file_name(lease), lease)
        os.fsync(fd)
        # Look again: a holder that wrote at the same moment is seen now, by both sides.
        leases, damaged = self._scan(fd)
        mine = {lease.id for lease in taken}
        table = LeaseTable([lease for lease in leases if lease.until > time.time() and lease.id not in mine])
        blocking = [lease for identity in devices.values() for lease in table.blocking(identity, holder, kind)]
        if blocking or any(d.key in {device_key(i) for i in devices.values()} for d in damaged):
            for lease in taken:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(_file_name(lease), dir_fd=fd)
            os.fsync(fd)
            _refuse_damaged(damaged, devices)
            return Refused(blocking)
        if kind == "reservation":  # a reservation taken again replaces the holder's older one
            for lease, name in self._own(fd):
                if lease.id not in mine and any(replaced_by(lease, i, holder) for i in devices.values()):
                    os.unlink(name, dir_fd=fd)
            os.fsync(fd)
        return taken

    def _sweep(self, fd: int) -> None:
        """Remove this account's expired lease files (another's stay until their owner's next command; ignored)."""
        now = time.time()
        for lease, name in self._own(fd):
            if lease.until <= now:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=fd)

    # --- files -------------------------------------------------------------------------------------------

    def _write(self, fd: int, name: str, lease: Lease) -> None:
        """Write a lease file of this account's, whole: a new temporary file, synced, renamed over `name`."""
        data = json.dumps({"version": VERSION, "lease": lease.to_json(), "clock": boot_clock(lease.until)}).encode()
        tmp = f".testbed-lease-{lease.id}-{os.getpid()}-{random.getrandbits(32):08x}.tmp"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd)
        try:
            os.fchmod(out, 0o644)  # whatever the umask: readable by every account, writable by this one only
            os.write(out, data)
            os.fsync(out)
        finally:
            os.close(out)
        try:
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
            raise

    def _scan(self, fd: int) -> tuple[builtins.list[Lease], builtins.list[Damaged]]:
        """Every lease file of the folder that can be believed, and every one that cannot."""
        leases, damaged = [], []
        for name in os.listdir(fd):
            m = _NAME.match(name)
            if m is None:
                continue
            try:
                lease = self._read(fd, name, m["key"], m["id"])
            except _Unbelievable as exc:
                damaged.append(Damaged(self.folder / name, m["key"], str(exc)))
                continue
            if lease is not None:
                leases.append(lease)
        return leases, damaged

    def _own(self, fd: int) -> builtins.list[tuple[Lease, str]]:
        uid = os.geteuid()
        found = []
        for name in os.listdir(fd):
            m = _NAME.match(name)
            if m is None:
                continue
            with contextlib.suppress(OSError):
                if os.stat(name, dir_fd=fd, follow_symlinks=False).st_uid != uid:
                    continue
            try:
                lease = self._read(fd, name, m["key"], m["id"])
            except _Unbelievable:
                continue
            if lease is not None:
                found.append((lease, name))
        return found

    def _read(self, fd: int, name: str, key: str, lease_id: str) -> Lease | None:
        """The lease in `name`, if it can be believed; None if it went away while read."""
        try:
            f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            why = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
            raise _Unbelievable(f"cannot be opened as a lease file ({why})") from None
        try:
            st = os.fstat(f)
            if not stat.S_ISREG(st.st_mode):
                raise _Unbelievable("not a regular file")
            if st.st_nlink == 0:
                return None  # unlinked while read: its holder withdrew it (a race lost, a release)
            if st.st_nlink != 1:
                raise _Unbelievable(f"has {st.st_nlink} links (a lease file has one)")
            if st.st_mode & 0o022:
                raise _Unbelievable(f"mode {stat.S_IMODE(st.st_mode):04o}: others may write it")
            if st.st_size > MAX_FILE:
                raise _Unbelievable(f"{st.st_size} bytes: not a lease")
            raw = os.read(f, MAX_FILE + 1)
        finally:
            os.close(f)
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise ValueError(f"not a version {VERSION} lease file")
            lease = Lease.from_json(data.get("lease"))
        except ValueError as exc:
            raise _Unbelievable(f"not a lease ({exc})") from None
        owner = _account(st.st_uid)
        if lease.holder.user != owner:
            raise _Unbelievable(f"names {lease.holder.user} as its holder, but {owner} owns it")
        if lease.id != lease_id or device_key(lease.identity) != key:
            raise _Unbelievable("its name is not its lease's device and id")
        return capped(with_boot_clock(lease, data.get("clock")), written=st.st_ctime)

    @contextlib.contextmanager
    def _folder(self) -> Iterator[int]:
        """The lease folder, opened without following a link, checked, made if missing."""
        try:
            self._make()
            fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            why = "a symbolic link" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else exc.strerror
            raise LeaseFolderError(
                f"cannot use the lease folder {self.folder}: {why}\n  try: remove it (it is remade on first use), "
                "or set TESTBED_LEASE_DIR to a folder this machine's testbed users share"
            ) from None
        try:
            _check_folder(self.folder, os.fstat(fd))
            yield fd
        finally:
            os.close(fd)

    def _make(self) -> None:
        """A folder TESTBED_LEASE_DIR names that is not there yet: made for this account (then no other account may
        use it: its owner could remove their leases; a folder for several accounts is root's to make).
        """
        with contextlib.suppress(FileExistsError):
            self.folder.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(self.folder, 0o755)


class _Unbelievable(Exception):
    pass


def _check_folder(folder: Path, st: os.stat_result) -> None:
    """Only root or this account may own the folder (its owner may remove anyone's file in it), and if others may
    write to it, it must have the sticky bit (so that nobody may replace or remove another's file).
    """
    if st.st_uid not in (0, os.geteuid()):
        raise LeaseFolderError(
            f"the lease folder {folder} belongs to {_account(st.st_uid)}, who could remove or replace any lease in "
            f"it\n  try: have root make it (install -d -m 1777 {folder}), or leave TESTBED_LEASE_DIR unset (/var/tmp)"
        )
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise LeaseFolderError(
            f"the lease folder {folder} is writable by others without the sticky bit (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): anyone could remove or replace a lease\n  try: chmod 1777 {folder}"
        )


def _refuse_damaged(damaged: list[Damaged], devices: dict[str, str]) -> None:
    keys = {device_key(identity): device for device, identity in devices.items()}
    bad = [d for d in damaged if d.key in keys]
    if bad:
        lines = [f"{keys[d.key]}: {d.path} {d.why}" for d in bad]
        raise UserError(
            "the lease folder holds a file under a lease's name that cannot be believed, so these devices are "
            "refused until it is gone:\n  " + "\n  ".join(lines) + "\n  try: its owner (or root) removes it"
        )


def _lost_a_race(refused: Refused) -> bool:
    """Whether every lease in the way was written a moment ago (by a take racing this one)."""
    now = time.time()
    return bool(refused.blocking) and all(now - lease.since < RACE_WINDOW_S for lease in refused.blocking)


def _file_name(lease: Lease) -> str:
    return f"testbed-lease-{device_key(lease.identity)}-{lease.id}.json"


def _account(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def boot_clock(until: float) -> dict:
    """A lease's end on this boot's boot-time clock, which counts a suspend and no wall-clock step."""
    return {"boot": boot_id(), "until": time.clock_gettime(time.CLOCK_BOOTTIME) + (until - time.time())}


def capped(lease: Lease, written: float) -> Lease:
    """The lease as long as a lease may be: ending at most LIFETIME_CAP_S after its file was written."""
    if lease.until <= written + LIFETIME_CAP_S:
        return lease
    return Lease(**{**lease.__dict__, "until": written + LIFETIME_CAP_S})


def with_boot_clock(lease: Lease, clock) -> Lease:
    """Within the boot that wrote it, a lease ends when the boot-time clock says; its wall time is corrected to
    match, so a wall-clock step neither ends it early nor keeps it late.
    """
    if not isinstance(clock, dict) or clock.get("boot") != boot_id() or not boot_id():
        return lease
    left = clock.get("until")
    if not isinstance(left, int | float) or isinstance(left, bool):
        return lease
    until = time.time() + (float(left) - time.clock_gettime(time.CLOCK_BOOTTIME))
    return Lease(**{**lease.__dict__, "until": until})
