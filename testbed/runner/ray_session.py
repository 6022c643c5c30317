"""Starting or joining Ray.

Locally we start a private instance: bounded CPUs and memory, no dashboard, every server bound to
127.0.0.1. Ray resolves "127.0.0.1" to the machine's outward address unless it runs in single-machine
mode, which RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 selects; Ray reads it at import, so ray is imported
only here, after the choice is made. With an address we join that cluster as it is.

A runner killed with SIGKILL takes its Ray instance with it (Ray's head processes share its fate), but for
two agent processes the raylet started (ray::DashboardAgent, ray::RuntimeEnvAgent): they notice that the
raylet is gone, then wait on the dead GCS for a minute or more before they exit. They do not stop the next
run (each instance has its own ports and session folder), and `testbed heal` ends them: `leftovers` finds
the processes of a dead runner's instance by its session folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
from pathlib import Path

LOCAL_CPUS = 2
LOCAL_OBJECT_STORE_BYTES = 100 * 1024 * 1024


@contextlib.contextmanager
def ray_session(address: str | None = None):
    """Yields the ray module, initialised. Reuses an instance already initialised in this process."""
    start = RayStart(address, background=False)
    try:
        yield start.get()
    finally:
        start.shutdown()


class RayStart:
    """Ray, started or joined on a thread of its own (background=True) so that the caller builds its plan and
    starts the twin meanwhile: a local instance takes seconds to come up, most of it waiting on its own
    processes (docs/architecture.md, "Start-up"). `get` waits for it; `shutdown` stops what this object
    started, and nothing if Ray was already initialised in this process (a test's, a benchmark's).

    The thread lives until the shutdown: Ray starts its head processes with PR_SET_PDEATHSIG, which Linux
    delivers when the *thread* that started them ends, so a thread that returned would take Ray down."""

    def __init__(self, address: str | None = None, background: bool = True) -> None:
        self.address = address
        self.owned = False
        self._ray = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._serve, name="ray-init", daemon=True)
            self._thread.start()
        else:
            self._start()

    def _start(self) -> None:
        try:
            self._ray, self.owned = _init(self.address)
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
                _kill_monitor(self._ray)
                self._ray.shutdown()
        finally:
            self._done.set()


def _init(address: str | None):
    """(the ray module, whether this call started or joined it)."""
    if address is None or _loopback(address):
        # A cluster on this machine's loopback (`ray start --head --node-ip-address=127.0.0.1`): without
        # single-machine mode Ray rewrites 127.0.0.1 to the machine's outward address, where nothing listens,
        # and retries for minutes.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    from testbed.runner.ray_waits import LOCAL_SYSTEM_CONFIG, node_registration_polled

    if ray.is_initialized():
        return ray, False  # someone else's: not ours to shut down
    common = dict(include_dashboard=False, log_to_driver=False, configure_logging=False, namespace="testbed")
    try:
        # Off the main thread Ray logs that it set no SIGTERM handler: the run sets its own (run.py).
        with _quiet_logger("ray._private.worker"):
            if address is None:
                # address="local": always a new private instance; without it Ray joins any cluster it finds
                # running on this machine (another run's, a test's), which is not ours to use. Two of Ray's
                # fixed waits cut (testbed/runner/ray_waits.py): ~0.5 s of a ~2.2 s start on 2 cores.
                with node_registration_polled(ray):
                    ray.init(
                        address="local",
                        num_cpus=LOCAL_CPUS,
                        object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                        _node_ip_address="127.0.0.1",
                        _system_config=dict(LOCAL_SYSTEM_CONFIG),  # a copy: Ray adds its own keys to it
                        **common,
                    )
            else:
                ray.init(address=address, **common)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        from testbed.errors import UserError

        where = f"the Ray cluster at {address!r}" if address else "a local Ray instance"
        raise UserError(
            f"cannot start or join {where}: {exc}\n  try: check the address (ray status on the "
            "head node prints it); a cluster with token authentication wants RAY_AUTH_MODE=token in the "
            "environment; or omit --ray-address (and unset RAY_ADDRESS, which testbed reads as Ray does) to run "
            "locally"
        ) from None
    return ray, True


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


def _kill_monitor(ray) -> None:
    """Ray's shutdown gives each of its processes a second to exit on SIGTERM; its autoscaler monitor always
    takes the whole second (measured: 1.0 s of a 1.4 s shutdown). A local instance has nothing to scale, so
    it is killed outright first. A private API: without it the shutdown is only slower."""
    with contextlib.suppress(Exception):
        node = ray._private.worker._global_node
        if node is not None and node.is_head():
            node.kill_monitor(check_alive=False)


def local_session_dir(ray) -> str | None:
    """The session folder of the local instance this process started (None if Ray does not say)."""
    try:
        return ray._private.worker._global_node.get_session_dir_path()
    except Exception:  # a private API: its absence only costs heal its clean-up of leftovers
        return None


def runner_identity() -> dict:
    """Enough to tell later whether this very process is still alive (a pid can be reused)."""
    return {"pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid()), "hostname": socket.gethostname()}


def process_start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot, /proc/PID/stat field 22); None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def runner_alive(runner: dict) -> bool:
    """Whether the process `runner_identity()` described still runs (on this machine)."""
    if runner.get("hostname") not in (None, socket.gethostname()):
        return False  # another machine: heal cannot look (and says so)
    ticks = process_start_ticks(int(runner["pid"]))
    return ticks is not None and ticks == runner.get("start_ticks")


def leftovers(session_dir: str) -> list[tuple[int, str]]:
    """Processes that still hold a file open in a Ray session folder (pid, name): what is left of the
    instance of a runner that died. Only processes of this user can be seen, and only those are ours."""
    root = os.path.realpath(session_dir)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            held = any(os.readlink(f"/proc/{entry}/fd/{fd}").startswith(root + os.sep) for fd in fds)
            name = Path(f"/proc/{entry}/comm").read_text().strip()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile, or not ours to look at
        if held:
            found.append((int(entry), cmdline.strip()[:80] or name))
    return found
