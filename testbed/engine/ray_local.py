"""The private local Ray instance a session starts when it joins no cluster: started by a process of its own the
moment the session begins, and without what such an instance has no use for (docs/architecture.md, "Start-up";
the measurements behind each choice: docs/tuning.md, "A local Ray's start").

**A process of its own** (`LocalHead`, which runs `python -m testbed.engine.ray_local`). It imports Ray and
starts the head (GCS, raylet and the raylet's agents) on the other core while the command imports its own modules
and loads its files; the command then joins it as a driver, as it would join a lab's cluster. It prints one JSON
line, `{"address": ..., "session_dir": ...}` (or `{"error": ...}`), then holds the instance until its standard
input closes: the session's end, or its process dying, whatever killed it. Then it stops the instance as Ray's own
shutdown does, and ends every process still running below it. It ignores Ctrl-C, which reaches the whole
foreground process group, as Ray's own processes do: the command handles it and ends the run cleanly on an
instance that is still up, then lets the head go. The head's processes share its fate (Linux delivers SIGKILL to
them when it dies): `testbed heal` ends what a SIGKILLed one leaves.

**Not started**, each a Python process that imports Ray on cores that are also starting the raylet's agents and
the run itself:

1. the API server (`dashboard.py`): with the dashboard off Ray still starts it for its usage-stats module, and
   `ray.init` waits until it has come up and written its address, *before* it starts the raylet;
2. the autoscaler monitor: a private instance on one machine has nothing to scale (`no_monitor`);
3. the log monitor: it streams workers' logs to the driver, which testbed turns off (`log_to_driver=False`);
   every log still goes to the session folder (`include_log_monitor`).

**Not started ahead**: the workers Ray starts for the first driver to join (one per CPU). The raylet answers
that driver's registration only once they are up, and the session is that first driver; the hub it then places
starts its own worker at once (a run's hubs are the only workers it needs).

**Cut**, two of Ray's fixed waits:

1. The raylet connects to its own object store right after starting the store's thread; most times the socket is
   not there yet, and it retries after `raylet_client_connect_timeout_milliseconds` (a second by default). A
   short interval with as many more attempts keeps Ray's budget (`LOCAL_SYSTEM_CONFIG`, the instance's system
   config: a cluster is started by the lab, with the lab's settings).
2. The head then asks the GCS for its node (`ray._private.services.get_node`); the C++ accessor behind it sleeps
   a fixed second whenever the raylet has not registered yet, and the raylet registers only once its Python
   agents are up. `node_registration_polled` waits for the registration itself, reading the GCS's node table
   often, and then lets Ray's call run, which answers at once.

None of it changes what Ray does once it is up. The head is made with Ray's own `Node` and `RayParams`, as `ray
start` and `ray.init` make theirs, and two internals are patched while it starts (a method and a function), each
guarded: where Ray no longer has one, that part of the start is only as slow as Ray's own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

from testbed.engine.processes import descendants, kill_survivors

log = logging.getLogger(__name__)

LOCAL_CPUS = 2
LOCAL_OBJECT_STORE_BYTES = 100 * 1024 * 1024
LOCAL_SYSTEM_CONFIG = {
    # Ray's defaults are 1000 ms x 10 attempts; the same 10 s, polled fifty times as often.
    "raylet_client_connect_timeout_milliseconds": 20,
    "raylet_client_num_connect_attempts": 500,
    # Not a worker per CPU started when the first driver joins: the raylet answers that driver only once they are
    # up, and a run needs a worker per hub, which Ray starts for it when the hub is placed (see the module's text).
    "prestart_worker_first_driver": False,
}
POLL_S = 0.02
REGISTRATION_TIMEOUT_S = 30.0  # Ray's own raylet_start_wait_time_s
UP_TIMEOUT_S = 120.0  # the head's whole start: Ray's own budgets are within it
STOP_TIMEOUT_S = 15.0  # Ray gives each process a second on SIGTERM, then kills it


class PrivateStartUnavailable(Exception):
    """The installed Ray lacks (or changed) an internal this start uses: start it with a plain ray.init instead."""


class LocalHead:
    """The private local instance's head process, started at once (a Popen: a few milliseconds). `wait_up`
    gives its address; `stop` ends it. Raises nothing at start: a head that cannot start says so in wait_up.
    """

    def __init__(self) -> None:
        self._stderr = tempfile.TemporaryFile()  # read only if the head fails: what Ray printed
        env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")  # see testbed.engine.ray_session
        self.process = subprocess.Popen(
            [sys.executable, "-m", "testbed.engine.ray_local"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
        )
        self.address: str | None = None
        self.session_dir: str | None = None
        self._reading = threading.Lock()  # one reader of the head's line, whichever thread asks first

    def wait_up(self, timeout_s: float = UP_TIMEOUT_S) -> str:
        """The instance's GCS address, once its node has registered; UserError if it could not start."""
        with self._reading:
            return self._wait_up(timeout_s)

    def _wait_up(self, timeout_s: float) -> str:
        if self.address is not None:
            return self.address
        line = self._read_line(timeout_s)
        try:
            answer = json.loads(line) if line else {}
        except ValueError:
            answer = {"error": f"it printed {line[:200]!r}"}
        if "fallback" in answer:  # Ray's internals changed: nothing was started; the session starts Ray its own way
            self.stop(wait=True)
            raise PrivateStartUnavailable(str(answer["fallback"]))
        if "address" not in answer:
            printed = self._printed()
            self.stop(wait=True)
            from testbed.contracts.errors import UserError

            why = answer.get("error") or f"its process exited with status {self.process.returncode}"
            raise UserError(
                f"cannot start a local Ray instance: {why}{printed}\n  try: `ray start --head` by hand to "
                "see Ray's own error; free disk space in /tmp and /dev/shm; or join a running cluster with "
                "--ray-address (RAY_ADDRESS)"
            )
        self.address, self.session_dir = answer["address"], answer.get("session_dir")
        return self.address

    def stop(self, *, wait: bool = True) -> None:
        """Tell the head to stop the instance (its standard input closes); with wait, until it has (killed if it
        takes longer than STOP_TIMEOUT_S).
        """
        assert self.process.stdin is not None and self.process.stdout is not None  # both are pipes (__init__)
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        if not wait:
            return
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()  # its instance's processes share its fate
            self.process.wait()
        self.process.stdout.close()
        self._stderr.close()

    def _read_line(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        out = self.process.stdout
        assert out is not None  # a pipe (__init__)
        while time.monotonic() < deadline:
            ready, _, _ = select.select([out], [], [], min(1.0, max(0.0, deadline - time.monotonic())))
            if ready:
                return out.readline().decode(errors="replace").strip()  # the head writes the line at once
            if self.process.poll() is not None:
                return ""
        return json.dumps({"error": f"not up after {timeout_s:g} s"})

    def _printed(self) -> str:
        with contextlib.suppress(OSError, ValueError):
            self._stderr.seek(0)
            text = self._stderr.read().decode(errors="replace").strip()
            if text:
                return "\n  Ray printed: " + "\n  ".join(text.splitlines()[-12:])
        return ""


def main() -> int:
    """The head process: start the instance, print where it is, hold it until standard input closes."""
    # A Ctrl-C in the terminal reaches the whole foreground process group, this process too: it is the session's
    # to handle (it ends its run cleanly, on an instance still up). Ray's own processes block it likewise. Not a
    # process session of its own: Linux's autogroup scheduling would then share the CPU between the instance and
    # the session's group (the twin among it) instead of between their threads, starving the twin
    # (docs/tuning.md, "A local Ray's start").
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (LocalHead sets this process's single-machine mode)
    try:
        import ray
    except Exception as exc:  # said on the line the session reads, which turns it into a UserError
        _answer({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    try:
        from ray._private.node import Node
        from ray._private.parameter import RayParams

        params = RayParams(
            node_ip_address="127.0.0.1",
            num_cpus=LOCAL_CPUS,
            object_store_memory=LOCAL_OBJECT_STORE_BYTES,
            include_dashboard=False,
            no_monitor=True,
            include_log_monitor=False,  # type: ignore[arg-type]  # a flag, as Ray's docstring says; its hint is wrong
            _system_config=known_system_config(ray),  # a copy: Ray adds its own keys to it
        )
    except (ImportError, AttributeError, TypeError) as exc:  # Ray's internals moved: its own start, slower
        _answer({"fallback": f"Ray {getattr(ray, '__version__', '?')} has no {_what(exc)}"})
        return 0
    try:
        with api_server_not_started(ray), node_registration_polled(ray):
            # spawn_reaper: on Linux it means the kernel's fate sharing (PR_SET_PDEATHSIG), not a reaper process.
            node = Node(params, head=True, shutdown_at_exit=False, spawn_reaper=True, ray_init_cluster=True)
    except TypeError as exc:  # Node's signature changed: nothing was started
        _answer({"fallback": f"Ray {getattr(ray, '__version__', '?')} has no {_what(exc)}"})
        return 0
    except Exception as exc:  # said on the line the session reads, which turns it into a UserError
        _answer({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    _answer({"address": node.address, "session_dir": node.get_session_dir_path()})
    with contextlib.suppress(OSError):
        while sys.stdin.buffer.read(4096):
            pass  # nothing is sent on it: it closes when the session ends or dies
    # As ray.shutdown() stops the instance ray.init() started; then what it leaves. The raylet's agents are its
    # children, not the node's: each stops on its own once it sees the raylet gone, but one still starting waits
    # a minute for the GCS before it gives up.
    instance = descendants(os.getpid())
    node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)
    kill_survivors(instance, timeout_s=STOP_TIMEOUT_S / 3)
    return 0


# The Ray versions this start is tested with (CI runs the lowest and the highest); pyproject's pin says the same.
TESTED_RAY = ((2, 40), (2, 60))


def known_system_config(ray) -> dict:
    """LOCAL_SYSTEM_CONFIG, less the keys the installed Ray does not know: Ray's own processes refuse to start
    on an unknown key. Within the tested versions every key is known; beyond them, a key is kept only if Ray's
    native library names it (its configuration is compiled in).
    """
    if _version(getattr(ray, "__version__", "")) <= TESTED_RAY[1]:
        return dict(LOCAL_SYSTEM_CONFIG)
    return {key: value for key, value in LOCAL_SYSTEM_CONFIG.items() if key in names_in_ray(ray)}


def names_in_ray(ray) -> set[str]:
    """Which of LOCAL_SYSTEM_CONFIG's keys Ray's native library holds as text (read once; it is large)."""
    raylet = getattr(getattr(ray, "_raylet", None), "__file__", None)
    if raylet is None:
        return set()
    try:
        with open(raylet, "rb") as f:
            data = f.read()
    except OSError:
        return set()
    return {key for key in LOCAL_SYSTEM_CONFIG if key.encode() in data}


def _version(text: str) -> tuple[int, int]:
    parts = [int(p) if p.isdigit() else 0 for p in text.split(".")[:2]]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def _what(exc: BaseException) -> str:
    """What of Ray's internals a start found missing or changed, from the error it raised."""
    name = getattr(exc, "name", None)
    if isinstance(exc, ImportError) and name:
        return name
    return str(exc).split("\n")[0][:160]


def _answer(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


@contextlib.contextmanager
def _replaced(owner, name: str, make):
    """While it is open, `owner.name` is `make(original)`, put back on leaving whatever happens. Where Ray has no
    such attribute (its internals moved), nothing is replaced: that part of the start is as Ray's own.
    """
    original = getattr(owner, name, None)
    if original is None:
        yield
        return
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def api_server_not_started(ray):
    """While it is open, a head started in this process goes without the API server (Ray's `Node.start_api_
    server`). RayParams has switches for the monitors, not for it.
    """
    node_cls = getattr(getattr(getattr(ray, "_private", None), "node", None), "Node", None)
    return _replaced(node_cls, "start_api_server", lambda original: lambda self, *args, **kwargs: None)


def node_registration_polled(ray):
    """While it is open, Ray's start waits for its node's registration by polling the GCS every 20 ms instead
    of sleeping a second at a time. Only for a local start: with an address, Ray starts no node.
    """
    services = getattr(getattr(ray, "_private", None), "services", None)

    def polled(original):
        def get_node(gcs_address, node_id):
            try:
                _wait_until_registered(ray, services, gcs_address, node_id)
            except Exception as exc:  # Ray's internals moved: its own (slower) wait still works
                log.debug("polling the GCS for node %s failed (%s); Ray waits its own way", node_id, exc)
            return original(gcs_address, node_id)

        return get_node

    return _replaced(services, "get_node", polled)


def _wait_until_registered(ray, services, gcs_address: str, node_id: str) -> None:
    state = ray._private.state.GlobalState()
    state._initialize_global_state(services._get_gcs_client_options(gcs_address))
    deadline = time.monotonic() + REGISTRATION_TIMEOUT_S
    while time.monotonic() < deadline:
        if any(node.get("NodeID") == node_id and node.get("Alive") for node in state.node_table()):
            return
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main())
