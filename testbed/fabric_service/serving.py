"""The fabric service as a run serves it while its job runs (job.fabric_service, docs/fabric_service.md).

Started by job.start (or rail.train) before the ranks (its address and token go into their environment), closed
when the job stops. A change applies the planned configuration exactly as fabric.apply does (`ApplyStep` through
the coordinator: each switch's family `reconfigure`, light verified, every call in the history).

A change is collective, as the collective it serves: it starts once every rank of the job has asked for the
configuration (by `setup` or `prepare`), never when the first one does, so no rank's traffic of the phase
before is cut by a faster rank's request. Then:
- `setup` waits for the configuration to be in place and is answered (at once if it already is);
- `prepare` is answered at once; when it is the last rank's, the change runs in the background (Opus's
  provisioning: the switches move behind the job's compute, and the `setup` that follows waits only for what
  is left of it);
- `release` is answered ok and recorded; it changes nothing (a circuit stays until a change replaces it).
One change runs at a time. A change takes the switches' own time plus `delay_s`, the OCS delay emulated as a
sleep after the light is verified (Opus's method, so a fast switch can stand in for a slow one).

Every change is recorded (`fabric_service.change`) with the framework's share of it on the run's clock:
`command_ms`, from the request that completed the barrier being read to the first switch command sent. At close,
measures: `fabric_service.command_time` (that span, per change), `fabric_service.answer_time` (per request
that waited for a change: from the configuration being ready, light verified and emulated delay over, to its
answer being sent) and `fabric_service.change_time` (the whole change: the request that completed the barrier
read -> the last waiting rank answered, or -> ready when none waited). `testbed report` puts them side by side as
the framework's share of a change (testbed/fabric_service/share_table.py).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hostside.fabric_protocol import ConfigRequest, Prepare, Release
from testbed.contracts.engine import StepEngine
from testbed.fabric_service.addresses import service_addresses
from testbed.fabric_service.server import FabricService, Refused


class PlannedChange(Protocol):
    """What the service needs of a configuration's planned change (testbed.steps.fabric_apply.ApplyStep, a layer
    above this one): the circuits it sets and the switch calls that set them.
    """

    @property
    def label(self) -> str:
        """The step label its calls are recorded under."""

    @property
    def circuits(self) -> Mapping[str, Sequence[tuple[int, int]]]:
        """Switch -> the circuits (ingress, egress) it must hold."""

    def calls(self, engine: StepEngine) -> Mapping[str, tuple[str, dict[str, Any]]]:
        """Switch -> the procedure that sets its circuits (its family's reconfigure) and its arguments."""


def _read_after(a: ConfigRequest, b: ConfigRequest) -> bool:
    return a.t_received_ns is not None and (b.t_received_ns is None or a.t_received_ns > b.t_received_ns)


@dataclass
class _Change:
    config: str
    asked: set[int] = field(default_factory=set)  # the ranks that asked for it, until every one has
    # The request read last of those that completed the barrier: the change could begin no earlier. (Not always
    # the one whose thread took the lock last: a thread can be preempted between reading its line and the lock.)
    trigger: ConfigRequest | None = None
    started: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    t_sent_ns: int | None = None
    t_verified_ns: int | None = None
    t_ready_ns: int | None = None
    answered: list[int] = field(default_factory=list)  # when each rank that waited for it was answered


class ServedFabric:
    """The job's fabric service during a run: requests from the ranks, each change applied through the engine and
    recorded (the module's docstring says how).
    """

    def __init__(
        self,
        coordinator: StepEngine,
        steps: Mapping[str, PlannedChange],
        *,
        ranks: int,
        delay_s: float = 0.0,
        barrier_timeout_s: float = 120.0,
        label: str = "job",
        in_place: str | None = None,
        hosts: dict[str, str] | None = None,
        controller_address: str | None = None,
    ) -> None:
        """`hosts`: every host the job's ranks may run on -> its address as this machine reaches it (the service
        listens where they reach it; testbed/fabric_service/addresses.py); `controller_address`: the inventory's.
        """
        self.c = coordinator
        self.steps = steps  # configuration -> its planned ApplyStep (Plan.fabric_service)
        self.ranks = ranks  # a change starts once this many ranks asked for it
        self.delay_s = delay_s
        self.barrier_timeout_s = barrier_timeout_s
        self.current = in_place  # the configuration in place (None: unknown, or a change failed)
        self.changes: list[_Change] = []  # every change started, in order
        self._pending: dict[str, _Change] = {}  # configuration -> the change some ranks (not all yet) asked for
        self._moving: list[_Change] = []  # started and not done, in order (each waits for the one before)
        self._lock = threading.Lock()
        self._apply_lock = threading.Lock()  # one change at a time
        self._closed = False
        configurations = {
            name: {sw: [list(p) for p in pairs] for sw, pairs in step.circuits.items()} for name, step in steps.items()
        }
        self.c.recorder.emit(
            "mark",
            "fabric_service.start",
            step=label,
            data={"configurations": configurations, "ranks": ranks, "delay_ms": delay_s * 1000},
        )
        listen, advertised = service_addresses(hosts or {"this machine": "127.0.0.1"}, controller_address)
        self.service = FabricService(
            secrets.token_hex(16),
            set(steps),
            self._handle,
            self._record,
            host=listen,
            world_size=ranks,
            max_connections=2 * ranks + 16,  # every rank, a reconnection each, and some to spare
            advertised=advertised,
        )

    def env(self, host: str) -> dict[str, str]:
        """The environment a rank on `host` finds the service by."""
        return self.service.env(host)

    def relaunched(self) -> None:
        """The ranks were started again (a failover): what the ranks before asked for counts no more."""
        with self._lock:
            self._abandon("the job's ranks were relaunched")

    def close(self) -> None:
        """Stop serving (waiters on a change not every rank asked for are refused), wait for a change still
        moving the switches, and record the framework's time around each change.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._abandon("the job's fabric service is closing")
        self.service.close()
        for change in list(self._moving):
            change.done.wait(self.barrier_timeout_s)  # a provisioning change still moving the switches
        for change in self.changes:  # the framework's time around each change, one span per change / answer
            received = change.trigger.t_received_ns if change.trigger is not None else None
            if received is not None and change.t_sent_ns is not None:
                self._span("fabric_service.command_time", change, received, change.t_sent_ns)
            if change.t_ready_ns is not None:
                for answered in change.answered:
                    self._span("fabric_service.answer_time", change, change.t_ready_ns, answered)
            end = max(change.answered) if change.answered else change.t_ready_ns
            if received is not None and end is not None:  # the whole change: request read -> last answer
                self._span("fabric_service.change_time", change, received, end)
        self.c.recorder.emit(
            "mark", "fabric_service.stop", data={"changes": len(self.changes), **self.service.refused_counts}
        )

    def _span(self, name: str, change: _Change, start: int, end: int) -> None:
        data = {"ms": (end - start) / 1e6, "config": change.config, "start_ns": start, "end_ns": end}
        self.c.recorder.emit("measure", name, mono_ns=end, data=data)

    def _abandon(self, why: str) -> None:
        """Under the lock: the changes not every rank asked for will never start; their waiters are answered."""
        for change in self._pending.values():
            change.error = Refused(why)
            change.started.set()
            change.done.set()
        self._pending.clear()

    # --- requests (one thread per rank's connection) ---------------------------------------------------

    def _handle(self, request: ConfigRequest) -> None:
        if isinstance(request, Release):
            return  # recorded by the service; a circuit stays until a change replaces it
        config = request.config
        apply_here = False
        with self._lock:
            moving = [c for c in self._moving if c.config == config]
            if moving:
                change = moving[-1]  # on its way: wait for it
            elif not self._moving and self.current == config:
                return  # in place already
            else:
                if config not in self._pending:
                    self._pending[config] = _Change(config)
                change = self._pending[config]
                change.asked.add(-1 if request.rank is None else request.rank)
                if change.trigger is None or _read_after(request, change.trigger):
                    change.trigger = request
                if len(change.asked) >= self.ranks:
                    del self._pending[config]
                    self.changes.append(change)
                    self._moving.append(change)
                    self.current = None  # until the change is done: a failed one leaves the fabric unknown
                    change.started.set()
                    if isinstance(request, Prepare):  # provisioning: the switches move while the rank computes
                        threading.Thread(
                            target=self._apply, args=(change,), name=f"fabric {config}", daemon=True
                        ).start()
                    else:
                        apply_here = True
        if apply_here:
            self._apply(change)  # on this rank's thread: no thread start between its request and the command
        if isinstance(request, Prepare):
            return  # answered at once; the last rank's prepare started the change in the background
        if not change.started.wait(self.barrier_timeout_s):
            with self._lock:
                if not change.started.is_set():
                    waiting = sorted(change.asked)
                    change.asked.discard(-1 if request.rank is None else request.rank)
                    raise Refused(
                        f"configuration {config!r} changes once all {self.ranks} ranks of the job ask for it; "
                        f"only rank(s) {waiting} asked within {self.barrier_timeout_s:g} s"
                    )
        change.done.wait()
        if change.error is not None:
            raise change.error

    def _apply(self, change: _Change) -> None:
        step, trigger = self.steps[change.config], change.trigger
        assert trigger is not None
        try:
            with self._apply_lock:
                results = list(self.c.call(step.calls(self.c), step.label).values())
                change.t_sent_ns = min(r.marks["sent"][0] for r in results if "sent" in r.marks)
                change.t_verified_ns = max(
                    (r.marks.get("lit") or r.marks.get("acked") or (time.monotonic_ns(),))[0] for r in results
                )
                if self.delay_s > 0:
                    time.sleep(self.delay_s)  # the emulated OCS delay: the switch's, not the framework's
                change.t_ready_ns = time.monotonic_ns()
        except BaseException as exc:  # a device's failure is every waiting rank's answer
            change.error = exc
        data: dict[str, Any] = {
            "config": change.config,
            "trigger": trigger.op,
            "rank": trigger.rank,
            "t_received_ns": trigger.t_received_ns,
            "t_sent_ns": change.t_sent_ns,
            "t_verified_ns": change.t_verified_ns,
            "t_ready_ns": change.t_ready_ns,
            "delay_ms": self.delay_s * 1000,
        }
        if change.error is not None:
            data["error"] = f"{type(change.error).__name__}: {change.error}"
        elif change.t_sent_ns is not None and trigger.t_received_ns is not None:
            data["command_ms"] = (change.t_sent_ns - trigger.t_received_ns) / 1e6
        self.c.recorder.emit("mark", "fabric_service.change", data=data)  # before any rank hears of it
        with self._lock:
            self._moving.remove(change)
            if change.error is None and not self._moving:
                self.current = change.config
        change.done.set()

    def _record(self, event: dict[str, Any]) -> None:
        data = dict(event)
        op = data.pop("event")
        if op == "fabric_service.answer" and data.get("ok") and data.get("op") == "setup":
            self._note_answer(data)
        self.c.recorder.emit("mark", op, data=data)

    def _note_answer(self, answer: dict[str, Any]) -> None:
        """An ok answer to a setup that was waiting when its change became ready counts for its answer_time."""
        received, answered = answer.get("t_received_ns"), answer.get("t_answered_ns")
        if received is None or answered is None:
            return
        for change in reversed(self.changes):
            if change.config == answer.get("config") and change.t_ready_ns is not None:
                if received <= change.t_ready_ns <= answered:
                    change.answered.append(answered)
                return
