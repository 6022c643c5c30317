"""How the engine reaches the device actors: a small interface with two implementations.

- RayDispatcher: the devices are served by hub actors, one Ray actor per node (local, or on the lab cluster's
  nodes) with a thread per device (testbed/runner/hub.py); what `testbed run` uses.
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
import threading
from collections.abc import Iterable
from typing import Any, Protocol


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
        two at a time, so the engine can wait for it to be watching)."""

    def wait(self, pending: list[Pending], *, timeout: float | None) -> tuple[list[Pending], list[Pending]]:
        """(done, not done) once at least one of `pending` is done, or after `timeout`."""

    def names(self) -> list[str]: ...


# --- Ray -----------------------------------------------------------------------------------------------


class _RayPending:
    def __init__(self, dispatcher: RayDispatcher, actor: str, ref) -> None:
        self._dispatcher, self.actor, self.ref = dispatcher, actor, ref

    def result(self, timeout: float | None = None) -> Any:
        ray = self._dispatcher.ray
        try:
            return ray.get(self.ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise CallTimeout(f"{self.actor}: no answer within {timeout} s") from None
        except ray.exceptions.RayActorError as exc:
            detail = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
            raise ActorLost(self.actor, detail, for_good=isinstance(exc, ray.exceptions.ActorDiedError)) from None


class RayDispatcher:
    """Devices served by hub actors (testbed.runner.hub.DeviceHub: one Ray actor per node, many devices in
    it). Each device's calls are numbered here, so its hub starts them in the order they were sent."""

    def __init__(self, ray, hubs: dict[str, Any]) -> None:
        self.ray = ray
        self.hubs = hubs  # device (or watcher) name -> the handle of the hub actor serving it
        self._numbers: dict[str, itertools.count] = {name: itertools.count() for name in hubs}
        self._lock = threading.Lock()

    def call(self, actor: str, method: str, *args: Any) -> _RayPending:
        with self._lock:  # number and send together: a device's calls reach its hub in their numbers' order
            seq = next(self._numbers[actor])
            ref = self.hubs[actor].call.remote(actor, seq, method, *args)
        return _RayPending(self, actor, ref)

    def wait(self, pending: list[_RayPending], *, timeout: float | None) -> tuple[list, list]:
        by_ref = {p.ref: p for p in pending}
        done, rest = self.ray.wait(list(by_ref), num_returns=1, timeout=timeout)
        return [by_ref[r] for r in done], [by_ref[r] for r in rest]

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


class LocalDispatcher:
    """Actors as objects in this process (testbed.runner.device_actor.DeviceActor, or anything with its
    methods), each with its own threads."""

    def __init__(self) -> None:
        self.actors: dict[str, Any] = {}
        self._threads: dict[str, concurrent.futures.ThreadPoolExecutor] = {}

    def add(self, name: str, actor: Any, *, concurrency: int = 1) -> None:
        self.actors[name] = actor
        self._threads[name] = concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix=name)

    def call(self, actor: str, method: str, *args: Any) -> _LocalPending:
        return _LocalPending(actor, self._threads[actor].submit(getattr(self.actors[actor], method), *args))

    def wait(self, pending: list[_LocalPending], *, timeout: float | None) -> tuple[list, list]:
        by_future = {p.future: p for p in pending}
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
