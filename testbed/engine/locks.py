"""One lock per device, shared by every `testbed run` (and `testbed heal`) of this account on this machine: two runs
cannot drive the same device, emulated ones included. A device is known by its identity (testbed.leases.identity,
as leases key it), so two names or addresses of one device are one lock. flock(2) locks die with their process,
so a crashed run never leaves a stale lock. Other accounts and other control hosts are kept out by the leases.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from testbed.contracts.errors import UserError


def lock_dir() -> Path:
    base = os.environ.get("TESTBED_LOCK_DIR") or os.path.join(tempfile.gettempdir(), f"testbed-locks-{os.getuid()}")
    path = Path(base)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def device_locks(identities: dict[str, str], run_id: str):
    """Hold a lock for every device (name -> identity) for the duration of the block."""
    held = []
    try:
        for device, identity in sorted(identities.items()):
            path = lock_dir() / (hashlib.sha256(identity.encode()).hexdigest()[:24] + ".lock")
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_owner(fd)
                os.close(fd)
                raise UserError(
                    f"{device} ({identity}) is in use by another testbed run ({owner}); wait for it to "
                    "finish, or stop it"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(
                fd,
                json.dumps(
                    {"pid": os.getpid(), "run": run_id, "device": device, "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
                ).encode(),
                0,
            )
            held.append(fd)
        yield
    finally:
        for fd in held:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)


def _read_owner(fd: int) -> str:
    try:
        owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {owner.get('pid')}, run {owner.get('run')}, since {owner.get('since')}"
    except (OSError, ValueError):
        return "owner unknown"
