"""How the engine reaches the device actors: a small interface with two implementations.

- RayDispatcher: the devices are served by hub actors, one Ray actor per node (local, or on the lab cluster's
  nodes) with a thread per device (testbed/engine/hub.py); what `testbed run` uses. Once the hubs are up, its
  calls go over each hub's direct channel (testbed/engine/direct.py), a millisecond quicker than a Ray call;
  through Ray while a channel is down.
- LocalDispatcher: each actor is a DeviceActor object in this process, its calls run one at a time on a
  thread of its own, as a Ray actor runs them. The engine's logic (coordinator, jobs, failover) runs unchanged
  on it with the real drivers against real endpoints, in a unit test or a notebook, without Ray.

An actor is named by its device (and "gpu01 (watcher)" for the job's second connection to a host). A call
returns a Pending; `result()` gives its value or raises ActorLost (the actor's process died: Ray restarts it
unless its restarts are used up) or CallTimeout.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import secrets
import threading
import time
from collections.abc import Iterable
from typing import Any, Protocol, cast

from testbed.engine.direct import TOKEN_BYTES, ChannelClosed, DirectChannel

log = logging.getLogger(__name__)

REOPEN_S = 120.0  # how long a channel to a restarted hub is tried for (Ray restarts it within seconds)


class ActorLost(Exception):
    """The actor's process died during the call: the call's outcome is unknown."""

    def __init__(self, actor: str, detail: str, *, for_good: bool = False) -> None:
        self.actor = actor
        self.for_good = for_good  # Ray will not restart it (its restarts are used up)
        super().__init__(detail)


class CallTimeout(Exception):
    pass


class Pending(Protocol):
    def result(self, timeout: float | None = None) -> Any: ...


class Dispatcher(Protocol):
    def call(self, actor: str, method: str, *args: Any) -> Pending:
        """Start `method(*args)` on the actor; calls to one actor run one at a time, in order (a watcher runs
        two at a time, so the engine can wait for it to be watching).
        """

    def wait(self, pending: list[Pending], *, timeout: float | None) -> tuple[list[Pending], list[Pending]]:
        """(done, not done) once at least one of `pending` is done, or after `timeout`."""

    def names(self) -> list[str]: ...


# --- Ray -----------------------------------------------------------------------------------------------


class _RayPending:
    def __init__(self, dispatcher: RayDispatcher, actor: str, ref) -> None:
        self._dispatcher, self.actor, self.ref = dispatcher, actor, ref
        self._future: concurrent.futures.Future | None = None

    def as_future(self) -> concurrent.futures.Future:
        if self._future is None:
            self._future = self.ref.future()
        return self._future

    def result(self, timeout: float | None = None) -> Any:
        ray = self._dispatcher.ray
        try:
            return ray.get(self.ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise CallTimeout(f"{self.actor}: no answer within {timeout} s") from None
        except ray.exceptions.RayActorError as exc:
            detail = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
            raise ActorLost(self.actor, detail, for_good=isinstance(exc, ray.exceptions.ActorDiedError)) from None


class _DirectPending:
    """A call sent over a hub's direct channel: fails as ActorLost if the connection ends first."""

    def __init__(self, actor: str, future: concurrent.futures.Future) -> None:
        self.actor, self.future = actor, future

    def as_future(self) -> concurrent.futures.Future:
        return self.future

    def result(self, timeout: float | None = None) -> Any:
        try:
            return self.future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise CallTimeout(f"{self.actor}: no answer within {timeout} s") from None
        except ChannelClosed as exc:
            raise ActorLost(self.actor, f"ActorDiedError: {exc}") from None


class RayDispatcher(Dispatcher):
    """Devices served by hub actors (testbed.engine.hub.DeviceHub: one Ray actor per node, many devices in
    it). Each device's calls are numbered here, so its hub starts them in the order they were sent, whether a
    call goes over the hub's direct channel or through Ray.
    """

    def __init__(self, ray, hubs: dict[str, Any]) -> None:
        self.ray = ray
        self.hubs = hubs  # device (or watcher) name -> the handle of the hub actor serving it
        self._numbers: dict[str, itertools.count] = {name: itertools.count() for name in hubs}
        self._lock = threading.Lock()
        self._token = secrets.token_bytes(TOKEN_BYTES)
        self._channels: dict[int, DirectChannel] = {}  # id(hub handle) -> its direct channel
        self._reopening: dict[int, threading.Thread] = {}  # id(hub handle) -> the thread opening a new channel
        self._closed = False

    def open_direct(self, timeout_s: float = 30.0) -> None:
        """A direct channel to every hub, all at once; a hub that cannot have one is called through Ray."""
        ip = self.ray.util.get_node_ip_address()
        opening = {id(hub): hub.open_direct.remote(self._token, ip) for hub in self.hub_handles()}
        for key, ref in opening.items():
            try:
                self._channels[key] = DirectChannel(tuple(self.ray.get(ref, timeout=timeout_s)), self._token)
            except Exception as exc:  # the hub stays reachable through Ray: slower, not wrong
                log.warning("no direct channel to a hub (its calls go through Ray): %s", exc)

    def direct(self, actor: str) -> bool:
        """Whether calls to this actor go over its hub's direct channel now."""
        channel = self._channels.get(id(self.hubs[actor]))
        return channel is not None and channel.alive

    def close_direct(self) -> None:
        """Close every direct channel (before the hubs are stopped: their end is not a death)."""
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()

    def call(self, actor: str, method: str, *args: Any) -> _RayPending | _DirectPending:
        hub = self.hubs[actor]
        with self._lock:  # number and send together: a device's calls reach its hub in their numbers' order
            seq = next(self._numbers[actor])
            channel = self._channels.get(id(hub))
            if channel is not None:
                try:
                    return _DirectPending(actor, channel.call(actor, seq, method, args))
                except ChannelClosed:
                    del self._channels[id(hub)]  # the hub died or the connection broke: Ray, until reopened
            ref = hub.call.remote(actor, seq, method, *args)
            if channel is not None and not self._closed and id(hub) not in self._reopening:
                thread = threading.Thread(target=self._reopen, args=(hub,), name="direct reopen", daemon=True)
                self._reopening[id(hub)] = thread
                thread.start()
        return _RayPending(self, actor, ref)

    def settle(self, timeout_s: float = REOPEN_S) -> None:
        """Wait until no channel is being reopened (opened, or given up on)."""
        deadline = time.monotonic() + timeout_s
        for thread in list(self._reopening.values()):
            thread.join(max(0.0, deadline - time.monotonic()))

    def _reopen(self, hub) -> None:
        """A new channel to a hub whose channel ended, once (Ray has restarted it and) it answers."""
        ip = self.ray.util.get_node_ip_address()
        deadline = time.monotonic() + REOPEN_S
        try:
            while not self._closed and time.monotonic() < deadline:
                try:
                    address = tuple(self.ray.get(hub.open_direct.remote(self._token, ip), timeout=10.0))
                    channel = DirectChannel(address, self._token)
                except Exception:  # restarting, or gone for good: Ray's calls say which
                    time.sleep(0.5)  # polling a restarting actor; its calls go through Ray meanwhile
                    continue
                with self._lock:
                    if self._closed:
                        channel.close()
                    else:
                        self._channels[id(hub)] = channel
                return
        finally:
            with self._lock:
                self._reopening.pop(id(hub), None)

    def wait(self, pending: list, *, timeout: float | None) -> tuple[list, list]:
        if all(isinstance(p, _RayPending) for p in pending):
            by_ref = {p.ref: p for p in pending}
            done, rest = self.ray.wait(list(by_ref), num_returns=1, timeout=timeout)
            return [by_ref[r] for r in done], [by_ref[r] for r in rest]
        by_future = {p.as_future(): p for p in pending}
        done, rest = concurrent.futures.wait(by_future, timeout=timeout, return_when="FIRST_COMPLETED")
        return [by_future[f] for f in done], [by_future[f] for f in rest]

    def names(self) -> list[str]:
        return list(self.hubs)

    def hub_handles(self) -> list[Any]:
        """Each hub once."""
        return list({id(h): h for h in self.hubs.values()}.values())


# --- in process ----------------------------------------------------------------------------------------


class _LocalPending:
    def __init__(self, actor: str, future: concurrent.futures.Future) -> None:
        self.actor, self.future = actor, future

    def result(self, timeout: float | None = None) -> Any:
        try:
            return self.future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise CallTimeout(f"{self.actor}: no answer within {timeout} s") from None


class LocalDispatcher(Dispatcher):
    """Actors as objects in this process (testbed.engine.device_actor.DeviceActor, or anything with its
    methods), each with its own threads.
    """

    def __init__(self) -> None:
        self.actors: dict[str, Any] = {}
        self._threads: dict[str, concurrent.futures.ThreadPoolExecutor] = {}

    def add(self, name: str, actor: Any, *, concurrency: int = 1) -> None:
        self.actors[name] = actor
        self._threads[name] = concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix=name)

    def call(self, actor: str, method: str, *args: Any) -> _LocalPending:
        return _LocalPending(actor, self._threads[actor].submit(getattr(self.actors[actor], method), *args))

    def wait(self, pending: list[Pending], *, timeout: float | None) -> tuple[list[Pending], list[Pending]]:
        # A dispatcher is only handed back what its own `call` returned.
        by_future = {cast(_LocalPending, p).future: p for p in pending}
        done, rest = concurrent.futures.wait(by_future, timeout=timeout, return_when="FIRST_COMPLETED")
        return [by_future[f] for f in done], [by_future[f] for f in rest]

    def names(self) -> list[str]:
        return list(self.actors)

    def close(self, names: Iterable[str] | None = None) -> None:
        for name in list(names if names is not None else self.actors):
            self._threads.pop(name).shutdown(wait=True)
            close = getattr(self.actors.pop(name), "close", None)
            if close is not None:
                close()
