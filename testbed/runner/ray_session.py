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
import os
import socket
import sys
from pathlib import Path

LOCAL_CPUS = 2
LOCAL_OBJECT_STORE_BYTES = 100 * 1024 * 1024


@contextlib.contextmanager
def ray_session(address: str | None = None):
    """Yields the ray module, initialised. Reuses an instance already initialised in this process."""
    if address is None:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        yield ray
        return
    common = dict(include_dashboard=False, log_to_driver=False, configure_logging=False, namespace="testbed")
    try:
        if address is None:
            # address="local": always a new private instance; without it Ray joins any cluster it finds
            # running on this machine (another run's, a test's), which is not ours to use.
            ray.init(
                address="local",
                num_cpus=LOCAL_CPUS,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                _node_ip_address="127.0.0.1",
                **common,
            )
        else:
            ray.init(address=address, **common)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        from testbed.errors import UserError

        where = f"the Ray cluster at {address!r}" if address else "a local Ray instance"
        raise UserError(
            f"cannot start or join {where}: {exc}\n  try: check the address (ray status on the "
            "head node prints it) or omit --ray-address to run locally"
        ) from None
    try:
        yield ray
    finally:
        # Ray prints to stderr on shutdown in some versions; keep the user's terminal clean.
        sys.stderr.flush()
        ray.shutdown()


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
