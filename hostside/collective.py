"""testbed-train's collective mode: an all-reduce of a message of each given size, run by a real algorithm over
the fabric's circuits (docs/collective.md; testbed's collective.allreduce step writes TESTBED_COLLECTIVE).

- ring: reduce-scatter then all-gather over a duplex ring that never changes, 2(W-1) steps; at each the rank
  sends one W-th of the message to the next rank and receives one from the one before;
- rd: recursive doubling over W = 2^n ranks, n stages; at stage k the rank exchanges its whole partial sum with
  rank xor 2^k. Each stage has a configuration of its own, which the rank asks the job's fabric service to
  `setup` before the stage's traffic (the change starts once every rank asked; the rank waits for it).

Every byte goes through hostside/phased.py's PhaseNet: fresh TCP connections while the circuit is dark
(on the twin, a data-plane relay carries bytes only over lit circuits), an acknowledgement per message.

Each rank contributes x_r[i] = i + r * n + seq (n elements, seq numbering the all-reduces): integer-valued, so
every sum is exact whatever the order of additions, and the result every rank must hold is known in closed form,
sum_r x_r[i] = W * i + n * W (W - 1) / 2 + W * seq. A rank whose result differs exits with status 3.

Per all-reduce the rank prints `allreduce ALG SIZE ms T reconfig_ms X` (`warmup ...` for the warm-up ones): T
from its start to the rank holding the result, X the part of it spent waiting for the fabric service, both on the
rank's clock. At the end `done rank R allreduces N checksum C`, C the sum of every result's elements, which the
run compares across ranks.

TESTBED_COLLECTIVE (JSON): {"algorithm": "ring"|"rd", "sizes": [bytes, ...], "repetitions": N, "warmup": M,
 "stages": [{"config": NAME, "to": [[rank, "host:port"]], "from": [rank]}, ...]} (ring: one stage, to the next
rank, from the one before; rd: stage k, to and from rank xor 2^k).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

from hostside.phased import Phase, PhaseError, PhaseNet

ALGORITHMS = ("ring", "rd")
KEYS = {"algorithm", "sizes", "repetitions", "warmup", "stages"}
STAGE_KEYS = {"config", "to", "from"}
MAX_BYTES = 1 << 30


class CollectiveError(RuntimeError):
    pass


@dataclass(frozen=True)
class Stage:
    config: str
    to: tuple[tuple[int, tuple[str, int]], ...]  # (partner rank, where to reach it)
    sources: tuple[int, ...]  # the ranks that send to this one


@dataclass(frozen=True)
class CollectiveSpec:
    algorithm: str
    sizes: tuple[int, ...]
    repetitions: int
    warmup: int
    stages: tuple[Stage, ...]


def parse_spec(text: str) -> CollectiveSpec:
    """TESTBED_COLLECTIVE -> CollectiveSpec; anything malformed is a ValueError that names the problem."""
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError, TypeError) as exc:
        raise ValueError(f"TESTBED_COLLECTIVE is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"TESTBED_COLLECTIVE is not a JSON object: {type(raw).__name__}")
    _keys(raw, KEYS, "TESTBED_COLLECTIVE")
    algorithm = raw["algorithm"]
    if algorithm not in ALGORITHMS:
        raise ValueError(f"TESTBED_COLLECTIVE: algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    sizes = raw["sizes"]
    if not isinstance(sizes, list) or not sizes:
        raise ValueError("TESTBED_COLLECTIVE: sizes is not a non-empty list")
    stages = raw["stages"]
    if not isinstance(stages, list) or not stages:
        raise ValueError("TESTBED_COLLECTIVE: stages is not a non-empty list")
    if algorithm == "ring" and len(stages) != 1:
        raise ValueError(f"TESTBED_COLLECTIVE: algorithm ring runs over one configuration, not {len(stages)} stages")
    return CollectiveSpec(
        algorithm,
        tuple(_int(s, f"sizes[{i}]", 8, MAX_BYTES) for i, s in enumerate(sizes)),
        _int(raw["repetitions"], "repetitions", 1, 100_000),
        _int(raw["warmup"], "warmup", 0, 1000),
        tuple(_stage(s, k) for k, s in enumerate(stages)),
    )


def _keys(raw: dict, keys: set[str], where: str) -> None:
    missing, extra = keys - raw.keys(), raw.keys() - keys
    if missing:
        raise ValueError(f"{where}: missing {', '.join(sorted(missing))}")
    if extra:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(map(str, extra)))}")


def _int(value, what: str, low: int, high: int) -> int:
    # bool is an int to Python, and a float (1e3, Infinity) is no count of bytes or ranks
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"TESTBED_COLLECTIVE: {what} = {value!r} is not a whole number in [{low}, {high}]")
    return value


def _stage(raw, k: int) -> Stage:
    where = f"stages[{k}]"
    if not isinstance(raw, dict):
        raise ValueError(f"TESTBED_COLLECTIVE: {where} is not an object")
    _keys(raw, STAGE_KEYS, f"TESTBED_COLLECTIVE: {where}")
    config, to, sources = raw["config"], raw["to"], raw["from"]
    if not isinstance(config, str) or not config:
        raise ValueError(f"TESTBED_COLLECTIVE: {where}.config is not a configuration's name")
    if not isinstance(to, list) or len(to) != 1 or not isinstance(to[0], list) or len(to[0]) != 2:
        raise ValueError(f"TESTBED_COLLECTIVE: {where}.to is not one [rank, 'host:port'] (one partner per stage)")
    if not isinstance(sources, list) or len(sources) != 1:
        raise ValueError(f"TESTBED_COLLECTIVE: {where}.from is not one rank (one partner per stage)")
    partner, address = to[0]
    partner = _int(partner, f"{where}.to's rank", 0, 1 << 20)
    if not isinstance(address, str) or address.count(":") < 1:
        raise ValueError(f"TESTBED_COLLECTIVE: {where}.to's address {address!r} is not host:port")
    host, _, port = address.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"TESTBED_COLLECTIVE: {where}.to's address {address!r} has no port in [1, 65535]")
    source = _int(sources[0], f"{where}.from", 0, 1 << 20)
    return Stage(config, ((partner, (host or "127.0.0.1", int(port))),), (source,))


def contribution(rank: int, n: int, seq: int) -> np.ndarray:
    """What `rank` adds into all-reduce `seq`: distinct per rank, element and all-reduce, and integer-valued."""
    return np.arange(n, dtype=np.float64) + float(rank * n + seq)


def expected(world: int, n: int, seq: int) -> np.ndarray:
    return np.arange(n, dtype=np.float64) * world + float(n * world * (world - 1) // 2 + world * seq)


class Collective:
    """One rank's all-reduces over its PhaseNet; `fabric` (a FabricClient, or None) is asked before rd's stages."""

    def __init__(self, spec: CollectiveSpec, rank: int, world: int, net: PhaseNet, fabric) -> None:
        self.spec, self.rank, self.world, self.net, self.fabric = spec, rank, world, net, fabric
        # PhaseNet's unit of traffic: the stage's partner and source (sizes vary per message, so nbytes is 0)
        self.phases = [Phase(f"stage{k}", s.config, 0.0, 0, s.to, s.sources) for k, s in enumerate(spec.stages)]
        self.waited = 0.0  # seconds spent in the fabric service's setup during the current all-reduce
        if spec.algorithm == "rd":
            if world < 2 or world & (world - 1) or len(spec.stages) != world.bit_length() - 1:
                raise CollectiveError(
                    f"rank {rank}: recursive doubling needs 2^n ranks and n stages; {world} ranks, "
                    f"{len(spec.stages)} stages"
                )
            for k, phase in enumerate(self.phases):
                if phase.to[0][0] != rank ^ (1 << k) or phase.sources != (rank ^ (1 << k),):
                    raise CollectiveError(f"rank {rank}: stage {k} does not pair it with rank {rank ^ (1 << k)}")
        elif world > 1:
            right, left = (rank + 1) % world, (rank - 1) % world
            if self.phases[0].to[0][0] != right or self.phases[0].sources != (left,):
                raise CollectiveError(f"rank {rank}: the ring must send to rank {right} and hear from rank {left}")

    def allreduce(self, vector: np.ndarray, seq: int) -> np.ndarray:
        self.waited = 0.0
        if self.world == 1:
            return vector.copy()
        return self._rd(vector, seq) if self.spec.algorithm == "rd" else self._ring(vector, seq)

    def _rd(self, vector: np.ndarray, seq: int) -> np.ndarray:
        acc = vector
        for k, phase in enumerate(self.phases):
            if self.fabric is not None:
                asked = time.monotonic()
                self._setup(phase.config)
                self.waited += time.monotonic() - asked
            got = self.net.exchange(seq, k, phase, acc)
            acc = acc + self._one(got, phase, acc.size, seq)
        return acc

    def _ring(self, vector: np.ndarray, seq: int) -> np.ndarray:
        w, r, phase = self.world, self.rank, self.phases[0]
        chunks = [c.copy() for c in np.array_split(vector, w)]
        for step in range(2 * (w - 1)):
            if step < w - 1:  # reduce-scatter: add the chunk from the left into ours
                send, receive = (r - step) % w, (r - step - 1) % w
            else:  # all-gather: the reduced chunks go round
                s = step - (w - 1)
                send, receive = (r + 1 - s) % w, (r - s) % w
            got = self._one(self.net.exchange(seq, step, phase, chunks[send]), phase, chunks[receive].size, seq)
            chunks[receive] = chunks[receive] + got if step < w - 1 else got.copy()
        return np.concatenate(chunks)

    def _one(self, got: dict[int, np.ndarray], phase: Phase, n: int, seq: int) -> np.ndarray:
        (vector,) = got.values()
        if vector.size != n:
            raise CollectiveError(
                f"rank {self.rank}: all-reduce {seq}: {vector.size} elements from rank {phase.sources[0]} over "
                f"{phase.config}, {n} expected"
            )
        return vector

    def _setup(self, config: str) -> None:
        from hostside.fabric_client import FabricError

        try:
            self.fabric.setup(config)
        except FabricError as exc:
            raise CollectiveError(f"rank {self.rank}: the fabric service did not set up {config}: {exc}") from exc


def run(spec: CollectiveSpec, rank: int, world: int, listen: tuple[str, int], timeout: float, fabric, say) -> None:
    """Every size's warm-up and measured all-reduces, checked. Raises CollectiveError or PhaseError."""
    net = PhaseNet(rank, listen, timeout)
    seq, checksum = 0, 0
    try:
        collective = Collective(spec, rank, world, net, fabric)
        for size in spec.sizes:
            n = max(1, size // 8)
            for rep in range(spec.warmup + spec.repetitions):
                seq += 1
                vector = contribution(rank, n, seq)
                start = time.monotonic()
                result = collective.allreduce(vector, seq)
                ms = (time.monotonic() - start) * 1000
                if not np.array_equal(result, expected(world, n, seq)):
                    wrong = int(np.argmax(result != expected(world, n, seq)))
                    raise CollectiveError(
                        f"rank {rank}: all-reduce {seq} ({spec.algorithm}, {size} B) ended with {result[wrong]!r} at "
                        f"element {wrong}, not {expected(world, n, seq)[wrong]!r}"
                    )
                checksum += int(result.sum())
                what = "warmup" if rep < spec.warmup else "allreduce"
                say(f"{what} {spec.algorithm} {size} ms {ms:.3f} reconfig_ms {collective.waited * 1000:.3f}")
    finally:
        net.close()
    say(f"done rank {rank} allreduces {seq} checksum {checksum}")


__all__ = ["CollectiveError", "CollectiveSpec", "PhaseError", "parse_spec", "run"]
