"""One Ray actor per control node: the device hub. It owns the drivers of the devices placed on its node.

A Ray worker process is large and slow to start, so an actor per device does not scale to a lab's hundreds of
devices (docs/tuning.md, "Device hubs and the GIL"). A hub is one process for all the devices of a node, and
inside it each device is still what it was as an actor of its own
(testbed.engine.device_actor.DeviceActor: its driver, its audit records, its milestones):

- each device has its own thread (two for a job's watcher connection), so devices work in parallel and every
  timestamp is still taken in the device's thread, at the I/O;
- one device's calls run one at a time, in the order the engine sent them. Ray does not keep the order of
  calls to an async actor, so the dispatcher numbers each device's calls and the hub starts them in that
  order (`_Lane`);
- a device whose driver raises (at construction too) fails its own calls, as data, and nobody else's. A
  hard crash (a segfault in a driver library, kill -9) takes the hub's process down: Ray restarts the hub,
  every device on it reconnects, and each call that was running is recorded as `info` (outcome unknown). A
  device that might crash its process is given one of its own with `isolated: true` in the inventory.

A switch (a family with `own_process`) always has a hub of its own: switches are few, and a change to a
256-port switch is milliseconds of Python that eight switches must not take turns at.

The engine's calls come over the hub's direct channel (testbed/engine/direct.py, opened with `open_direct`), a
millisecond quicker than a Ray call, or through Ray; both end in `call`.

docs/architecture.md ("Runtime") has the picture.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from testbed.engine.device_actor import DeviceActor, OpResult

log = logging.getLogger(__name__)

# How long a call waits for the calls numbered before it. They are sent together and arrive within
# milliseconds; only the calls of a hub process that died (and was restarted by Ray) never come.
GAP_S = 2.0


@dataclass(frozen=True)
class DeviceSpec:
    """What a hub needs to serve one device (plain data: it crosses to the hub's process)."""

    name: str  # the actor's name: the device, or "gpu01 (watcher)" for a second connection to it
    driver: str
    settings: Any  # the transport's settings (TransportConfig.settings())
    policy: Any = None  # the interlocks every write passes (testbed.families.interlocks.Policy), None: nothing to guard
    kind: str | None = None
    threads: int = 1  # 2 for a watcher: the engine waits for a milestone while the procedure runs

    @property
    def device(self) -> str:
        """The device it connects to (a watcher is a second connection to its host)."""
        return self.name.split(" ")[0]


class _Broken:
    """Stands in for a device whose driver could not be built: its calls fail with the reason, as data."""

    where = DeviceActor.where

    def __init__(self, spec: DeviceSpec, error: str, error_type: str) -> None:
        self.spec, self.error, self.error_type = spec, error, error_type
        self._node = socket.gethostname()

    def run(self, procedure: str, kwargs: dict, token: str | None = None) -> OpResult:
        now = (time.monotonic_ns(), time.time())
        return OpResult(
            self.spec.device, procedure, self._node, "fail", now, now,
            error=self.error, error_type=self.error_type,
        )  # fmt: skip

    def run_program(self, calls: list[tuple[str, dict]], token: str | None = None) -> list[OpResult]:
        return [self.run(calls[0][0], calls[0][1])] if calls else []

    def wait_mark(self, name: str, timeout_s: float, token: str | None = None) -> bool:
        return False

    def close(self) -> None:
        pass


class _Lane:
    """One device's calls: started in the order the dispatcher numbered them, on the device's own threads.

    A call is handed to the device's thread by whichever thread it arrived on, with one put on a queue, and its
    result goes back through the caller's `done` callback, on the device's thread. A call over a direct channel
    (testbed/engine/direct.py) thus goes from the channel's reader thread to the device's thread and back with no
    hop through the hub's event loop; a Ray call (`DeviceHub.call`) hops once each way. The event loop is one
    thread among a hundred busy ones (the devices' and their connections'), and every time it lets go of the GIL
    it waits to get it back, so a call's path avoids it (docs/tuning.md, "Device hubs and the GIL").
    """

    def __init__(self, name: str, actor: Any, threads: int) -> None:
        self.actor = actor
        self.next = 0  # the number of the call to start next: the dispatcher numbers a device's calls from 0
        self._lock = threading.Lock()
        # Calls that came before the calls numbered ahead of them (rare: a device's calls are sent back to back),
        # each with the timer that ends its wait.
        self._parked: dict[int, tuple[Callable, tuple, Callable, threading.Timer]] = {}
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(threads):
            threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True).start()
        self._threads = threads

    def start(self, seq: int, fn: Callable, args: tuple, done: Callable[[Any, BaseException | None], object]) -> None:
        """Start `fn(*args)` as the device's `seq`-th call, once the calls numbered before it have started; then
        `done(result, exception)` on the device's thread.
        """
        with self._lock:
            if seq > self.next:
                timer = threading.Timer(GAP_S, self._gap, (seq,))
                timer.daemon = True
                self._parked[seq] = (fn, args, done, timer)
                timer.start()
                return
            self._hand(seq, fn, args, done)

    def _hand(self, seq: int, fn: Callable, args: tuple, done: Callable) -> None:
        """Under the lock: the call to its thread, then every parked call whose turn that makes."""
        self._work.put((fn, args, done))
        self.next = max(self.next, seq + 1)
        while self._parked and (k := min(self._parked)) <= self.next:
            fn, args, done, timer = self._parked.pop(k)
            timer.cancel()
            self._work.put((fn, args, done))
            self.next = max(self.next, k + 1)

    def _gap(self, seq: int) -> None:
        """A call waited GAP_S for the calls numbered before it: they were sent to this hub's previous process,
        which died (Ray restarted the hub, and numbers go on), and will never come. The lowest-numbered waiting
        call starts, and every one after it in order. Not a way to synchronise: it ends a wait that would
        otherwise never end.
        """
        with self._lock:
            if seq not in self._parked:
                return  # started meanwhile
            first = min(self._parked)
            fn, args, done, timer = self._parked.pop(first)
            timer.cancel()
            self._hand(first, fn, args, done)

    def _serve(self) -> None:
        while (item := self._work.get()) is not None:
            fn, args, done = item
            try:
                result = fn(*args)
            except BaseException as exc:  # the caller's: raised where it waits
                _answer(done, None, exc)
            else:
                _answer(done, result, None)

    def stop(self) -> None:
        """Its threads end once the calls already handed to them are done."""
        for _ in range(self._threads):
            self._work.put(None)


def _settle(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if future.cancelled():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


def _answer(done: Callable, result: Any, exc: BaseException | None) -> None:
    try:
        done(result, exc)
    except Exception:  # a caller that went away (a closed loop or connection): nothing to tell
        log.debug("a device call's answer could not be delivered", exc_info=True)


class DeviceHub:
    """The devices of one node. Run it as an async Ray actor (`ray.remote(DeviceHub)`), or in-process."""

    def __init__(self, devices: list[DeviceSpec]) -> None:
        self._lanes: dict[str, _Lane] = {}
        # Drivers are built side by side: a device's constructor may connect (pyvisa opens its resource).
        with concurrent.futures.ThreadPoolExecutor(max(1, min(32, len(devices)))) as pool:
            built = list(pool.map(_build, devices))
        for spec, actor in zip(devices, built, strict=True):
            self._lanes[spec.name] = _Lane(spec.name, actor, spec.threads)
        self._listeners: list = []  # direct channels opened to this hub (testbed/engine/direct.py)

    async def open_direct(self, token: bytes, engine_ip: str | None = None) -> tuple[str, int]:
        """Listen for the engine's direct channel (testbed/engine/direct.py): on 127.0.0.1 when the engine runs on
        this node (`engine_ip` is this node's IP), else on this node's IP. Returns the address to connect to.
        """
        from testbed.engine.direct import DirectListener

        here = _node_ip()
        host = "127.0.0.1" if engine_ip in (None, here, "127.0.0.1") else here
        listener = DirectListener(self.call_threadsafe, token, host)
        self._listeners.append(listener)
        return listener.address

    async def call(self, device: str, seq: int, method: str, *args: Any) -> Any:
        """`method(*args)` on the device's DeviceActor (run, run_program, wait_mark, where, close), as the
        device's `seq`-th call from the dispatcher (a Ray call): `call_threadsafe`, its answer awaited.
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.call_threadsafe(
            device, seq, method, args, lambda result, exc: loop.call_soon_threadsafe(_settle, future, result, exc)
        )
        return await future

    def call_threadsafe(
        self, device: str, seq: int, method: str, args: tuple, done: Callable[[Any, BaseException | None], object]
    ) -> None:
        """`method(*args)` as the device's `seq`-th call, from any thread (a direct channel's reader, or `call`):
        started in the dispatcher's numbered order whichever way each came; `done(result, exception)` runs on the
        device's thread.
        """
        try:
            lane = self._lanes[device]
            fn = getattr(lane.actor, method)
        except (KeyError, AttributeError) as exc:  # the engine's mistake: the caller hears of it
            done(None, exc)
            return
        if method == "close":

            def done_then_stop(result: Any, exc: BaseException | None) -> None:
                try:
                    done(result, exc)
                finally:
                    lane.stop()

            lane.start(seq, fn, args, done_then_stop)
        else:
            lane.start(seq, fn, args, done)


def _node_ip() -> str:
    """This node's IP as Ray knows it (127.0.0.1 outside Ray)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # outside a Ray worker
        pass
    return "127.0.0.1"


def _build(spec: DeviceSpec):
    try:
        return DeviceActor(spec.device, spec.driver, spec.settings, spec.policy, spec.kind)
    except Exception as exc:  # a driver that cannot start fails its own device's calls, nobody else's
        detail = f"{spec.name}: its driver {spec.driver!r} could not start: {exc}"
        if not isinstance(exc, (OSError, ValueError)):
            detail += "\n" + traceback.format_exc(limit=3)
        return _Broken(spec, detail, type(exc).__name__)
