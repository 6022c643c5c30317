"""The server's queue on disk, so a server killed outright (SIGKILL, a crash, the host's power) loses no queued run:
the next server for the lab reads it back and makes those runs in the same order, as the same users' runs.

The file is written on every change of the queue (a run submitted, cancelled, moved, started, ended), whole or not
at all, as the run folders' files are (testbed.events.safe_files: an exclusive temporary of a random name, synced,
renamed over the file), owner-only (0600, in a 0700 folder of the server's account): it holds every queued
playbook's text and who submitted it. It is read as untrusted input all the same (no link followed, a size and
depth limit); a file that cannot be read is set aside, named, and the server starts with an empty queue.

It lives in the results folder, `<results>/.serve/<socket name>.queue.json` (the catalog skips dot folders), so a
service's restart finds it where a reboot leaves it (/run is emptied). A lock on `<socket name>.lock` keeps two
servers from keeping one queue (two sockets for one lab and results folder).
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from testbed.contracts.errors import UserError
from testbed.events.safe_files import UnsafeFile, atomic_writer, open_fd, read_json_object
from testbed.serve.identity import user_name

FOLDER = ".serve"
VERSION = 1
MAX_BYTES = 64 << 20  # every queued playbook's text; a queue of many large playbooks is a few MB


class QueueFile:
    """The queue file of one server (`name`: its socket's name), locked for this server's life."""

    def __init__(self, results: Path, name: str) -> None:
        folder = results / FOLDER
        _private_folder(folder)
        self.path = folder / f"{name}.queue.json"
        self._lock_path = folder / f"{name}.lock"
        self._lock_fd = open_fd(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise UserError(
                f"another testbed serve keeps its queue in {self.path}: stop it first, or give another --results"
            ) from None

    def load(self) -> tuple[dict | None, list[dict], str | None]:
        """(the run that was running when the last server stopped, the queued runs in order, a warning) as saved.
        A missing file is an empty queue; an unreadable one is renamed aside and the warning says where.
        """
        try:
            saved = read_json_object(self.path, MAX_BYTES)
            running, queued = saved.get("running"), saved.get("queued")
            if saved.get("version") != VERSION or not isinstance(queued, list):
                raise UnsafeFile(f"{self.path}: not a queue this server wrote (version {saved.get('version')!r})")
            records = [r for r in [running, *queued] if r is not None]
            if not all(isinstance(r, dict) and _valid(r) for r in records):
                raise UnsafeFile(f"{self.path}: a run in it is not one this server wrote")
        except FileNotFoundError:
            return None, [], None
        except (UnsafeFile, OSError) as exc:
            aside = self.path.with_name(f"{self.path.name}.unread-{time.strftime('%Y%m%dT%H%M%S')}")
            try:
                os.rename(self.path, aside)  # a link is renamed itself, never followed
            except OSError:
                return None, [], f"the saved queue was not read ({exc}) and could not be set aside"
            return None, [], f"the saved queue was not read ({exc}); set aside as {aside}"
        return running, queued, None

    def save(self, running: dict | None, queued: list[dict]) -> None:
        with atomic_writer(self.path, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)  # before a byte of it is written: the playbooks are their users' own
            json.dump({"version": VERSION, "running": running, "queued": queued}, f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename: a power cut leaves the old queue or the new

    def close(self) -> None:
        os.close(self._lock_fd)  # the lock goes with it (and with the process, however it ends)


_FIELDS: dict[str, Any] = {
    "id": str,
    "uid": int,
    "user": str,
    "playbook_file": str,
    "playbook_text": str,
    "options": dict,
    "submitted": (int, float),
}


def _valid(record: dict) -> bool:
    return all(isinstance(record.get(key), kind) for key, kind in _FIELDS.items())


def _private_folder(folder: Path) -> None:
    """The queue's folder: made 0700; one there must be a folder (not a link) of this account, 0700."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"{folder}: not a folder (the server's queue is kept there); remove it")
    if st.st_uid != os.geteuid():
        raise UserError(f"{folder}: owned by {user_name(st.st_uid)}, not by this account; remove it or give --results")
    if st.st_mode & 0o077:
        os.chmod(folder, 0o700)  # ours: made private again (a copy, a umask)
