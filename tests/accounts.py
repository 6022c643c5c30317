"""Acting as another account of this machine: a forked child of the test process that gives up root for a plain
uid, runs one function and sends back what it returned or raised. The child keeps the modules the test loaded, so
no interpreter has to be reachable by that account. Needs root (CI runs as root); without it, the tests that need
a second account are skipped, saying so.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

ALICE, BOB, MALLORY = 12001, 12002, 12003  # accounts with no passwd entry: their names are their uids

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as a second account needs root (CI runs as root)")


def as_account(uid: int, fn: Callable, *args, **kwargs):
    """fn(*args, **kwargs) run as `uid`; its result, or the exception it raised, raised again here."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            outcome = ("ok", fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - sent back to the test as it is
            outcome = ("raised", exc)
        try:
            data = pickle.dumps(outcome)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result says what it was
            data = pickle.dumps(("raised", RuntimeError(f"unpicklable outcome: {outcome!r:.200} ({exc})")))
        with os.fdopen(write, "wb") as out:
            out.write(data)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as inp:
        data = inp.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)  # noqa: S301 - our own child's answer
    if kind == "raised":
        raise value
    return value


def shared_folder() -> Path:
    """A folder every account may reach and add to, as /var/tmp (pytest's own tmp_path is root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="testbed-leases-", dir="/tmp"))
    base.chmod(0o1777)  # as /var/tmp is: every account may make its folder here
    return base
