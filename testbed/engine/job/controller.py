"""The playbook's job as the engine runs it: its ranks and their hosts (the assignment a failover changes), and
the parts it composes to launch and stop them, rewire their fabric, serve their fabric service, and inject and
see faults. The steps that use a job (job.*, fault.*, failover) are in testbed/steps.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from testbed.config.sections import Job
from testbed.contracts.errors import StepFailed, raise_failures
from testbed.contracts.job import JobStartSpec, JobView, RankEnv, RankFaultSpec, RankView
from testbed.documents.inventory import Inventory
from testbed.engine.device_actor import OpResult
from testbed.engine.job import injection
from testbed.engine.job.detection import Watches
from testbed.engine.job.direct_launcher import DirectLauncher
from testbed.engine.job.fabric import fabric_step, rewire
from testbed.engine.job.injob import InJobRecovery, JobStore
from testbed.engine.job.launcher import Launch, Launcher
from testbed.engine.job.layout import Layout, RelayLink
from testbed.engine.job.ports import free_ports, lab_ports
from testbed.engine.job.ranks import Rank, ranks_of
from testbed.engine.job.torchrun_launcher import TorchrunLauncher
from testbed.events import Op
from testbed.fabric.jobfabric import fabric_links
from testbed.fabric.spares import choose_spare
from testbed.fabric_service.serving import ServedFabric

LAUNCHERS: dict[str, Launcher] = {"direct": DirectLauncher(), "torchrun": TorchrunLauncher()}


# What a job a step runs to its end prints last when a rank finished (hostside/phased.py, hostside/collective.py).
DONE = "done rank "


class JobController(InJobRecovery, JobView):
    """The playbook's job: its ranks, their hosts (the assignment, which a failover changes), the fabric
    that connects them, and the watchers that see them fail. Steps see it as the JobView it declares: a walk of
    the code from a step's call on its JobView arrives here.
    """

    def __init__(
        self,
        coordinator,
        job: Job,
        address_of: Callable[[str], str],
        *,
        management_of: Callable[[str], str] | None = None,
        inventory: Inventory | None = None,
        managed: dict[str, tuple[int, ...]] | None = None,
        seed: int = 0,
        link: RelayLink | None = None,
        commit: Callable[[list], None] | None = None,
        plane: Callable[[], dict] | None = None,
    ) -> None:
        self.c = coordinator  # testbed.engine.coordinator.Coordinator; its dispatcher has a watcher per host
        self.job = job
        self.address_of = address_of  # host -> the address its ranks are reached at (data plane)
        self.management_of = management_of or address_of  # host -> where the control side reaches it
        self.inventory = inventory
        self.managed = managed or {}  # switch -> ports the job's fabric owns
        self.seed = seed
        self._rng = random.Random()  # listen ports of emulated ranks: any free ones, not part of the experiment
        # the twin's data-plane relay, so a rank reaches its neighbour only along circuits the switches hold
        # (None: direct, as on a lab)
        self.link = link
        self.commit = commit  # every link of a launch given: the twin's data plane sets up its routes (--netns)
        self.plane = plane  # the twin's data plane's state (relays and their byte counts); None on a lab
        self.spare_use: dict[str, int] = {}
        self.failovers = 0
        self.launches = 0  # each launch names its ranks' jobs afresh: a log read from its start is this launch's
        self.starts = 0  # the job.starts so far: each has its own checkpoints (Launch.generation)
        self.ports: list[int] = []  # rank -> its listen port, in the last launch
        self._handles: dict[int, dict] = {}  # rank -> job handle (pid, log) while running
        self.launchers: dict[str, dict] = {}  # host -> its torchrun's job handle (launcher: torchrun)
        self.served: ServedFabric | None = None  # the fabric service while the job runs (job.fabric_service)
        # recovery: in-job: the store from job.start to job.stop, the parked spares (host -> job handle), and the
        # survivors' watches of a failover, which end only when their ranks do (closed by job.stop)
        self.store: JobStore | None = None
        self.spares: dict[str, dict] = {}
        self.kept_watches: list[Watches] = []
        self.lighthouse = None  # job.torchft: TorchFT's lighthouse, from job.start to job.stop
        # More of a rank's environment, computed at launch once its listen ports are known (rail.train's routes)
        self.rank_env: Callable[[Rank], dict[str, str]] | None = None
        self.assign(list(job.ranks))

    def assign(self, hosts: Sequence[str]) -> None:
        """hosts[rank] runs that rank (a failover puts a spare in the failed rank's place)."""
        self._assignment = list(hosts)
        self._ranks = ranks_of(self._assignment)

    # JobView's read-only views: a step reads them, only the controller's own methods change them
    @property
    def assignment(self) -> list[str]:
        """hosts[rank]: the host running each rank now."""
        return self._assignment

    @property
    def ranks(self) -> list[Rank]:
        """The ranks of the current assignment, in rank order."""
        return self._ranks

    @property
    def handles(self) -> dict[int, dict]:
        """rank -> its job handle (pid, log name) while it runs."""
        return self._handles

    @property
    def recovery(self) -> str:
        """How a failover brings the job back: `restart` or `in-job` (the playbook's job.recovery)."""
        return self.job.recovery

    @property
    def in_job(self) -> bool:
        return self.job.recovery == "in-job"

    @property
    def progress(self) -> str:
        """The job's progress pattern (group 1: the training step)."""
        return self.job.progress

    def choose_spare(self, failed: str) -> str:
        """The spare that takes host `failed`'s place (testbed/fabric/spares.py), counted as used: the next
        failover's draw and the policy's wear count see it.
        """
        if self.inventory is None:
            raise StepFailed(f"no spare for {failed}: the job was given no inventory to choose one from")
        spare = choose_spare(
            failed,
            self.inventory,
            in_use=set(self.assignment),
            used_count=self.spare_use,
            seed=self.seed + self.failovers,
            # in-job, only a host whose spare is parked can take the slot
            spares=list(self.spares) if self.in_job else self.job.spares,
        )
        self.failovers += 1
        self.spare_use[spare] = self.spare_use.get(spare, 0) + 1
        return spare

    @property
    def launcher(self) -> Launcher:
        return LAUNCHERS[self.job.launcher]

    # --- start / stop ---------------------------------------------------------------------------

    def require_running(self, label: str) -> None:
        if len(self.handles) != len(self.ranks):
            raise StepFailed(f"{label}: the job is not running; add a job.start step before it")

    def start(self, step: JobStartSpec) -> None:
        """job.start: the fabric, every rank, and steady progress on all of them (step: wait_steps, timeout_s)."""
        if self.handles:
            raise StepFailed("job.start: the job is already running; add a job.stop step before starting it again")
        self.assign(list(self.job.ranks))  # every trial starts from the playbook's assignment
        if self.job.fabric is not None:
            self.apply_fabric(step.label)
        if self.job.fabric_service is not None:
            self.serve_fabric(step.label)
        if self.in_job:
            self.open_store()
        if self.job.torchft is not None:
            self.open_lighthouse()
        self.launch(step.label)
        if self.in_job:
            self.park_spares(step.label, step.timeout_s)
        if step.wait_steps > 0:
            self._wait(step.label, self.ranks, self.job.progress, step.wait_steps, step.timeout_s)
        self.c.recorder.emit("mark", Op.JOB_READY, step=step.label, data={"ranks": len(self.ranks)})

    def launch(
        self, label: str, watch: int | None = None, timeout_s: float = 120.0, *, relaunch: bool = False
    ) -> tuple[dict[int, OpResult], OpResult | None]:
        """Start every rank at once; returns each rank's start result (its job_started mark) and, for the
        rank `watch`, the result of following its log to its ready line (job_ready) and on to its first
        training step (first_step).

        The watch follows the start in the same actor program, so it is live within milliseconds of the
        launch, long before the job can print: every line is marked when it arrives, never when a watch
        started late finds it already written. One rank is enough: its ready line follows an all-reduce
        with every rank, and the job's failures reach it too (its peers' deaths end it). Watching every
        rank's ready line made those results, and Ray's traffic for them, arrive just as the first step
        did, and delayed seeing it (the twin's ground truth showed both biases).

        A `relaunch` (a failover's) resumes from the checkpoints of the launch before; any other launch is a
        fresh job whose ranks find no checkpoint (Launch.generation).
        """
        if not relaunch or self.starts == 0:
            self.starts += 1
        if self.served is not None:
            self.served.relaunched()
        layout = Layout.of(
            self.ranks,
            self._listen_ports(),
            self.address_of,
            fabric=self.job.fabric,
            link=self.link,
            rendezvous_of=self.management_of,  # as on a lab: node 0's host address, on the management network
        )
        self.ports = layout.ports  # before the launch: a step's rank_env reads them
        self.launches += 1
        launch = Launch(
            label=label,
            number=self.launches,
            job=self.job,
            layout=layout,
            run_id=str(self.c.recorder.run_id),
            generation=self.starts,
            service_env=self._service_env,
            rank_env=self.rank_env,
            watch=watch,
            timeout_s=timeout_s,
        )
        launcher = self.launcher
        programs = launcher.programs(launch)  # the ranks' environments: every link of the launch is given
        if self.commit is not None:  # and the job fabric's links, one-way rings included
            self.commit(fabric_links(self.job.fabric, self.assignment) if self.job.fabric is not None else [])
        started = launcher.started(launch, self.c.dispatch(programs))
        self.handles.update(started.handles)
        self.launchers.update(started.launchers)
        raise_failures(started.failures)  # the watch's failure is the caller's to raise, after its marks
        return started.results, started.watched

    def _service_env(self, host: str) -> dict[str, str]:
        """What a process on `host` finds the job's services by: the fabric service, the in-job store."""
        env = self.served.env(host) if self.served is not None else {}
        return {**env, **self.store.env(host)} if self.store is not None else env

    def _listen_ports(self) -> list[int]:
        """Where each rank listens, then rank 0's rendezvous port: the playbook's on a lab, free ones in the twin."""
        if self.link is None:
            return lab_ports(self.job.port, len(self.ranks))
        return free_ports(len(self.ranks) + 1, self._rng)

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

    def serve_fabric(self, label: str, *, delay_s: float = 0.0, in_place: str | None = None) -> None:
        """Start the job's fabric service (ending the one before): listening where every host the job may run on
        reaches it (testbed/fabric_service/addresses.py), for this job's ranks only.
        """
        self.close_service()
        # the spares only when a failover may move a rank there (the plan's spares): a host the run never uses
        # need not resolve
        hosts = {h: self.management_of(h) for h in dict.fromkeys([*self.job.ranks, *self.c.plan.spares])}
        on_lab = self.link is None and self.inventory is not None
        self.served = ServedFabric(
            self.c,
            self.c.plan.fabric_service,
            ranks=len(self.ranks),
            delay_s=delay_s,
            label=label,
            in_place=in_place,
            hosts=hosts,
            controller_address=self.inventory.controller_address if self.inventory is not None and on_lab else None,
        )

    def close_service(self) -> None:
        """End the job's fabric service and its in-job store (job.stop, a failed trial, the run's end), and stop
        a parked spare a failed job.start left; nothing if none runs.
        """
        served, self.served = self.served, None
        try:
            if self.spares:
                self._stop("stop spares", frozenset())
        finally:
            self.close_service_store()
            self.close_lighthouse()
            if served is not None:
                served.close()

    def stop(self, label: str = "stop job", *, end_service: bool = True, hit: frozenset[str] = frozenset()) -> None:
        """Stop every rank, then (unless a relaunch follows: a failover) the job's fabric service. A stop that
        fails on a host in `hit` (the one a fault took: off, unreachable) is that fault's expected outcome, recorded
        as it came back but not a failure of the step.
        """
        try:
            self._stop(label, hit)
        finally:
            if end_service:
                self.close_service()  # after the ranks: none of them sees its service go before it stops

    def _stop(self, label: str, hit: frozenset[str]) -> None:
        if not self.handles and not self.launchers and not self.spares:
            return
        programs = self.launcher.stop_programs(label, self.ranks, self.handles, self.launchers)
        for host, handle in self.spares.items():  # in-job: the spares still parked
            programs.setdefault(host, []).append((label, "gpu.stop_job", {"job": handle}))
        self.handles.clear()
        self.launchers.clear()
        self.spares.clear()
        try:
            for host, results in self.c.dispatch(programs).items():
                if host not in hit:
                    raise_failures(results)
        finally:
            kept, self.kept_watches = self.kept_watches, []
            for watches in kept:  # the survivors' watches of an in-job failover end with their ranks, stopped now
                watches.close()

    # --- the fabric ------------------------------------------------------------------------------

    def apply_fabric(self, label: str, hosts: Sequence[str] | None = None) -> dict[str, OpResult]:
        """Make the switches hold the job's topology over the current assignment (or `hosts`: the minimal
        change, on every switch at once); returns each switch's result with its sent / acked / lit marks.
        """
        hosts = self.assignment if hosts is None else list(hosts)
        # only a job with a fabric applies one (start, failover), and every run passes its inventory (run.py)
        assert self.job.fabric is not None and self.inventory is not None
        return rewire(self.c, fabric_step(self.job.fabric, hosts, self.inventory, self.managed, label), label)

    # --- faults and detection ---------------------------------------------------------------------

    def fault_data(self, kind: str, target: RankView) -> dict[str, Any]:
        """The fault's description in its events: what hit which rank (`testbed heal` needs the pid)."""
        return injection.fault_data(kind, target, self.handles)

    def fault(self, step: RankFaultSpec, *, in_place: bool = False) -> AbstractContextManager[injection.RankFault]:
        """The step's fault on its rank, every rank watched (a context manager yielding an injection.RankFault):
        healed, and every watcher's outcome recorded, when the block ends, however it ends. Detecting it stops
        the job (keeping its fabric service for a relaunch); a stop that fails on the host the fault hit is that
        fault's expected outcome. `in_place` (an in-job failover): detecting it stops the failed rank alone, and
        the survivors' watches go on until job.stop.
        """
        self.require_running(step.label)
        host = self.ranks[step.rank].host
        if in_place and self.store is None:
            raise StepFailed(f"{step.label}: an in-job failover needs the job's store: job.recovery: in-job")

        def stop() -> None:  # in-job: the failed rank alone; else the whole job
            if in_place:
                self.end_rank(step.label, step.rank, hit=frozenset({host}))
            else:
                self.stop(label=step.label, end_service=False, hit=frozenset({host}))

        keep = self.kept_watches.append if in_place else None
        return injection.fault_on_rank(self.c, self.ranks, self.handles, self.job.progress, step, stop=stop, keep=keep)

    # --- a job a step runs to its end --------------------------------------------------------------

    def peer_address(self, rank: int, partner: int, port: str, partner_port: str) -> str:
        """host:port where `rank` reaches `partner`: on a lab, the partner's host address (the lab's routing puts
        it on the circuit); in the twin, a relay that carries bytes only while the route's circuits are lit.
        """
        r, s = self.ranks[rank], self.ranks[partner]
        if self.link is None:
            return f"{self.address_of(s.host)}:{self.ports[s.index]}"
        return self.link(r.host, port, s.host, partner_port, self.ports[s.index])

    def relay_bytes(self) -> dict[str, int] | None:
        """Bytes each of the twin's relays has carried forward so far; None on a lab (no data plane to ask)."""
        if self.plane is None:
            return None
        return {r["address"]: r["bytes_forward"] for r in self.plane()["relays"]}

    def run_to_completion(
        self,
        label: str,
        *,
        prepare: Callable[[], None],
        rank_env: RankEnv,
        output: str,
        max_s: float,
        kind: str,
        work: str,
    ) -> dict[int, list[tuple[str, int]]]:
        """A job a step starts itself and follows to its end (rail.train, collective.allreduce): from the
        playbook's assignment, `prepare()`, every rank launched with `rank_env`, each rank's lines that match
        `output` gathered until it exits, and the job (and its fabric service) stopped however that ends.
        StepFailed names the first rank that did not print its `done rank` line, with its own error line.
        """
        if self.handles:
            raise StepFailed(f"{label}: {kind} starts the job itself; stop the running one first (job.stop)")
        self.assign(list(self.job.ranks))  # every trial starts from the playbook's assignment
        try:
            prepare()
            self.rank_env = rank_env
            self.launch(label)
            args = {"pattern": output, "max_s": max_s}
            programs = {r.host: [(label, "gpu.job_output", {"job": self.handles[r.index], **args})] for r in self.ranks}
            outputs = self.c.dispatch(programs)
        finally:
            self.rank_env = None
            self.stop(label)  # whatever still runs, then the fabric service
        results = {r.index: outputs[r.host][0] for r in self.ranks}
        raise_failures(list(results.values()))
        lines = {i: [(line, ns) for line, ns in res.value["lines"]] for i, res in results.items()}
        unfinished = [i for i, ls in lines.items() if not any(line.startswith(DONE) for line, _ in ls)]
        if unfinished:
            i = min(unfinished)
            errors = [line for line, _ in lines[i] if line.startswith("error: ")]
            why = errors[0] if errors else " | ".join(results[i].value["tail"][-3:]) or "no output"
            raise StepFailed(f"{label}: rank {i} ({self.ranks[i].host}) did not finish its {work}: {why}")
        return lines
