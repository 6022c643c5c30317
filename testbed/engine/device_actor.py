"""A device as the engine drives it: its driver, so all access to the device is serialised, and its
procedures run next to the driver, so every timestamp is taken where the I/O happens (not from Ray round
trips). Results come back as data (OpResult), errors included, never as Ray exceptions. In a run, a node's
devices are served by one hub actor (testbed/engine/hub.py), a thread each; in a test or a notebook, by a
LocalDispatcher in the caller's process.

A hub whose worker process dies (a crash in a driver library, kill -9) is restarted by Ray up to
MAX_RESTARTS times in a run: its devices are built again, so their drivers reconnect. The calls that were
running are lost with their audit records; the coordinator records them as `info` (outcome unknown).
"""

from __future__ import annotations

import collections
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

from drivers.audit import AuditRecord
from drivers.errors import (
    DeviceConnectionError,
    DeviceError,
    DeviceProtocolError,
    DeviceTimeout,
    InterlockError,
)
from testbed.families import FAMILIES, PROCEDURES
from testbed.families.context import ProcedureContext
from testbed.families.drivers import make_driver
from testbed.families.interlocks import GuardedSwitch, Policy

MAX_RESTARTS = 3  # per hub and run; a hub that keeps dying is left dead and its devices' calls fail


@dataclass
class OpResult:
    device: str
    procedure: str
    node: str
    status: str  # "ok", "fail", or "info" (outcome unknown: a timeout after a write)
    start: tuple[int, float]
    end: tuple[int, float]
    value: object = None
    error: str | None = None
    error_type: str | None = None
    marks: dict[str, tuple[int, float]] = field(default_factory=dict)
    audit: list[AuditRecord] = field(default_factory=list)


KEPT_TOKENS = 256  # the ended runs whose tokens (and milestones) an actor remembers for a late wait


class DeviceActor:
    def __init__(
        self, device: str, driver: str, settings, policy: Policy | None = None, kind: str | None = None
    ) -> None:
        """settings: the transport's (TransportConfig.settings()); policy: the interlocks every write passes;
        kind: the device's family, whose procedures this actor runs (None: any family's).
        """
        self.device = device
        self.address = settings.address
        self._procedures = (
            {n: spec.function for n, spec in FAMILIES.get(kind).procedures.items()} if kind else PROCEDURES
        )
        self._audit: list[AuditRecord] = []
        self._driver = make_driver(driver, device, settings, self._audit.append)
        if policy is not None:
            self._driver = GuardedSwitch(self._driver, policy)
        self._cache: dict = {}
        self._node = socket.gethostname()
        # The milestones each watched run has passed, by the token its caller gave it, and the tokens whose run
        # has ended: a wait for a token's milestone ends when the milestone comes or when its run ends without it.
        self._marks_seen: dict[str | None, set[str]] = {}
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._marked = threading.Condition()
        # The driver's I/O thread (paramiko's transport) hands data to the procedure's thread; at Python's
        # default switch interval that hand-over would delay every timestamp taken here (docs/tuning.md).
        sys.setswitchinterval(0.0005)

    def wait_mark(self, name: str, timeout_s: float, token: str | None = None) -> bool:
        """Block until the run started with `token` passes milestone `name` (True), or that run ends without it,
        or `timeout_s` passes (False). The run may not have started yet, or may have ended already.

        Needs an actor started with max_concurrency >= 2: the procedure runs on one thread while the
        coordinator waits here on another (a watcher must be watching before a fault is injected). A wait ends
        with its run, so no wait outlives the step that asked: one left waiting would hold one of the actor's
        threads, and the next step's wait would queue behind the next run: its fault would be injected only once
        that whole watch had ended.
        """

        def settled() -> bool:
            return name in self._marks_seen.get(token, ()) or (token is not None and token in self._ended)

        with self._marked:
            self._marked.wait_for(settled, timeout_s)
            return name in self._marks_seen.get(token, ())

    def _seen(self, token: str | None, name: str) -> None:
        with self._marked:
            self._marks_seen.setdefault(token, set()).add(name)
            self._marked.notify_all()

    def _begin(self, token: str | None) -> None:
        with self._marked:
            self._marks_seen[token] = set()

    def _end(self, token: str | None) -> None:
        with self._marked:
            if token is not None:
                self._ended[token] = None
                while len(self._ended) > KEPT_TOKENS:
                    old, _ = self._ended.popitem(last=False)
                    self._marks_seen.pop(old, None)
            self._marked.notify_all()

    def where(self) -> dict:
        """The Ray node this actor runs on, its worker process, and a clock reading for the coordinator's
        offset estimate.
        """
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "hostname": self._node,
            "address": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "wall": time.time(),
        }

    def run(self, procedure: str, kwargs: dict, token: str | None = None) -> OpResult:
        """One procedure on the device; its milestones can be waited for by `token` (wait_mark) while it runs."""
        self._begin(token)
        try:
            return self._run(procedure, kwargs, token)
        finally:
            self._end(token)

    def _run(self, procedure: str, kwargs: dict, token: str | None) -> OpResult:
        ctx = ProcedureContext(
            self.device, self.address, cache=self._cache, on_mark=lambda name: self._seen(token, name)
        )
        start = (time.monotonic_ns(), time.time())
        status, value, error, error_type = "ok", None, None, None
        try:
            value = self._procedures[procedure](self._driver, ctx, **kwargs)
        except InterlockError as exc:  # refused before anything was sent: certainly did not happen
            status, error, error_type = "fail", str(exc), type(exc).__name__
        except (DeviceTimeout, DeviceConnectionError, DeviceProtocolError) as exc:
            # Jepsen's rule: once anything was sent, a lost or garbled reply leaves the outcome unknown (the
            # switch may well have made the circuit); only an operation that sent nothing has certainly failed.
            sent = any(r.direction == "tx" for r in self._audit)
            status, error, error_type = ("info" if sent else "fail"), str(exc), type(exc).__name__
        except DeviceError as exc:
            status, error, error_type = "fail", str(exc), type(exc).__name__
        except Exception as exc:  # a bug in a procedure or driver: report it, keep the actor alive
            status, error, error_type = "fail", traceback.format_exc(), type(exc).__name__
        end = (time.monotonic_ns(), time.time())
        audit, self._audit[:] = list(self._audit), []
        return OpResult(
            self.device, procedure, self._node, status, start, end, value, error, error_type, dict(ctx.marks), audit
        )

    def run_program(self, calls: list[tuple[str, dict]], token: str | None = None) -> list[OpResult]:
        """Several procedures in order, in one round trip; stops after the first that does not succeed.

        Ray's round trip after the actor has waited on its device is a few ms on a small machine, and a
        trial that drives one device pays it once instead of once per step.
        """
        results = []
        for procedure, kwargs in calls:
            results.append(self.run(procedure, kwargs, token))
            if results[-1].status != "ok":
                break
        return results

    def close(self) -> None:
        close = getattr(self._driver, "close", None)
        if close is not None:
            close()
