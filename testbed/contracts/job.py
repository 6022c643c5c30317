"""What a step may ask of the playbook's job (docs/architecture.md, "The engine's surface"). The engine's
`JobController` is the one implementation; steps see only this. Every change to the job's state (its assignment,
its spares, what runs) is one of these methods, which keeps the controller's invariants; nothing here is a
field a step may set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from testbed.contracts.outcome import Outcome

# (rank seen failing first, its failure_detected ns, the watch's value: what it saw and its evidence)
Detection = tuple[int, int, dict[str, Any]]


class RankView(Protocol):
    """One rank of the job: its index, its host, and which of that host's GPUs it is."""

    @property
    def index(self) -> int:
        """The rank."""

    @property
    def host(self) -> str:
        """The inventory name of the host that runs it."""

    @property
    def local(self) -> int:
        """Its index among the ranks of its host: its GPU."""


class RankFaultSpec(Protocol):
    """What a step that injects a fault on a rank and watches for it says of that fault (fault.detect, failover)."""

    @property
    def label(self) -> str:
        """The step's label (events and errors)."""

    @property
    def kind(self) -> str:
        """The fault kind (testbed.faults.FAULT_KINDS)."""

    @property
    def rank(self) -> int:
        """The rank it hits."""

    @property
    def xid(self) -> int:
        """The Xid a gpu.fail raises."""

    @property
    def heartbeat_s(self) -> float:
        """How often each watcher reports that its rank is alive."""

    @property
    def stall_timeout_s(self) -> float:
        """How long a rank may make no progress before its watcher calls it stalled."""

    @property
    def timeout_s(self) -> float:
        """How long to wait for the failure to be seen."""


class RankFault(Protocol):
    """A fault in place on a rank while every rank is watched."""

    @property
    def target(self) -> RankView:
        """The rank it hit."""

    @property
    def injected_ns(self) -> int:
        """When it took effect (CLOCK_MONOTONIC ns)."""

    def detect(self, on_detect: Callable[[int], None] | None = None) -> Detection:
        """The first failure a watcher saw, once the job is stopped; StepFailed if none within the timeout.
        `on_detect(rank seen)` runs the moment it is seen (a failover starts its rewiring there).
        """


class JobStartSpec(Protocol):
    """What job.start says of the start: its label and how much steady progress to wait for."""

    @property
    def label(self) -> str:
        """The step's label."""

    @property
    def wait_steps(self) -> int:
        """Training steps every rank must show before the job counts as started (0: do not wait)."""

    @property
    def timeout_s(self) -> float:
        """How long to wait for them."""


RankEnv = Callable[[RankView], dict[str, str]]


class JobView(Protocol):
    """The playbook's job as a step drives it: its ranks and their hosts, start and stop, its fabric, its
    faults and failovers, and the jobs a step runs to their end itself.
    """

    @property
    def ranks(self) -> Sequence[RankView]:
        """The ranks of the current assignment, in rank order."""

    @property
    def assignment(self) -> Sequence[str]:
        """hosts[rank]: the host running each rank now (a failover puts a spare in a failed rank's place)."""

    @property
    def handles(self) -> Mapping[int, Mapping[str, Any]]:
        """rank -> its job handle (pid, log name) while it runs."""

    @property
    def progress(self) -> str:
        """The job's progress pattern: a regex whose group 1 is the training step."""

    @property
    def recovery(self) -> str:
        """How a failover brings the job back: `restart` (every rank started again) or `in-job` (a parked spare
        takes the failed slot in the next generation; the survivors never exit).
        """

    def require_running(self, label: str) -> None:
        """StepFailed unless every rank runs (a step that needs the job started)."""

    def start(self, step: JobStartSpec) -> None:
        """job.start: the fabric, the fabric service, every rank, and steady progress on all of them."""

    def stop(self, label: str = "stop job", *, end_service: bool = True, hit: frozenset[str] = frozenset()) -> None:
        """Stop every rank, then (unless `end_service` is False: a relaunch follows) the job's fabric service. A
        stop that fails on a host in `hit` (the one a fault took) is that fault's expected outcome.
        """

    def launch(
        self, label: str, watch: int | None = None, timeout_s: float = 120.0, *, relaunch: bool = False
    ) -> tuple[Mapping[int, Outcome], Outcome | None]:
        """Start every rank at once; each rank's start result and, for rank `watch`, its ready line and first step.
        A `relaunch` resumes from the checkpoints of the launch before.
        """

    def assign(self, hosts: Sequence[str]) -> None:
        """hosts[rank] runs that rank from the next launch on."""

    def choose_spare(self, failed: str) -> str:
        """The spare that takes host `failed`'s place, counted as used (the spare policy spreads the wear)."""

    def apply_fabric(self, label: str, hosts: Sequence[str] | None = None) -> Mapping[str, Outcome]:
        """Make the switches hold the job's topology over the assignment (or `hosts`); each switch's result."""

    def serve_fabric(self, label: str, *, delay_s: float = 0.0, in_place: str | None = None) -> None:
        """Start the job's fabric service (ending the one before) for the next launch's ranks."""

    def close_service(self) -> None:
        """End the job's fabric service, if one runs."""

    def fault_data(self, kind: str, target: RankView) -> dict[str, Any]:
        """The fault's description in its events: what hit which rank (`testbed heal` needs the pid)."""

    def fault(self, step: RankFaultSpec, *, in_place: bool = False) -> AbstractContextManager[RankFault]:
        """The step's fault on its rank, every rank watched; healed and every watcher's outcome recorded when the
        block ends, however it ends. Detecting it stops the job; `in_place` (an in-job failover): the failed rank
        alone, the survivors' watches closed when the job stops.
        """

    def abort_generation(self, reason: str) -> int:
        """In-job recovery: mark the current generation aborted in the job's store (its members leave its process
        group); its number.
        """

    def replace_rank(self, label: str, rank: int, failed: str, spare: str, timeout_s: float) -> tuple[int, Outcome]:
        """In-job recovery: publish the next generation, the spare parked on `spare` in slot `failed` (rank `rank`),
        and follow the spare to its ready line and first step within `timeout_s`; (generation_published ns, the
        spare's wait result: job_ready and first_step marks, `resumed` and `step` in its value). StepFailed naming
        the rank, the spare and the slot if it does not get there.
        """

    def peer_address(self, rank: int, partner: int, port: str, partner_port: str) -> str:
        """host:port where `rank` reaches `partner` over its host port `port` and the partner's `partner_port`: the
        partner's own address on a lab, a relay that carries bytes only along lit circuits in the twin.
        """

    def relay_bytes(self) -> Mapping[str, int] | None:
        """Bytes each of the twin's relays has carried so far (relay address -> bytes); None with no relays."""

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
        playbook's assignment, `prepare()` (the step's first configuration, its fabric service), every rank
        launched with `rank_env`, each rank's lines matching `output` gathered until it exits (within `max_s`),
        and the job stopped however that ends. Returns each rank's lines with their arrival ns; StepFailed naming
        the first rank that did not print its `done rank` line (`work`: what it did not finish, its
        iterations), with its own error line; `kind`: the step kind, for the error when a job already runs.
        """
