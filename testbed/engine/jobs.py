"""The job on the GPU hosts, as the engine runs it: its ranks and their hosts (the assignment a failover
changes), launching and stopping them, the fabric that connects them, and the watchers that see them fail.

Ranks are started and stopped through each host's actor: each rank by testbed itself (`launcher: direct`), or
one torchrun per host that starts the host's ranks (`launcher: torchrun`, docs/jobs.md). Detection runs on a
second actor per host (its own SSH connection, two threads) so that watching never blocks the host's actor:
every rank is watched from before the fault is injected until the failure is seen. Faults are injected and
healed by their kind (testbed/faults), recorded by testbed/faults/recording.py. The steps that use a job (job.*,
fault.*, failover) are in testbed/steps.
"""

from __future__ import annotations

import random
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from testbed.config.sections import Job
from testbed.contracts.errors import StepFailed, raise_failures
from testbed.documents.inventory import Inventory
from testbed.events import Op
from testbed.fabric.circuits import PathError, links_to_circuits
from testbed.fabric.jobfabric import fabric_links, ring_link_ports
from testbed.fabric_service.serving import ServedFabric
from testbed.faults import RankTarget, recording
from testbed.steps.fabric_apply import ApplyStep

WATCH_READY_TIMEOUT_S = 20.0


@dataclass
class Rank:
    index: int
    host: str
    local: int  # index among the ranks of its host: its GPU


# A switch whose connection failed during a rewiring is tried again for this long (then the step fails).
FABRIC_RETRY_S = 3.0
FABRIC_RETRY_BACKOFF_S = 0.05
RETRYABLE = {"DeviceConnectionError", "DeviceTimeout"}
# What gpu.watch_job reports when the host itself shows the fault, not just the process's exit.
HARDWARE_FAILURES = {"gpu_lost", "xid"}
# testbed-train's line once its ring is up: the step it resumed from (the job_ready milestone).
READY = r"^ready rank \d+ world \d+ step (\d+)"


def watcher(host: str) -> str:
    """The name of a host's watcher actor (its second connection, which follows the rank's log)."""
    return f"{host} (watcher)"


class JobController:
    """The playbook's job: its ranks, their hosts (the assignment, which a failover changes), the fabric
    that connects them, and the watchers that see them fail.
    """

    def __init__(
        self,
        coordinator,
        job: Job,
        address_of: Callable[[str], str],
        *,
        inventory: Inventory | None = None,
        managed: dict[str, tuple[int, ...]] | None = None,
        seed: int = 0,
        link: Callable[[str, str, str, str, int], str] | None = None,
        plane: Callable[[], dict] | None = None,
    ) -> None:
        self.c = coordinator  # testbed.engine.coordinator.Coordinator; its dispatcher has a watcher per host
        self.job = job
        self.address_of = address_of  # host -> the address its ranks are reached at (data plane)
        self.inventory = inventory
        self.managed = managed or {}  # switch -> ports the job's fabric owns
        self.seed = seed
        self._rng = random.Random()  # listen ports of emulated ranks: any free ones, not part of the experiment
        # (src host, src port, dst host, dst port, target port) -> address: the twin's data-plane relay, so
        # a rank reaches its neighbour only along circuits the switches hold (None: direct, as on a lab)
        self.link = link
        self.plane = plane  # the twin's data plane's state (relays and their byte counts); None on a lab
        self.spare_use: dict[str, int] = {}
        self.failovers = 0
        self.launches = 0  # each launch names its ranks' jobs afresh: a log read from its start is this launch's
        self.handles: dict[int, dict] = {}  # rank -> job handle (pid, log) while running
        self.launchers: dict[str, dict] = {}  # host -> its torchrun's job handle (launcher: torchrun)
        self.served = None  # the fabric service while the job runs (job.fabric_service), a ServedFabric
        # More of a rank's environment, computed at launch once its listen ports are known (rail.train's routes)
        self.rank_env: Callable[[Rank], dict[str, str]] | None = None
        self.assign(list(job.ranks))

    def assign(self, hosts: list[str]) -> None:
        """hosts[rank] runs that rank (a failover puts a spare in the failed rank's place)."""
        self.assignment = hosts
        seen: dict[str, int] = {}
        self.ranks = []
        for index, host in enumerate(hosts):
            self.ranks.append(Rank(index, host, seen.get(host, 0)))
            seen[host] = seen.get(host, 0) + 1

    # --- start / stop ---------------------------------------------------------------------------

    def require_running(self, label: str) -> None:
        if len(self.handles) != len(self.ranks):
            raise StepFailed(f"{label}: the job is not running; add a job.start step before it")

    def start(self, step) -> None:
        """job.start: the fabric, every rank, and steady progress on all of them (step: wait_steps, timeout_s)."""
        if self.handles:
            raise StepFailed("job.start: the job is already running; add a job.stop step before starting it again")
        self.assign(list(self.job.ranks))  # every trial starts from the playbook's assignment
        if self.job.fabric is not None:
            self.apply_fabric(step.label)
        if self.job.fabric_service is not None:
            self.close_service()
            self.served = ServedFabric(self.c, self.c.plan.fabric_service, ranks=len(self.ranks), label=step.label)
        self.launch(step.label)
        if step.wait_steps > 0:
            self._wait(step.label, self.ranks, self.job.progress, step.wait_steps, step.timeout_s)
        self.c.recorder.emit("mark", Op.JOB_READY, step=step.label, data={"ranks": len(self.ranks)})

    def launch(
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
        did, and delayed seeing it by milliseconds (the twin's ground truth showed both biases).
        """
        if self.served is not None:
            self.served.relaunched()
        *self.ports, master_port = self._listen_ports()  # one port per rank, and rank 0's rendezvous port
        direct = [f"{self.address_of(r.host)}:{self.ports[r.index]}" for r in self.ranks]
        self.launches += 1
        # PyTorch's contract (torch.distributed's env:// rendezvous): rank 0's host serves the rendezvous, so
        # after a failover of rank 0 it is the spare's address the ranks are given.
        master = self.ranks[0].host
        per_host = {host: sum(1 for r in self.ranks if r.host == host) for host in self.assignment}
        if self.job.launcher == "torchrun":
            return self._launch_torchrun(label, watch, timeout_s, master, master_port, direct, per_host)
        programs: dict[str, list] = {}
        for r in self.ranks:
            env = {
                **self.job.env,
                "RANK": str(r.index),
                "WORLD_SIZE": str(len(self.ranks)),
                "LOCAL_RANK": str(r.local),
                "LOCAL_WORLD_SIZE": str(per_host[r.host]),
                "MASTER_ADDR": self.address_of(master),
                "MASTER_PORT": str(master_port),
                "TESTBED_MASTER_HOST": master,
                "TESTBED_PEERS": ",".join(self._peers_of(r, direct)),
                "TESTBED_CHECKPOINT_DIR": self.job.checkpoint_dir,
                **self._service_env(),
                **(self.rank_env(r) if self.rank_env is not None else {}),
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
        raise_failures(list(started.values()))  # the watch's failure is the caller's to raise, after its marks
        return started, watched

    def _launch_torchrun(
        self,
        label: str,
        watch: int | None,
        timeout_s: float,
        master: str,
        master_port: int,
        direct: list[str],
        per_host: dict[str, int],
    ) -> tuple[dict[int, object], object | None]:
        """launch() with `launcher: torchrun`: one torchrun per host, all at once. Node i is the i-th host in
        rank order, so rank 0's host is node 0 and hosts the rendezvous (torchrun's static backend: node ranks
        are the --node-rank given, the store is node 0's at the endpoint, and MASTER_ADDR / MASTER_PORT are
        that endpoint). Every launch has a rendezvous id of its own. The ranks get torchrun's variables from
        torchrun, and testbed's (TESTBED_PEERS, ...) through torchrun's environment, which its workers inherit.

        A rank is watched through its host's torchrun (the process the host started, which exits when a worker
        fails and whose process group a fault or a stop signals) and the rank's own output: the launcher's
        log when the host runs one rank, whose output is torchrun's, else the file the rank writes itself
        (TESTBED_RANK_LOG; testbed-train does).
        """
        nodes = list(dict.fromkeys(r.host for r in self.ranks))
        nproc = per_host[master]  # the same on every host (the playbook's check)
        if watch is not None and nproc > 1:
            raise StepFailed(
                f"{label}: watching a rank's relaunch under torchrun needs one rank per host (here {nproc})"
            )
        endpoint = f"{self.address_of(master)}:{master_port}"
        rdzv_id = f"{re.sub(r'[^A-Za-z0-9_.-]', '-', str(self.c.recorder.run_id))}-{self.launches}"
        programs: dict[str, list] = {}
        for i, host in enumerate(nodes):
            env = {
                **self.job.env,
                "TESTBED_MASTER_HOST": master,
                "TESTBED_PEERS": ",".join(self._host_peers(host, direct)),
                "TESTBED_CHECKPOINT_DIR": self.job.checkpoint_dir,
                **self._service_env(),
            }
            if self.rank_env is not None:  # one environment for the host's ranks: each rank's, merged
                for r in self.ranks:
                    if r.host == host:
                        env.update(self.rank_env(r))
            if nproc > 1:
                env["TESTBED_RANK_LOG"] = f"rank{{rank}}.{self.launches}.log"  # in its workdir
            command = [
                "torchrun",
                *("--nnodes", str(len(nodes)), "--node-rank", str(i), "--nproc-per-node", str(nproc)),
                *("--rdzv-backend", "static", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id),
                *("--max-restarts", "0", "--no-python"),
                *self.job.command,
            ]
            name = f"node{i}.{self.launches}"
            args = {"command": command, "name": name, "gpus": list(range(nproc)), "env": env}
            # a node slot keeps its directory across launches (a spare takes the slot of the host it replaces)
            programs[host] = [(label, "gpu.start_job", {**args, "workdir": f"testbed-jobs/node{i}"})]
            if watch is not None and host == self.ranks[watch].host:
                wait = {"job": name, "progress": self.job.progress, "ready": READY}
                wait.update(min_step=0, max_s=timeout_s, mark=Op.FIRST_STEP)
                programs[host].append((label, "gpu.wait_step", wait))
        started, watched = {}, None
        for host, results in self.c.dispatch(programs).items():
            launched = results[0]
            if launched is not None and launched.status == "ok":
                self.launchers[host] = launched.value
            for r in self.ranks:
                if r.host == host:
                    started[r.index] = launched
                    if host in self.launchers:
                        self.handles[r.index] = self._rank_handle(r, self.launchers[host], nproc)
            if watch is not None and host == self.ranks[watch].host:
                watched = results[1]
        raise_failures(list({id(v): v for v in started.values()}.values()))  # each launcher's once
        return started, watched

    def _rank_handle(self, r: Rank, launcher: dict, nproc: int) -> dict:
        if nproc == 1:
            return dict(launcher)
        log = f"{launcher['workdir']}/rank{r.index}.{self.launches}.log"
        return {**launcher, "name": f"rank{r.index}.{self.launches}", "log": log}

    def _host_peers(self, host: str, direct: list[str]) -> list[str]:
        """TESTBED_PEERS for every rank on `host` at once (torchrun gives its workers one environment): each
        of its ranks' own view merged. A rank uses only its own entry and its neighbour's, and the neighbour
        it reaches through a relay runs on another host, so the views do not conflict.
        """
        peers = list(direct)
        for r in self.ranks:
            if r.host == host:
                nxt = (r.index + 1) % len(self.ranks)
                peers[nxt] = self._peers_of(r, direct)[nxt]
        return peers

    def _listen_ports(self) -> list[int]:
        """Where each rank listens, then rank 0's rendezvous port (MASTER_PORT). On a lab, the playbook's port +
        rank on each host, and port + world size. In the twin every rank runs on this machine, so each launch
        takes free ports: a rank left over from an earlier run (its twin killed) cannot make this launch fail
        to bind. They are taken below the kernel's ephemeral range:
        a port from bind(0) is free only until the probe closes, and the twin's relays, which bind(0) too,
        could take it first (a rank's neighbour would then be a relay back to itself).
        """
        if self.link is None:
            return [self.job.port + r.index for r in self.ranks] + [self.job.port + len(self.ranks)]
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
            if len(chosen) == len(self.ranks) + 1:
                return chosen
        raise StepFailed(f"no {len(self.ranks) + 1} free ports below {low} on 127.0.0.1 for the emulated ranks")

    def _peers_of(self, r: Rank, direct: list[str]) -> list[str]:
        """Rank r's view of every rank's address. Through the twin's data plane, the neighbour it connects to
        (the next rank) is reached by a relay that carries traffic only while the duplex link between the
        two hosts is lit, so a broken or wrongly rewired fabric really stops the job.
        """
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
            raise_failures(results)
            for r, result in zip([r for r in ranks if r.host == host], results, strict=True):
                out[r.index] = result
        return out

    def _service_env(self) -> dict[str, str]:
        return self.served.env() if self.served is not None else {}

    def close_service(self) -> None:
        """End the job's fabric service (job.stop, a failed trial, the run's end); nothing if none runs."""
        served, self.served = self.served, None
        if served is not None:
            served.close()

    def stop(self, label: str = "stop job", *, end_service: bool = True) -> None:
        """Stop every rank, then (unless a relaunch follows: a failover) the job's fabric service."""
        try:
            self._stop(label)
        finally:
            if end_service:
                self.close_service()  # after the ranks: none of them sees its service go before it stops

    def _stop(self, label: str) -> None:
        if not self.handles and not self.launchers:
            return
        programs: dict[str, list] = {}
        if self.job.launcher == "torchrun":  # each host's torchrun, which stops its workers (SIGTERM)
            for host, handle in self.launchers.items():
                programs[host] = [(label, "gpu.stop_job", {"job": handle})]
        else:
            for r in self.ranks:
                if r.index in self.handles:
                    programs.setdefault(r.host, []).append((label, "gpu.stop_job", {"job": self.handles[r.index]}))
        self.handles.clear()
        self.launchers.clear()
        for results in self.c.dispatch(programs).values():
            raise_failures(results)

    def apply_fabric(self, label: str, hosts: list[str] | None = None) -> dict:
        """Make the switches hold the job's topology over the current assignment (the minimal change, on
        every switch at once); returns each switch's result with its sent / acked / lit marks.
        """
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
        after a lost acknowledgement sends only what is still missing. Every attempt is in the history.
        """
        calls = step.calls(self.c)
        deadline = time.monotonic() + FABRIC_RETRY_S
        done: dict = {}
        while True:
            results = {d: r[0] for d, r in self.c.dispatch({d: [(label, *calls[d])] for d in calls}).items()}
            done.update(results)
            failed = {d: r for d, r in results.items() if r is None or r.status != "ok"}
            retry = all(r is not None and r.error_type in RETRYABLE for r in failed.values())
            if not failed or not retry or time.monotonic() >= deadline:
                raise_failures(done.values())
                return done
            calls = {d: calls[d] for d in failed}
            time.sleep(FABRIC_RETRY_BACKOFF_S)  # give the connection a moment to come back: recovery, not sync

    # --- faults and detection ---------------------------------------------------------------------

    def fault_data(self, kind: str, target) -> dict:
        """The fault's description in its events: what hit which rank (`testbed heal` needs the pid)."""
        return {
            "fault": f"{kind}@rank{target.index}",
            "kind": kind,
            "rank": target.index,
            "host": target.host,
            "gpu": target.local,
            "pid": (self.handles.get(target.index) or {}).get("pid"),
        }

    def _target(self, kind_step, r: Rank, job: dict) -> RankTarget:
        params = {"xid": kind_step.xid}
        return RankTarget(r.index, r.host, r.local, job, params)

    def heal(self, step, target: Rank, job: dict, data: dict) -> None:
        recording.heal(self.c, step.kind, self._target(step, target, job), step.label, target.host, data)

    def inject_and_detect(self, step, *, heal: bool, on_detect: Callable[[int], None] | None = None):
        """Watch every rank, inject the fault once all are watching, wait for the first detection and stop
        the job (so every other watch ends). Heals the fault at once when `heal`; otherwise the caller heals.
        Returns (the rank hit, injection ns, the first detection (rank, ns, value) or None, its job handle).
        """
        self.require_running(step.label)
        target = self.ranks[step.rank]
        dispatcher = self.c.dispatcher
        watches = {}
        for r in self.ranks:
            kwargs = {
                "job": self.handles[r.index],
                "heartbeat_s": step.heartbeat_s,
                "stall_timeout_s": step.stall_timeout_s,
                "progress": self.job.progress,
                "max_s": step.timeout_s,
            }
            self.c.recorder.emit("invoke", "gpu.watch_job", device=r.host, step=step.label, data={"rank": r.index})
            watches[r.index] = dispatcher.call(watcher(r.host), "run_program", [("gpu.watch_job", kwargs)])
        watching = [
            dispatcher.call(watcher(r.host), "wait_mark", "watching", WATCH_READY_TIMEOUT_S) for r in self.ranks
        ]
        ready = [w.result() for w in watching]
        data = self.fault_data(step.kind, target)
        job = self.handles[target.index]
        injected = recording.inject(
            self.c,
            step.kind,
            self._target(step, target, job),
            step.label,
            target.host,
            {**data, "watching": all(ready)},
        ).at_ns
        try:
            first = self._first_detection(watches, step, on_detect)
        finally:
            if heal:
                self.heal(step, target, job, data)
        if first is None:
            if not heal:
                self.heal(step, target, job, data)
            raise StepFailed(
                f"{step.kind} on rank {target.index} ({target.host}) was not detected within {step.timeout_s:g} s"
            )
        return target, injected, first, job

    def _first_detection(self, watches: dict, step, on_detect: Callable[[int], None] | None = None):
        """Wait for the first watcher to see a failure, stop the job (so every other watch ends), then record
        every watcher's outcome. Returns (rank, detection time, its value) or None. `on_detect(rank)` runs as
        soon as a failure is seen, before the job is torn down (a failover starts rewiring then).
        """
        dispatcher = self.c.dispatcher
        limit = step.timeout_s + WATCH_READY_TIMEOUT_S
        if on_detect is not None:
            # React to the milestone itself, not to the procedure's return: after marking failure_detected
            # a watcher still takes a health probe for the evidence, which the failover need not wait for.
            # (Once the job is stopped every watcher marks an exit, so none of these waits lingers.)
            seen = {
                dispatcher.call(watcher(self.ranks[rank].host), "wait_mark", Op.FAILURE_DETECTED, limit): rank
                for rank in watches
            }
            pending = list(seen)
            while pending:
                done, pending = dispatcher.wait(pending, timeout=limit)
                if not done:
                    break
                if done[0].result():
                    on_detect(seen[done[0]])
                    break
        dispatcher.wait(list(watches.values()), timeout=limit)
        self.stop(label=step.label, end_service=False)  # a failover relaunches the ranks with the same service
        detections = []
        for rank, pending_watch in watches.items():
            (result,) = pending_watch.result()  # a watcher that died raises ActorLost: the trial fails as info
            self.c.record(self.ranks[rank].host, step.label, "gpu.watch_job", result)
            mark = result.marks.get(Op.FAILURE_DETECTED) if result.status == "ok" else None
            if mark and (result.value or {}).get("detected"):
                detections.append((rank, mark[0], result.value))
        return failed_rank(detections)


def failed_rank(detections: list[tuple[int, int, dict]]) -> tuple[int, int, dict] | None:
    """Which rank failed, from every watcher's (rank, failure_detected ns, watch_job value): the earliest
    with hardware evidence (a GPU lost, a new Xid), else the earliest. When a rank dies its peers exit too,
    as their ring breaks, and a peer's watcher can see its own rank's exit first: its `tail --pid` checks
    right after the peer's last words, the failed rank's only at its next heartbeat.
    """
    evidence = [d for d in detections if d[2].get("detected") in HARDWARE_FAILURES]
    return min(evidence or detections, key=lambda d: d[1], default=None)


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (bind(0) hands out ports from there up)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default
