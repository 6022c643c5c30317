"""Jobs on GPU hosts, faults, and failure detection, as the coordinator executes them.

Ranks are started and stopped through each host's actor. Detection runs on a second actor per host (its
own SSH connection, two threads) so that watching never blocks the host's actor: every rank is watched
from before the fault is injected until the failure is seen. Faults go through the twin's control API when
emulated (a GPU really falls off the emulated bus) and through the host otherwise (the rank is killed and
the GPU marked failed in the run, as published testbeds simulate it).
"""

from __future__ import annotations

import contextlib
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from emulators.control import TriggerMissed
from testbed.config.inventory import Inventory
from testbed.config.playbook import Job
from testbed.events import Op
from testbed.fabric import PathError, choose_spare, links_to_circuits
from testbed.fabric.jobfabric import fabric_links, ring_link_ports
from testbed.milestones import segments_of
from testbed.plan import (
    ApplyStep,
    FailoverStep,
    FaultDetectStep,
    FaultInjectStep,
    HealthStep,
    JobMeasureStep,
    JobStartStep,
    JobStopStep,
)
from testbed.runner.coordinator import Coordinator, StepFailed, _raise_failures

WATCH_READY_TIMEOUT_S = 20.0


@dataclass
class Rank:
    index: int
    host: str
    local: int  # index among the ranks of its host: its GPU


# Faults only the twin can apply: a lab needs a BMC (power) or a duty-cycle agent (straggle) for them.
TWIN_ONLY_FAULTS = {"host.power_off", "host.straggle"}
# A switch whose connection failed during a rewiring is tried again for this long (then the step fails).
FABRIC_RETRY_S = 3.0
FABRIC_RETRY_BACKOFF_S = 0.05
RETRYABLE = {"DeviceConnectionError", "DeviceTimeout"}
# What gpu.watch_job reports when the host itself shows the fault, not just the process's exit.
HARDWARE_FAILURES = {"gpu_lost", "xid"}
# testbed-train's line once its ring is up: the step it resumed from (the job_ready milestone).
READY = r"^ready rank \d+ world \d+ step (\d+)"
# A twin fault is scheduled this far ahead: more than a control request takes to reach the twin on a loaded
# machine (~5 ms at worst on 2 cores). A trigger that still arrives late is sent again, further ahead.
TRIGGER_LEAD_NS = 20_000_000
TRIGGER_ATTEMPTS = 3


class FaultInjector:
    """Injects and heals one fault; returns the monotonic time of injection.

    A twin fault is a timed trigger: the twin applies it at a moment chosen here, on the clock both share,
    and that moment is the injection time. (The midpoint of a call that delivers a fault is off by up to
    half the call, and on a loaded machine a call's two halves differ by milliseconds.) The twin's ground
    truth records when the fault really took effect, so its lateness is measured, not assumed away. On a real
    lab the fault is a signal sent over SSH, and the injection time is the midpoint of that `kill`."""

    def __init__(self, coordinator: Coordinator, twin_control=None) -> None:
        self.coordinator = coordinator
        self.twin = twin_control  # None on a real lab

    def inject(
        self, kind: str, rank: Rank, job: dict, label: str, xid: int, duty: float = 0.5, period_s: float = 0.2
    ) -> int:
        if kind in TWIN_ONLY_FAULTS and self.twin is None:
            raise StepFailed(f"{kind} is not supported on a real lab yet (it needs a BMC / a duty-cycle agent)")
        if self.twin is not None and kind in ("gpu.fail", "host.power_off", "host.straggle"):
            if kind == "gpu.fail":
                op, args = "fail_gpu", {"index": rank.local, "xid": xid}
            elif kind == "host.power_off":
                op, args = "power_off", {}
            else:
                # The playbook's duty is the fraction stopped; the twin's is the fraction running.
                op, args = "straggle", {"pid": job.get("pid"), "duty": 1 - duty, "period_ms": period_s * 1000}
            return self._trigger(kind, rank, op, args)
        # On a real lab gpu.fail kills the rank (its GPU is marked failed in the run's events); process.kill
        # and process.hang are signals on any lab.
        signal = {"gpu.fail": "KILL", "process.kill": "KILL", "process.hang": "STOP"}[kind]
        result = self.coordinator.call({rank.host: ("gpu.kill_job", {"job": job, "signal": signal})}, label)
        return result[rank.host].marks[Op.FAULT_INJECTED][0]

    def _trigger(self, kind: str, rank: Rank, op: str, args: dict) -> int:
        lead = TRIGGER_LEAD_NS
        for _ in range(TRIGGER_ATTEMPTS):
            at = time.monotonic_ns() + lead
            try:
                self.twin.call_at(at, rank.host, op, **args)
                return at
            except TriggerMissed:
                lead *= 4
        raise StepFailed(
            f"{kind} on {rank.host}: the twin received the timed fault after its moment {TRIGGER_ATTEMPTS} times "
            f"(last time {lead // 4_000_000} ms ahead); nothing was applied. This machine is overloaded: stop "
            "other work on it and run again"
        )

    def heal(self, kind: str, rank: Rank, job: dict, label: str) -> None:
        if kind == "gpu.fail" and self.twin is not None:
            self.twin.call(rank.host, "recover_gpu", index=rank.local)
        elif kind == "host.power_off" and self.twin is not None:
            self.twin.call(rank.host, "power_on")
        elif kind == "host.straggle" and self.twin is not None:
            self.twin.call(rank.host, "stop_straggle", pid=job.get("pid"))
        elif kind == "process.hang":
            # A detection stops the job first, so the stopped rank may be gone: continued if still there.
            self.coordinator.call({rank.host: ("gpu.resume_job", {"job": job})}, label)


class JobController:
    """The playbook's job: its ranks, their hosts (the assignment, which a failover changes), the fabric
    that connects them, and the watchers that see them fail."""

    def __init__(
        self,
        coordinator: Coordinator,
        job: Job,
        watchers: dict,
        address_of: Callable[[str], str],
        faults: FaultInjector,
        *,
        inventory: Inventory | None = None,
        managed: dict[str, tuple[int, ...]] | None = None,
        seed: int = 0,
        link: Callable[[str, str, str, str, int], str] | None = None,
    ) -> None:
        self.c = coordinator
        self.job = job
        self.watchers = watchers  # host -> watcher actor
        self.address_of = address_of  # host -> the address its ranks are reached at (data plane)
        self.faults = faults
        self.inventory = inventory
        self.managed = managed or {}  # switch -> ports the job's fabric owns
        self.seed = seed
        self._rng = random.Random()  # listen ports of emulated ranks: any free ones, not part of the experiment
        # (src host, src port, dst host, dst port, target port) -> address: the twin's data-plane relay, so
        # a rank reaches its neighbour only along circuits the switches hold (None: direct, as on a lab)
        self.link = link
        self.spare_use: dict[str, int] = {}
        self.failovers = 0
        self.launches = 0  # each launch names its ranks' jobs afresh: a log read from its start is this launch's
        self.handles: dict[int, dict] = {}  # rank -> job handle (pid, log) while running
        self._assign(list(job.ranks))

    def _assign(self, hosts: list[str]) -> None:
        self.assignment = hosts
        seen: dict[str, int] = {}
        self.ranks = []
        for index, host in enumerate(hosts):
            self.ranks.append(Rank(index, host, seen.get(host, 0)))
            seen[host] = seen.get(host, 0) + 1

    # --- start / stop ---------------------------------------------------------------------------

    def start(self, step: JobStartStep) -> None:
        if self.handles:
            raise StepFailed("job.start: the job is already running; add a job.stop step before starting it again")
        self._assign(list(self.job.ranks))  # every trial starts from the playbook's assignment
        if self.job.fabric is not None:
            self._apply_fabric(step.label)
        self._launch(step.label)
        if step.wait_steps > 0:
            self._wait(step.label, self.ranks, self.job.progress, step.wait_steps, step.timeout_s)
        self.c.recorder.emit("mark", Op.JOB_READY, step=step.label, data={"ranks": len(self.ranks)})

    def _launch(
        self, label: str, watch: int | None = None, timeout_s: float = 120.0
    ) -> tuple[dict[int, object], object | None]:
        """Start every rank at once; returns each rank's start result (its job_started mark) and, for the
        rank `watch`, the result of following its log to its ready line (job_ready) and on to its first
        training step (first_step).

        The watch follows the start in the same actor program, so it is live within milliseconds of the
        launch, long before the job can print: every line is marked when it arrives, never when a watch
        started late finds it already written. One rank is enough: its ready line follows an all-reduce
        with every rank, and the job's failures reach it too (its peers' deaths end it). Watching every
        rank's ready line made those results, and Ray's traffic for them, arrive just as the first step
        did, and delayed seeing it by milliseconds (the twin's ground truth showed both biases)."""
        self.ports = self._listen_ports()
        direct = [f"{self.address_of(r.host)}:{self.ports[r.index]}" for r in self.ranks]
        self.launches += 1
        programs: dict[str, list] = {}
        for r in self.ranks:
            env = {
                **self.job.env,
                "RANK": str(r.index),
                "WORLD_SIZE": str(len(self.ranks)),
                "LOCAL_RANK": str(r.local),
                "TESTBED_PEERS": ",".join(self._peers_of(r, direct)),
                "TESTBED_CHECKPOINT_DIR": self.job.checkpoint_dir,
            }
            programs.setdefault(r.host, []).append(
                (
                    label,
                    "gpu.start_job",
                    {
                        "command": list(self.job.command),
                        "name": f"rank{r.index}.{self.launches}",
                        "gpus": [r.local],
                        "env": env,
                        # a rank slot keeps its directory across launches, so its checkpoints are found again
                        "workdir": f"testbed-jobs/rank{r.index}",
                    },
                )
            )
        if watch is not None:
            args = {"job": f"rank{watch}.{self.launches}", "progress": self.job.progress, "ready": READY}
            args.update(min_step=0, max_s=timeout_s, mark=Op.FIRST_STEP)
            programs[self.ranks[watch].host].append((label, "gpu.wait_step", args))
        started, watched = {}, None
        for host, results in self.c.dispatch(programs).items():
            on_host = [r for r in self.ranks if r.host == host]
            for r, result in zip(on_host, results[: len(on_host)], strict=True):
                if result is not None and result.status == "ok":
                    self.handles[r.index] = result.value
                started[r.index] = result
            if watch is not None and host == self.ranks[watch].host:
                watched = results[len(on_host)]
        _raise_failures(list(started.values()))  # the watch's failure is the caller's to raise, after its marks
        return started, watched

    def _listen_ports(self) -> list[int]:
        """Where each rank listens. On a lab, the playbook's port + rank on each host. In the twin every rank
        runs on this machine, so each launch takes free ports: a rank left over from an earlier run (its
        twin killed) cannot make this launch fail to bind. They are taken below the kernel's ephemeral range:
        a port from bind(0) is free only until the probe closes, and the twin's relays, which bind(0) too,
        could take it first (a rank's neighbour would then be a relay back to itself)."""
        if self.link is None:
            return [self.job.port + r.index for r in self.ranks]
        low = _ephemeral_low()
        candidates = list(range(max(1024, low - 12000), low))
        self._rng.shuffle(candidates)
        chosen: list[int] = []
        for port in candidates:
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
            chosen.append(port)
            if len(chosen) == len(self.ranks):
                return chosen
        raise StepFailed(f"no {len(self.ranks)} free ports below {low} on 127.0.0.1 for the emulated ranks")

    def _peers_of(self, r: Rank, direct: list[str]) -> list[str]:
        """Rank r's view of every rank's address. Through the twin's data plane, the neighbour it connects to
        (the next rank) is reached by a relay that carries traffic only while the duplex link between the
        two hosts is lit, so a broken or wrongly rewired fabric really stops the job."""
        peers = list(direct)
        fabric = self.job.fabric
        if self.link is None or fabric is None or len(self.ranks) < 2:
            return peers
        # The duplex link that carries rank r -> r+1: on a torus, the x or y link between them.
        ports = ring_link_ports(fabric, r.index)
        nxt = self.ranks[(r.index + 1) % len(self.ranks)]
        if ports is not None and nxt.host != r.host:
            peers[nxt.index] = self.link(r.host, ports[0], nxt.host, ports[1], self.ports[nxt.index])
        return peers

    def _wait(
        self,
        label: str,
        ranks: list[Rank],
        progress: str,
        min_step: int,
        timeout_s: float,
        mark: str = Op.FIRST_STEP,
    ) -> dict[int, object]:
        """Wait until each rank's log shows `progress` at min_step or later (marked `mark`)."""
        programs: dict[str, list] = {}
        for r in ranks:
            args = {"job": self.handles[r.index], "progress": progress, "min_step": min_step, "max_s": timeout_s}
            programs.setdefault(r.host, []).append((label, "gpu.wait_step", {**args, "mark": mark}))
        out = {}
        for host, results in self.c.dispatch(programs).items():
            _raise_failures(results)
            for r, result in zip([r for r in ranks if r.host == host], results, strict=True):
                out[r.index] = result
        return out

    def stop(self, step: JobStopStep | None = None, label: str = "stop job") -> None:
        if not self.handles:
            return
        programs: dict[str, list] = {}
        for r in self.ranks:
            if r.index in self.handles:
                programs.setdefault(r.host, []).append(
                    (step.label if step else label, "gpu.stop_job", {"job": self.handles[r.index]})
                )
        self.handles.clear()
        for results in self.c.dispatch(programs).values():
            _raise_failures(results)

    def _apply_fabric(self, label: str, hosts: list[str] | None = None) -> dict:
        """Make the switches hold the job's topology over the current assignment (the minimal change, on
        every switch at once); returns each switch's result with its sent / acked / lit marks."""
        fabric = self.job.fabric
        hosts = self.assignment if hosts is None else hosts
        if len(set(hosts)) != len(hosts):
            raise StepFailed("a job fabric needs one rank per host (a host transmits on one port per rail)")
        try:
            circuits = links_to_circuits(fabric_links(fabric, hosts), self.inventory)
        except PathError as exc:
            raise StepFailed(f"job fabric: {exc}") from None
        step = ApplyStep(
            label=label,
            configuration="job fabric",
            circuits=circuits,
            managed={sw: self.managed.get(sw, ()) for sw in circuits},
            measure=None,
            verify_light=fabric.verify_light,
            min_power_dbm=fabric.min_power_dbm,
            timeout_s=fabric.light_timeout_ms / 1000,
        )
        return self._rewire(step, label)

    def _rewire(self, step: ApplyStep, label: str) -> dict:
        """Apply the job fabric on every switch at once; a switch whose connection failed (a reset, a stall,
        a refused connection: the device may be fine) is tried again until FABRIC_RETRY_S has passed. Its
        procedure reads the switch afresh each time (a failed one forgets its cached state), so a retry
        after a lost acknowledgement sends only what is still missing. Every attempt is in the history."""
        calls = self.c._calls(step)
        deadline = time.monotonic() + FABRIC_RETRY_S
        done: dict = {}
        while True:
            results = {d: r[0] for d, r in self.c.dispatch({d: [(label, *calls[d])] for d in calls}).items()}
            done.update(results)
            failed = {d: r for d, r in results.items() if r is None or r.status != "ok"}
            retry = all(r is not None and r.error_type in RETRYABLE for r in failed.values())
            if not failed or not retry or time.monotonic() >= deadline:
                _raise_failures(done.values())
                return done
            calls = {d: calls[d] for d in failed}
            time.sleep(FABRIC_RETRY_BACKOFF_S)  # give the connection a moment to come back: recovery, not sync

    # --- faults and detection ---------------------------------------------------------------------

    def detect(self, step: FaultDetectStep) -> None:
        target, injected, first, _ = self._inject_and_detect(step, heal=True)
        rank, detected_ns, value = first
        if step.measure:
            self.c.recorder.emit(
                "measure",
                f"{step.measure}.latency",
                mono_ns=detected_ns,
                wall=time.time(),
                step=step.label,
                data={
                    "ms": (detected_ns - injected) / 1e6,
                    "start_ns": injected,
                    "end_ns": detected_ns,
                    "detected_on_rank": rank,
                    "kind": value.get("detected"),
                    "evidence": value.get("evidence"),
                },
            )

    def _inject_and_detect(self, step, *, heal: bool, on_detect: Callable[[int], None] | None = None):
        """Watch every rank, inject the fault once all are watching, wait for the first detection and stop
        the job (so every other watch ends). Heals the fault at once when `heal`; otherwise the caller heals."""
        if len(self.handles) != len(self.ranks):
            raise StepFailed(f"{step.label}: the job is not running; add a job.start step before it")
        target = self.ranks[step.rank]
        refs = {}
        for r in self.ranks:
            kwargs = {
                "job": self.handles[r.index],
                "heartbeat_s": step.heartbeat_s,
                "stall_timeout_s": step.stall_timeout_s,
                "progress": self.job.progress,
                "max_s": step.timeout_s,
            }
            self.c.recorder.emit("invoke", "gpu.watch_job", device=r.host, step=step.label, data={"rank": r.index})
            refs[r.index] = self.watchers[r.host].run_program.remote([("gpu.watch_job", kwargs)])
        ready = self.c.ray.get(
            [self.watchers[r.host].wait_mark.remote("watching", WATCH_READY_TIMEOUT_S) for r in self.ranks]
        )
        data = self._fault_data(step, target)
        job = self.handles[target.index]
        self.c.recorder.emit("invoke", Op.FAULT_INJECT, device=target.host, step=step.label, data=data)
        try:
            injected = self.faults.inject(step.kind, target, job, step.label, step.xid)
        except StepFailed:
            self.c.recorder.emit("fail", Op.FAULT_INJECT, device=target.host, step=step.label, data=data)
            raise
        self.c.recorder.emit("ok", Op.FAULT_INJECT, device=target.host, step=step.label, data=data)
        self._mark_injected(step, target, injected, {**data, "watching": all(ready)})
        if step.kind == "gpu.fail" and self.faults.twin is None:
            self.c.recorder.emit("mark", Op.GPU_MARKED_FAILED, device=target.host, step=step.label, data=data)
        try:
            first = self._first_detection(refs, step, on_detect)
        finally:
            if heal:
                self._heal(step, target, job, data)
        if first is None:
            if not heal:
                self._heal(step, target, job, data)
            raise StepFailed(
                f"{step.kind} on rank {target.index} ({target.host}) was not detected within {step.timeout_s:g} s"
            )
        return target, injected, first, job

    def _fault_data(self, step, target: Rank) -> dict:
        return {
            "fault": f"{step.kind}@rank{target.index}",
            "kind": step.kind,
            "rank": target.index,
            "host": target.host,
            "gpu": target.local,
            "pid": (self.handles.get(target.index) or {}).get("pid"),  # the rank hit: `testbed heal` needs it
        }

    def _heal(self, step, target: Rank, job: dict, data: dict) -> None:
        self.c.recorder.emit("invoke", Op.FAULT_HEAL, device=target.host, step=step.label, data=data)
        self.faults.heal(step.kind, target, job, step.label)
        self.c.recorder.emit("ok", Op.FAULT_HEAL, device=target.host, step=step.label, data=data)

    def _first_detection(self, refs: dict, step, on_detect: Callable[[int], None] | None = None):
        """Wait for the first watcher to see a failure, stop the job (so every other watch ends), then
        record every watcher's outcome. Returns (rank, detection time, its value) or None. `on_detect(rank)`
        runs as soon as a failure is seen, before the job is torn down (a failover starts rewiring then)."""
        ray = self.c.ray
        by_ref = {ref: rank for rank, ref in refs.items()}
        limit = step.timeout_s + WATCH_READY_TIMEOUT_S
        if on_detect is not None:
            # React to the milestone itself, not to the procedure's return: after marking failure_detected
            # a watcher still takes a health probe for the evidence, which the failover need not wait for.
            # (Once the job is stopped every watcher marks an exit, so none of these waits lingers.)
            seen = {
                self.watchers[self.ranks[rank].host].wait_mark.remote(Op.FAILURE_DETECTED, limit): rank for rank in refs
            }
            pending = list(seen)
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=limit)
                if not done:
                    break
                if ray.get(done[0]):
                    on_detect(seen[done[0]])
                    break
        ray.wait(list(refs.values()), num_returns=1, timeout=limit)
        self.stop(label=step.label)
        detections = []
        for ref, results in zip(refs.values(), ray.get(list(refs.values())), strict=True):
            rank = by_ref[ref]
            result = results[0]
            self.c._record(self.ranks[rank].host, step.label, "gpu.watch_job", result)
            mark = result.marks.get(Op.FAILURE_DETECTED) if result.status == "ok" else None
            if mark and (result.value or {}).get("detected"):
                detections.append((rank, mark[0], result.value))
        return failed_rank(detections)

    def _mark_injected(self, step, target: Rank, injected: int, data: dict) -> None:
        """One fault_injected event per fault: taken here for a twin fault; taken by the host's actor
        otherwise (its mark is recorded with its result), so only the fault's description is added."""
        if self.faults.twin is not None and step.kind in ("gpu.fail", "host.power_off", "host.straggle"):
            self.c.recorder.emit(
                "mark",
                Op.FAULT_INJECTED,
                mono_ns=injected,
                wall=time.time(),
                device=target.host,
                step=step.label,
                data=data,
            )
        else:
            self.c.recorder.emit(
                "mark", Op.FAULT_DESCRIBED, device=target.host, step=step.label, data={**data, "injected_ns": injected}
            )

    def inject(self, step: FaultInjectStep) -> None:
        """A fault kept for a while and then healed; the job's own reaction is what the playbook measures."""
        if len(self.handles) != len(self.ranks):
            raise StepFailed("fault.inject: the job is not running; add a job.start step before it")
        target = self.ranks[step.rank]
        data = {**self._fault_data(step, target), "duration_s": step.duration_s}
        if step.when_s:
            self.c.stopping.wait(step.when_s)  # the playbook's schedule for the fault, not synchronisation
        self.c.recorder.emit("invoke", Op.FAULT_INJECT, device=target.host, step=step.label, data=data)
        job = self.handles[target.index]
        try:
            injected = self.faults.inject(step.kind, target, job, step.label, step.xid, step.duty, step.period_s)
        except StepFailed:
            self.c.recorder.emit("fail", Op.FAULT_INJECT, device=target.host, step=step.label, data=data)
            raise
        self.c.recorder.emit("ok", Op.FAULT_INJECT, device=target.host, step=step.label, data=data)
        self._mark_injected(step, target, injected, data)
        try:
            # How long the playbook keeps the fault (part of the experiment); an abort cuts it short.
            self.c.stopping.wait(step.duration_s)
        finally:
            self._heal(step, target, job, data)

    def measure(self, step: JobMeasureStep) -> None:
        """The job's own iteration times: the interval between consecutive progress lines of one rank."""
        if len(self.handles) != len(self.ranks):
            raise StepFailed(f"{step.label}: the job is not running; add a job.start step before it")
        r = self.ranks[step.rank]
        kwargs = {
            "job": self.handles[r.index],
            "progress": self.job.progress,
            "count": step.steps,
            "max_s": step.timeout_s,
        }
        result = self.c.call({r.host: ("gpu.step_times", kwargs)}, step.label)[r.host]
        ns = result.value["ns"]
        # One figure per window: the mean iteration time (a straggler stalls every few steps, which a
        # median of the intervals would hide); the intervals themselves are kept with it.
        intervals = [round((b - a) / 1e6, 3) for a, b in zip(ns, ns[1:], strict=False)]
        self.c.recorder.emit(
            "measure",
            f"{step.measure}.time",
            mono_ns=ns[-1],
            step=step.label,
            data={
                "ms": (ns[-1] - ns[0]) / 1e6 / len(intervals),
                "start_ns": ns[0],
                "end_ns": ns[-1],
                "rank": r.index,
                "intervals_ms": intervals,
            },
        )

    # --- failover ---------------------------------------------------------------------------------

    def failover(self, step: FailoverStep) -> None:
        """fault_injected -> failure_detected -> spare_selected -> fabric_reconfigured -> link_verified ->
        job_relaunched -> job_ready -> first_step (a step after the checkpoint, on the spare).

        As soon as a watcher sees the failure, the spare is chosen for the rank it saw fail and the fabric
        is rewired through it, while the surviving ranks are torn down: both must be done before the
        relaunch, and neither waits for the other."""
        plan: dict = {}

        def on_detect(rank: int) -> None:
            failed = self.ranks[rank]
            spare = choose_spare(
                failed.host,
                self.inventory,
                in_use=set(self.assignment),
                used_count=self.spare_use,
                seed=self.seed + self.failovers,
                spares=self.job.spares,
            )
            self.failovers += 1
            self.spare_use[spare] = self.spare_use.get(spare, 0) + 1
            plan[Op.SPARE_SELECTED] = self._mark(
                Op.SPARE_SELECTED, step, {"failed": failed.host, "spare": spare, "rank": rank}
            )
            hosts = list(self.assignment)
            hosts[rank] = spare
            plan.update(rank=rank, spare=spare, hosts=hosts)
            plan["fabric"] = self.c._pool.submit(self._apply_fabric, step.label, hosts)

        target, injected, first, job = self._inject_and_detect(step, heal=False, on_detect=on_detect)
        data = self._fault_data(step, target)
        try:
            if "fabric" not in plan:
                raise StepFailed(f"{step.label}: the failure was not reported by a watcher in time to fail over")
            if first is not None and first[0] != plan["rank"]:
                # The spare was chosen for the first rank seen to exit, a peer of the one the evidence names
                # (see failed_rank): undo that choice and fail over the right rank; it costs a second rewiring.
                with contextlib.suppress(Exception):  # the wrong rewiring's outcome no longer matters
                    plan["fabric"].result()
                self.failovers -= 1
                self.spare_use[plan["spare"]] -= 1
                self._mark(
                    Op.FAILURE_REATTRIBUTED,
                    step,
                    {"first_seen": plan["rank"], "failed": first[0], "evidence": first[2].get("evidence")},
                )
                on_detect(first[0])
            milestones = {
                Op.FAULT_INJECTED: injected,
                Op.FAILURE_DETECTED: first[1],
                Op.SPARE_SELECTED: plan[Op.SPARE_SELECTED],
            }
            switches = plan["fabric"].result()
            self._assign(plan["hosts"])
            milestones[Op.FABRIC_RECONFIGURED] = self._mark_at(
                Op.FABRIC_RECONFIGURED, step, max(r.marks["acked"][0] for r in switches.values())
            )
            if all("lit" in r.marks for r in switches.values()):
                milestones[Op.LINK_VERIFIED] = self._mark_at(
                    Op.LINK_VERIFIED, step, max(r.marks["lit"][0] for r in switches.values())
                )
            rank = plan["rank"]
            # The rank on the spare is watched from its launch on: its ready line, then its first step after
            # the checkpoint.
            started, result = self._launch(step.label, watch=rank, timeout_s=step.timeout_s)
            milestones[Op.JOB_RELAUNCHED] = self._mark_at(
                Op.JOB_RELAUNCHED, step, max(r.marks["job_started"][0] for r in started.values())
            )
            _raise_failures([result])
            # The spare's rank prints its ready line after an all-reduce with every rank: the whole job is up.
            milestones[Op.JOB_READY] = result.marks[Op.JOB_READY][0]
            resumed = result.value["resumed"]
            milestones[Op.FIRST_STEP] = result.marks[Op.FIRST_STEP][0]
            self.c.recorder.emit(
                "mark",
                Op.FAILOVER_RESUMED,
                step=step.label,
                device=plan["spare"],
                data={"resumed_from": resumed, "step": result.value["step"], "rank": rank},
            )
        finally:
            self._heal(step, target, job, data)  # the rank hit, as it was launched (its pid may be gone)
        self._measure_failover(step, milestones)

    def _mark(self, name: str, step, data: dict) -> int:
        return self.c.recorder.emit("mark", name, step=step.label, data=data).mono_ns

    def _mark_at(self, name: str, step, ns: int) -> int:
        self.c.recorder.emit("mark", name, mono_ns=ns, wall=time.time(), step=step.label)
        return ns

    def _measure_failover(self, step: FailoverStep, m: dict[str, int]) -> None:
        # A milestone the playbook skipped (link_verified without light checks) merges its neighbours'
        # segments under a joined name, so no segment is passed off as one it is not.
        for seg in segments_of(m):
            self._measure(step, f"{step.measure}.{seg['segment']}", seg["start_ns"], seg["end_ns"])

    def _measure(self, step, name: str, start: int, end: int) -> None:
        self.c.recorder.emit(
            "measure",
            name,
            mono_ns=end,
            wall=time.time(),
            step=step.label,
            data={"ms": (end - start) / 1e6, "start_ns": start, "end_ns": end},
        )


def failed_rank(detections: list[tuple[int, int, dict]]) -> tuple[int, int, dict] | None:
    """Which rank failed, from every watcher's (rank, failure_detected ns, watch_job value): the earliest
    with hardware evidence (a GPU lost, a new Xid), else the earliest. When a rank dies its peers exit too,
    as their ring breaks, and a peer's watcher can see its own rank's exit first: its `tail --pid` checks
    right after the peer's last words, the failed rank's only at its next heartbeat."""
    evidence = [d for d in detections if d[2].get("detected") in HARDWARE_FAILURES]
    return min(evidence or detections, key=lambda d: d[1], default=None)


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (bind(0) hands out ports from there up)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def health_check(c: Coordinator, step: HealthStep) -> None:
    """Identify and health-check every host at once; the results go to the summary as a table, and the
    wall time of the whole check (as the coordinator sees it, Ray included) is measured as health.wall."""
    start = time.monotonic_ns()
    results = c.dispatch({h: [(step.label, "gpu.health", {})] for h in step.hosts})
    end = time.monotonic_ns()
    c.recorder.emit(
        "measure",
        "health.wall",
        mono_ns=end,
        wall=time.time(),
        step=step.label,
        data={"ms": (end - start) / 1e6, "start_ns": start, "end_ns": end, "hosts": len(step.hosts)},
    )
    for host, (result,) in results.items():
        if result is not None and result.status == "ok":
            c.recorder.emit("mark", Op.HEALTH, device=host, step=step.label, data=result.value)
    _raise_failures([r for (r,) in results.values()])
