"""A playbook's sections besides its steps: named fabric configurations, schedules, workload cards, and the job
(its ranks, its fabric, its fabric service). None of them depends on a registered step kind, so the engine and
the fabric logic use them without the playbook's union of steps.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from testbed.config.common import Link, Name, Strict


class Configuration(Strict):
    """A named fabric configuration: host-to-host links and/or raw circuits per switch.

    links: "gpu01:p0 -> gpu02:p0" carries gpu01's p0 transmit to gpu02's p0 receive (one circuit);
    "<->" asks for both directions. circuits: {switch: [[ingress, egress], ...]} for anything else.
    """

    description: str = ""
    links: list[Link] = Field(default_factory=list)
    circuits: dict[Name, list[tuple[int, int]]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _not_empty(self):
        if not self.links and not self.circuits:
            raise ValueError("a configuration needs `links` or `circuits`")
        return self


class Schedule(Strict):
    """A sequence of configurations generated from a pattern over hosts.

    all-to-all: N-1 matchings over `hosts` on `port`; in matching k each host transmits to the host k
    places further on, so over the cycle every ordered pair is connected once (PipSwitch).
    """

    kind: Literal["all-to-all"]
    hosts: list[Name] = Field(min_length=2)
    port: Name = "p0"


class JobFabric(Strict):
    """How the job's ranks are connected optically: a logical topology over the hosts of the ranks, turned
    into circuits through the fibre map. A failover rewires it for the new set of hosts.

    ring: rank r's `port` -> rank r+1 (with `reverse_port`: duplex links port <-> next host's reverse_port).
    torus2d: a `dims: [rows, cols]` torus (rows * cols = the number of ranks), rings along each row on
    `port` (x) and along each column on `y_port` (y); with `reverse_port` and `y_reverse_port` every torus
    link is duplex (four ports per host). Ranks are laid out along a Hamiltonian cycle of the torus
    (boustrophedon: by rows when rows is even, else by columns, so one of them must be even), so the ring
    r -> r+1 of a ring all-reduce runs on torus links (testbed/fabric/jobfabric.py).
    """

    topology: Literal["ring", "torus2d"] = "ring"
    port: Name = Field("p0", description="the host port towards the next rank (torus2d: the next host in its row)")
    verify_light: bool = Field(True, description="check light on every new circuit before (re)launching")
    min_power_dbm: float = Field(-20.0, description="light is verified when every new egress reads above this")
    light_timeout_ms: int = Field(5000, gt=0, description="for the switches' acknowledgement and the light")
    reverse_port: Name | None = Field(
        None,
        description="the host port towards the previous rank: with it each neighbour pair gets a duplex "
        "link (port <-> next host's reverse_port), as TCP between ranks needs; without it a one-way ring on port "
        "(torus2d: towards the previous host in its row)",
    )
    dims: list[Annotated[int, Field(ge=2, le=1024)]] | None = Field(
        None,
        min_length=2,
        max_length=2,
        description="torus2d only: [rows, cols]; rows * cols must equal the number of ranks, and rows or cols "
        "must be even",
    )
    y_port: Name | None = Field(None, description="torus2d only: the host port towards the next host in its column")
    y_reverse_port: Name | None = Field(
        None,
        description="torus2d only, with reverse_port: the host port towards the previous host in its column",
    )


class JobFabricService(Strict):
    """The fabric service a running job's ranks may ask for configurations (docs/fabric_service.md): started
    with the job, its address and token in every rank's environment (TESTBED_FABRIC_SERVICE,
    TESTBED_FABRIC_TOKEN), applied like fabric.apply with these light settings.
    """

    configurations: list[Name] = Field(min_length=1, description="the playbook's configurations a rank may ask for")
    verify_light: bool = True
    min_power_dbm: float = Field(-20.0, description="light is verified when every new egress reads above this")
    timeout_ms: int = Field(5000, gt=0, description="for acknowledgement and light to appear")


class JobTorchFT(Strict):
    """The job trains in TorchFT's loop (testbed-torchft-train, docs/jobs.md "TorchFT"): the controller serves
    TorchFT's lighthouse for each job.start, where the replica groups reach it, with these settings; membership and
    healing are TorchFT's, and a failover's spare is parked as in-job recovery parks it.
    """

    min_replicas: int | None = Field(
        None, ge=1, description="replica groups a quorum needs (default: the job's ranks - 1: one may fail)"
    )
    join_timeout_ms: int = Field(
        500, ge=1, description="how long the lighthouse waits for a group that still heartbeats (a dead one's)"
    )
    quorum_tick_ms: int = Field(50, ge=1, description="how often the lighthouse checks for a quorum")
    heartbeat_timeout_ms: int = Field(2000, ge=1, description="silence after which a group counts as gone")


class Job(Strict):
    """A command started on GPU hosts, one rank per entry of `ranks` (a host may hold several ranks).

    Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (PyTorch's
    env:// rendezvous: rank 0's host, port + world size; after a failover of rank 0, the spare's),
    TESTBED_MASTER_HOST (that host's inventory name), TESTBED_PEERS (host:port of every rank, rank r
    listening on port + r), TESTBED_CHECKPOINT_DIR and CUDA_VISIBLE_DEVICES in its environment (with
    `fabric_service`, TESTBED_FABRIC_SERVICE and TESTBED_FABRIC_TOKEN too).
    With `launcher: torchrun`, one torchrun per host starts that host's ranks and sets PyTorch's variables
    itself (docs/jobs.md).

    `recovery` says how a failover brings the job back: `restart` stops every rank and starts them again (they
    resume from the newest checkpoint); `in-job` keeps the survivors running and swaps a spare, started with the job
    and parked, into the failed rank's slot through a store the controller holds (TESTBED_RECOVERY, TESTBED_STORE,
    TESTBED_SLOT, and TESTBED_SPARE on a spare, in every process's environment; docs/jobs.md, "Recovery").
    """

    command: list[str] = Field(
        min_length=1, description="program and arguments, e.g. [testbed-train, --steps, '100000']"
    )
    ranks: list[Name] = Field(min_length=1, description="the host of each rank, in rank order")
    # Anchored: testbed-train also prints "resumed from step N", which must not count as a training step.
    progress: str = Field(r"^step (\d+)\b", description="regex on a line of the job's output; group 1 is the step")
    checkpoint_dir: str = "checkpoints"
    env: dict[str, str] = Field(default_factory=dict)
    port: int = Field(29500, ge=1024, le=65000)
    fabric: JobFabric | None = Field(None, description="set up by job.start and rewired by failover")
    spares: list[Name] | None = Field(None, description="hosts a failover may use; default the inventory's spares")
    fabric_service: JobFabricService | None = Field(
        None, description="serve the fabric service while the job runs: its ranks ask for configurations"
    )
    launcher: Literal["direct", "torchrun"] = Field(
        "direct",
        description="direct: testbed starts every rank itself; torchrun: one torchrun per host starts that host's "
        "ranks (a host's ranks consecutive in `ranks`, as many on every host; docs/jobs.md)",
    )
    recovery: Literal["restart", "in-job"] = Field(
        "restart",
        description="restart: a failover stops every rank and starts them again from the newest checkpoint; in-job: "
        "the survivors keep running and a spare parked since job.start takes the failed rank's slot (the launcher "
        "direct, one rank per host; docs/jobs.md)",
    )
    torchft: JobTorchFT | None = Field(
        None,
        description="the job trains in TorchFT's loop (testbed-torchft-train): the controller serves TorchFT's "
        "lighthouse for it (needs recovery: in-job, which parks the spare; pip install 'testbed[torchft]')",
    )

    @model_validator(mode="after")
    def _in_job_layout(self):
        """In-job recovery names each process by its host (its slot), and starts every process itself; a TorchFT
        job's spare is parked by it.
        """
        if self.recovery != "in-job":
            if self.torchft is None:
                return self
            where: tuple = ("torchft",)
            problem = (
                "torchft needs recovery: in-job (testbed parks the spare replica group with the job and names it "
                "at the failover through the in-job store)"
            )
            error = PydanticCustomError("value_error", "{problem}", {"problem": problem})
            raise ValidationError.from_exception_data(
                "Job", [InitErrorDetails(type=error, loc=where, input=self.recovery)]
            )
        if self.launcher == "torchrun":
            where = ("launcher",)
            problem = (
                "recovery: in-job needs launcher: direct (testbed starts each rank and each parked spare itself; "
                "torchrun would restart every worker of a host instead)"
            )
        else:
            dup = next((i for i, host in enumerate(self.ranks) if host in self.ranks[:i]), None)
            if dup is None:
                return self
            where = ("ranks", dup)
            problem = (
                f"recovery: in-job needs one rank per host (a host is a rank's slot in the job's membership): "
                f"{self.ranks[dup]} holds rank {self.ranks.index(self.ranks[dup])} and rank {dup}"
            )
        error = PydanticCustomError("value_error", "{problem}", {"problem": problem})
        raise ValidationError.from_exception_data("Job", [InitErrorDetails(type=error, loc=where, input=self.recovery)])

    @model_validator(mode="after")
    def _torchrun_layout(self):
        """torchrun numbers a node's workers one after another, and runs --nproc-per-node of them on every node."""
        if self.launcher != "torchrun":
            return self
        where, problem = None, None
        counts: dict[str, int] = {}
        for i, host in enumerate(self.ranks):
            if host in counts and self.ranks[i - 1] != host:
                where = ("ranks", i)
                problem = (
                    f"with launcher: torchrun a host's ranks must be consecutive (torchrun numbers a node's ranks "
                    f"one after another): {host} holds rank {i} after {self.ranks[i - 1]} holds rank {i - 1}"
                )
                break
            counts[host] = counts.get(host, 0) + 1
        if problem is None and len(set(counts.values())) > 1:
            where = ("ranks",)
            per_host = ", ".join(f"{host} {n}" for host, n in counts.items())
            problem = (
                "with launcher: torchrun every host runs as many ranks (torchrun's --nproc-per-node): "
                f"ranks per host here: {per_host}"
            )
        if problem is None:
            return self
        error = PydanticCustomError("value_error", "{problem}", {"problem": problem})
        raise ValidationError.from_exception_data("Job", [InitErrorDetails(type=error, loc=where, input=self.ranks)])

    @field_validator("progress")
    @classmethod
    def _one_group(cls, value: str) -> str:
        try:
            groups = re.compile(value).groups
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        if groups < 1:
            raise ValueError("needs a group for the step number, e.g. 'step (\\d+)'")
        return value


class Phase(Strict):
    """One phase of a training iteration: its traffic needs `configuration` on the rails, then it computes."""

    name: Name
    configuration: Name
    compute_ms: float = Field(ge=0, le=600_000, description="compute after the phase's communication")
    bytes: int = Field(
        1 << 20,
        ge=8,
        le=1 << 30,
        description="rail.train: what each rank sends to each partner of the phase (its TP partner, its DP group)",
    )
    share: float = Field(
        1.0,
        gt=0,
        le=1,
        description="rail.train with message_bytes: the fraction of the message each rank sends to each partner in "
        "this phase (a ring all-reduce's step moves 1/(2W) of it to each neighbour; a recursive doubling stage all)",
    )


class Workload(Strict):
    """A workload card (as in CCL-Bench and Opus): the phases of one iteration, in order."""

    description: str = ""
    phases: list[Phase] = Field(min_length=1)
    static: Name | None = Field(
        None,
        description="rail.train's static mode: the configuration that carries every phase's traffic at once (a rail "
        "per phase), put in place before the job and never changed",
    )
