"""Starting or joining Ray.

Locally we start a private instance: bounded CPUs and memory, no dashboard, every server bound to
127.0.0.1, its head started by a process of its own the moment the session begins (testbed/engine/ray_local.py),
which this process then joins. Ray resolves "127.0.0.1" to the machine's outward address unless it runs in
single-machine mode, which RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 selects; Ray reads it at import, so ray is imported
only here, after the choice is made. With an address we join that cluster as it is.

A runner killed with SIGKILL leaves its head process, which stops the instance once its standing input closes.
A head killed with SIGKILL takes its instance with it (Ray's processes share its fate), but for two agent processes
the raylet started (ray::DashboardAgent, ray::RuntimeEnvAgent): they notice that the raylet is gone, then wait on
the dead GCS for a minute or more before they exit. They do not stop the next run (each instance has its own ports
and session folder), and `testbed heal` ends them: `leftovers` finds the processes of a dead runner's instance by
its session folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import stat
import sys
import threading
from pathlib import Path
from typing import Any

from testbed.engine.processes import start_ticks, stat_fields
from testbed.engine.ray_local import LOCAL_CPUS, LOCAL_OBJECT_STORE_BYTES, PrivateStartUnavailable


@contextlib.contextmanager
def ray_session(address: str | None = None):
    """Yields the ray module, initialised. Reuses an instance already initialised in this process."""
    start = RayStart(address, background=False)
    try:
        yield start.get()
    finally:
        start.shutdown()


class RayStart:
    """Ray, started or joined while the caller builds its plan and starts the twin: a local instance takes seconds
    to come up, most of it waiting on its own processes (docs/architecture.md, "Start-up"). Without an address
    the instance's head starts in a process of its own at once (testbed.engine.ray_local.LocalHead), and this
    process joins it from a thread of its own (background=True) or when `get` is called. `get` waits for it;
    `shutdown` stops what this object started, and nothing if Ray was already initialised in this process (a
    test's, a benchmark's); `abandon` lets go of a start whose session never began (a mistake in its files).

    The thread lives until the shutdown: Ray starts processes with PR_SET_PDEATHSIG, which Linux delivers when
    the *thread* that started them ends, so a thread that returned could take them down.
    """

    def __init__(self, address: str | None = None, background: bool = True) -> None:
        self.address = address
        self.owned = False
        self._ray = None
        self._error: BaseException | None = None
        self._abandoned = False
        self._ready = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._head = None  # testbed.engine.ray_local.LocalHead, when this object starts the instance
        if address is None and not _initialised_here():
            from testbed.engine.ray_local import LocalHead

            self._head = LocalHead()
        if background:
            self._thread = threading.Thread(target=self._serve, name="ray-init", daemon=True)
            self._thread.start()
        else:
            self._start()

    @property
    def session_dir(self) -> str | None:
        """The session folder of the local instance this object started (None when it joined one)."""
        return self._head.session_dir if self._head is not None else None

    def _start(self) -> None:
        try:
            self._ray, self.owned = _init(self.address, self._head, lambda: self._abandoned)
        except BaseException as exc:  # handed to the caller of get(), on its own thread
            self._error = exc
        finally:
            self._ready.set()

    def _serve(self) -> None:
        self._start()
        self._done.wait()

    def get(self):
        """The ray module, initialised (waits for the start); UserError if Ray could not start or join."""
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self._ray

    def shutdown(self) -> None:
        self._ready.wait()
        try:
            if self._ray is not None and self.owned:
                self.owned = False
                # Ray prints to stderr on shutdown in some versions; keep the user's terminal clean.
                sys.stderr.flush()
                self._ray.shutdown()
        finally:
            if self._head is not None:
                self._head.stop()
            self._done.set()

    def abandon(self) -> None:
        """For a start whose session never began (its files had a mistake, a confirmation was refused): the
        caller is not kept waiting. A local instance's head stops it once it is up; a cluster joined is left.
        """
        self._abandoned = True
        if self._head is not None:
            self._head.stop(wait=False)
            self._done.set()
        else:
            self.shutdown()


def _initialised_here() -> bool:
    """Whether this process has Ray up already. Not imported, or still being imported by another thread (an
    earlier start let go of, still on its way): certainly not, and nothing is imported to find out.
    """
    is_initialized = getattr(sys.modules.get("ray"), "is_initialized", None)
    return callable(is_initialized) and is_initialized()


def _init(address: str | None, head, abandoned):
    """(the ray module, whether this call started or joined it). `head`: the local instance's head process to
    join (None: join `address`); `abandoned`: whether the session was given up meanwhile.
    """
    if address is None or _loopback(address):
        # A cluster on this machine's loopback (`ray start --head --node-ip-address=127.0.0.1`, or our own head):
        # without single-machine mode Ray rewrites 127.0.0.1 to the machine's outward address, where nothing
        # listens, and retries for minutes.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return ray, False  # someone else's: not ours to shut down
    common: dict[str, Any] = dict(log_to_driver=False, configure_logging=False, namespace="testbed")
    if head is None and address is None:  # Ray was initialised here when this start began, and is no longer
        from testbed.contracts.errors import UserError

        raise UserError("the Ray instance this process had was shut down while a run was starting; start it again")
    try:
        target = head.wait_up() if head is not None else address  # UserError if the head could not start
    except PrivateStartUnavailable as exc:
        _say_once(
            f"testbed: {exc}, which its quick start of a local Ray uses: Ray is started by a plain ray.init "
            'instead (slower; docs/architecture.md, "Start-up")'
        )
        head.session_dir = None  # Ray's own folder: not ours to name to heal
        target = None
    if abandoned():
        return None, False
    try:
        # Off the main thread Ray logs that it set no SIGTERM handler: the run sets its own (run.py).
        with _quiet_logger("ray._private.worker"):
            if target is None:  # a plain local start, as `ray.init()` makes one
                ray.init(
                    num_cpus=LOCAL_CPUS, object_store_memory=LOCAL_OBJECT_STORE_BYTES, include_dashboard=False, **common
                )
            else:
                ray.init(address=target, **common)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        from testbed.contracts.errors import UserError

        where = f"the Ray cluster at {address!r}" if address else f"the local Ray instance at {target}"
        raise UserError(
            f"cannot start or join {where}: {exc}\n  try: check the address (ray status on the "
            "head node prints it); a cluster with token authentication wants RAY_AUTH_MODE=token in the "
            "environment; or omit --ray-address (and unset RAY_ADDRESS, which testbed reads as Ray does) to run "
            "locally"
        ) from None
    if abandoned():  # given up while it joined: let go at once
        ray.shutdown()
        return None, False
    return ray, True


_said: set[str] = set()


def _say_once(text: str) -> None:
    """A note for the user, once per process (a warm session starts Ray once, a test suite many times)."""
    if text not in _said:
        _said.add(text)
        print(text, file=sys.stderr, flush=True)


def _loopback(address: str) -> bool:
    host = address.split("://")[-1].rpartition(":")[0] or address
    return host in ("localhost", "::1", "[::1]") or host.startswith("127.")


@contextlib.contextmanager
def _quiet_logger(name: str):
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def runner_identity() -> dict:
    """Enough to tell later whether this very process is still alive (a pid can be reused)."""
    return {"pid": os.getpid(), "start_ticks": start_ticks(os.getpid()), "hostname": socket.gethostname()}


def runner_alive(runner: dict) -> bool:
    """Whether the process `runner_identity()` described still runs (on this machine)."""
    if runner.get("hostname") not in (None, socket.gethostname()):
        return False  # another machine: heal cannot look (and says so)
    fields = stat_fields(int(runner["pid"]))
    # A zombie (Z) or dead (X) runner has ended, reaped or not (PID 1 may reap it seconds later, or never).
    return fields is not None and fields[0] not in ("Z", "X") and int(fields[19]) == runner.get("start_ticks")


_SESSION_NAME = re.compile(r"^session_\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}_\d+_\d+$")


def session_folder_problem(session_dir: str) -> str | None:
    """Why `session_dir` is not a Ray session folder of this account (None when it is one). `testbed heal` ends the
    processes that hold files in it, so a folder named in a run.json is believed only if it is one.
    """
    path = Path(session_dir)
    if not path.is_absolute():
        return "not an absolute path"
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "not a folder"
    if st.st_uid != os.geteuid():
        return "another account's folder"
    if not _SESSION_NAME.match(path.name):
        return "not named as Ray names a session's folder (session_<date>_<time>_<n>_<pid>)"
    if not (path / "logs").is_dir() or not (path / "sockets").is_dir():
        return "no Ray session in it (no logs/ and sockets/)"
    return None


def leftovers(session_dir: str) -> list[tuple[int, str]]:
    """Processes that still hold a file open in a Ray session folder (pid, name): what is left of the
    instance of a runner that died. Only processes of this user can be seen, and only those are ours.
    """
    root = os.path.realpath(session_dir)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            held = any(os.readlink(f"/proc/{entry}/fd/{fd}").startswith(root + os.sep) for fd in fds)
            name = Path(f"/proc/{entry}/comm").read_text().strip()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # gone meanwhile, or not ours to look at
        if held:
            # the program's own name first: a long install path would otherwise fill the 80 characters shown
            shown = " ".join([os.path.basename(argv[0]), *argv[1:]]).strip()
            found.append((int(entry), shown[:80] or name))
    return found
