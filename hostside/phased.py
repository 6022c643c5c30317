"""testbed-train's phased mode: iterations of phases that move real bytes over each phase's own circuits.

An iteration is a workload card's phases in order (docs/rail_train.md). A phase is its traffic, then its compute:
- the traffic: the rank sends `bytes` to each of the phase's partners and receives theirs. A tensor-parallel
  phase exchanges with its TP partner; a data-parallel phase all-reduces across its DP group (each partner's
  vector is summed into the rank's own, so every member ends with the group's sum, checked). Each partner is
  reached at the address its route gives: on the twin, a data-plane relay that carries bytes only while the
  circuit between the two hosts' ports is lit, so a phase whose circuit is not up really stalls (the relay resets
  the connection; the rank connects again every RETRY_S) and a wrong configuration breaks the job after
  --timeout seconds;
- the compute: a pause of `compute_ms`.
The mode says when the rank asks the job's fabric service for a phase's configuration:
- static: never (the run put every phase's circuits in place before the job, a rail per phase);
- on-demand: `setup` before each phase's traffic; the rank waits for the change;
- provisioning: `prepare` of the next phase's configuration as soon as this phase's traffic is done (the
  change runs behind the compute), then `setup` before the next phase's traffic, which waits only for what the
  compute did not hide.

Each message is a header (iteration, phase, sender, payload bytes) and a float64 vector; the receiver answers
one byte once it has it all, and the sender counts a message delivered only then, so a message whose connection is
cut mid-way is sent again whole, on a new connection. A rank keeps its connection to each address from phase to
phase, as a communication library keeps its channels: a phase over the same circuit as the one before opens none
(on the twin, a reconfiguration that darkens a path cuts its connections, and the next phase opens new ones).
The rank prints `step N ms T stall_ms S` per iteration (its own clock) and, at the end,
`sent PHASE PARTNER BYTES written W` per phase and partner: BYTES, the messages (headers included) its partner
acknowledged, which is what the twin's data plane carries for it; W, every byte it handed to the kernel, with
what it wrote into connections the data plane reset because the circuit was not up (a stalled phase).

The run passes the phases in TESTBED_RAIL (JSON, written by testbed's rail.train step):
{"mode": ..., "iterations": N, "phases": [{"name", "config", "compute_ms", "bytes",
 "to": [[rank, "host:port"], ...], "from": [rank, ...]}, ...]}.
"""

from __future__ import annotations

import json
import selectors
import socket
import struct
import time
from dataclasses import dataclass
from typing import cast

import numpy as np

MESSAGE = struct.Struct("!IIIQ")  # iteration, phase, sender rank, payload bytes
ACK = b"\x06"
RETRY_S = 0.002  # between attempts to reach a partner whose circuit is not up yet
MODES = ("static", "on-demand", "provisioning")


class PhaseError(RuntimeError):
    pass


def tensor(rank: int, iteration: int, phase: int, n: int) -> np.ndarray:
    """What `rank` sends in a phase: distinct per sender, iteration and phase, so a receiver can check it."""
    return np.arange(n, dtype=np.float64) + float(rank * 1_000_003 + iteration * 101 + phase)


@dataclass(frozen=True)
class Phase:
    name: str
    config: str
    compute_s: float
    nbytes: int
    to: tuple[tuple[int, tuple[str, int]], ...]  # (partner rank, where to reach it)
    sources: tuple[int, ...]  # the ranks that send to this one


@dataclass(frozen=True)
class RailSpec:
    mode: str
    iterations: int
    phases: tuple[Phase, ...]


def parse_spec(text: str) -> RailSpec:
    """TESTBED_RAIL -> RailSpec; a ValueError names what is wrong."""
    try:
        raw = json.loads(text)
        mode = raw["mode"]
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        phases = []
        for p in raw["phases"]:
            to = []
            for rank, address in p["to"]:
                host, _, port = str(address).rpartition(":")
                to.append((int(rank), (host or "127.0.0.1", int(port))))
            phases.append(
                Phase(
                    str(p["name"]),
                    str(p["config"]),
                    float(p["compute_ms"]) / 1000,
                    int(p["bytes"]),
                    tuple(to),
                    tuple(int(r) for r in p["from"]),
                )
            )
        if not phases:
            raise ValueError("no phases")
        return RailSpec(mode, int(raw["iterations"]), tuple(phases))
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise ValueError(f"TESTBED_RAIL is not a phased workload: {exc}") from None


class _Send:
    """One message to one partner, on the connection kept to that address (a new one after a reset), sent again
    whole until the partner acknowledges it.
    """

    def __init__(self, net: PhaseNet, partner: int, address: tuple[str, int], message: bytes) -> None:
        self.net, self.partner, self.address, self.message = net, partner, address, message
        self.sock: socket.socket | None = None
        self.offset = 0
        self.retry_at = 0.0
        self.done = False
        self.written = 0  # every byte handed to the kernel, resends included
        self.attempts = 0

    def start(self) -> None:
        """Send on the connection kept from an earlier phase, or open one."""
        self.attempts += 1
        self.offset = 0
        sock = self.net.kept.pop(self.address, None)
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            try:
                sock.connect(self.address)
            except BlockingIOError:
                pass
            except OSError:
                sock.close()
                self.retry_at = time.monotonic() + RETRY_S
                return
        self.sock = sock
        self.net.sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, self)

    def drop(self) -> None:
        if self.sock is not None:
            self.net.sel.unregister(self.sock)
            self.sock.close()
            self.sock = None
        self.retry_at = time.monotonic() + RETRY_S

    def event(self, mask: int) -> None:
        assert self.sock is not None
        try:
            if mask & selectors.EVENT_WRITE and self.offset < len(self.message):
                n = self.sock.send(self.message[self.offset : self.offset + (1 << 20)])
                self.offset += n
                self.written += n
                if self.offset >= len(self.message):
                    self.net.sel.modify(self.sock, selectors.EVENT_READ, self)
            if mask & selectors.EVENT_READ:
                got = self.sock.recv(1)
                if got == ACK:
                    self.done = True
                    self.net.sel.unregister(self.sock)
                    self.net.kept[self.address] = self.sock  # for this partner's next message
                    self.sock = None
                elif not got:
                    self.drop()  # closed before the acknowledgement: the message may be lost, send it again
        except OSError:  # a reset: the path is dark (not up yet, or cut); connect again after RETRY_S
            self.drop()


class _Receive:
    """A partner's connection to this rank: messages one after another, each acknowledged once whole."""

    def __init__(self, net: PhaseNet, sock: socket.socket) -> None:
        self.net, self.sock = net, sock
        self.buf = bytearray()
        self.need = MESSAGE.size

    def event(self) -> None:
        try:
            chunk = self.sock.recv(max(65536, self.need - len(self.buf)))
        except OSError:
            chunk = b""
        if not chunk:  # closed, or cut mid-message: the sender sends the message again on a new connection
            self.net.sel.unregister(self.sock)
            self.sock.close()
            return
        self.buf += chunk
        while True:
            if len(self.buf) >= MESSAGE.size and self.need == MESSAGE.size:
                self.need = MESSAGE.size + MESSAGE.unpack(self.buf[: MESSAGE.size])[3]
            if len(self.buf) < self.need:
                return
            iteration, phase, sender, _ = MESSAGE.unpack(self.buf[: MESSAGE.size])
            self.net.inbox[(iteration, phase, sender)] = bytes(self.buf[MESSAGE.size : self.need])
            del self.buf[: self.need]
            self.need = MESSAGE.size
            try:
                self.sock.send(ACK)  # one byte into an empty send buffer: never blocks
            except OSError:
                pass  # the ack was lost: the sender sends again, and the duplicate replaces the same entry


class PhaseNet:
    """This rank's side of every phase's traffic: a listener for its partners, and connections out to them that
    are kept from phase to phase (as a communication library keeps its channels), opened again after a reset.
    """

    def __init__(self, rank: int, listen: tuple[str, int], timeout: float) -> None:
        self.rank, self.timeout = rank, timeout
        self.listener = socket.create_server(listen, backlog=128)
        self.listener.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.kept: dict[tuple[str, int], socket.socket] = {}  # address -> an idle connection to it
        self.inbox: dict[tuple[int, int, int], bytes] = {}  # (iteration, phase, sender) -> its payload
        self.sent: dict[tuple[str, int], int] = {}  # (phase, partner) -> bytes of the messages delivered
        self.written: dict[tuple[str, int], int] = {}  # (phase, partner) -> bytes written, resends included

    def exchange(self, iteration: int, k: int, phase: Phase, vector: np.ndarray) -> dict[int, np.ndarray]:
        """Send `vector` to every partner of the phase and receive each source's; returns sender -> vector."""
        payload = vector.astype(np.float64).tobytes()
        message = MESSAGE.pack(iteration, k, self.rank, len(payload)) + payload
        sends = [_Send(self, partner, address, message) for partner, address in phase.to]
        wanted = {(iteration, k, s) for s in phase.sources}
        deadline = time.monotonic() + self.timeout
        while not all(s.done for s in sends) or not wanted <= self.inbox.keys():
            now = time.monotonic()
            if now > deadline:
                raise PhaseError(self._stuck(iteration, phase, sends, wanted))
            for s in sends:
                if not s.done and s.sock is None and now >= s.retry_at:
                    s.start()
            waits = [s.retry_at - now for s in sends if not s.done and s.sock is None]
            for key, mask in self.sel.select(max(0.0, min([*waits, deadline - now, 0.5]))):
                if key.data is None:
                    self._accept()
                elif isinstance(key.data, _Send):
                    key.data.event(mask)
                else:
                    key.data.event()
        got = {s: np.frombuffer(self.inbox.pop((iteration, k, s)), dtype=np.float64) for _, _, s in wanted}
        for s in sends:
            link = (phase.name, s.partner)
            self.sent[link] = self.sent.get(link, 0) + len(s.message)
            self.written[link] = self.written.get(link, 0) + s.written
        return got

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sel.register(sock, selectors.EVENT_READ, _Receive(self, sock))

    def _stuck(self, iteration: int, phase: Phase, sends: list[_Send], wanted: set) -> str:
        unsent = [
            f"rank {s.partner} at {s.address[0]}:{s.address[1]} ({s.attempts} attempts)" for s in sends if not s.done
        ]
        missing = sorted(s for key in wanted if key not in self.inbox for s in [key[2]])
        return (
            f"rank {self.rank}: phase {phase.name} (configuration {phase.config}) of iteration {iteration} did not "
            f"complete within {self.timeout:g} s: not delivered to {unsent or 'none'}, nothing from rank(s) "
            f"{missing or 'none'}; the phase's circuits are not up (a wrong or missing configuration, or a link down)"
        )

    def close(self) -> None:
        for key in list(self.sel.get_map().values()):
            cast(socket.socket, key.fileobj).close()  # only sockets are registered
        self.sel.close()
        for sock in self.kept.values():
            sock.close()


def run(spec: RailSpec, rank: int, listen: tuple[str, int], timeout: float, fabric, say) -> None:
    """The phased iterations (`fabric`: a FabricClient, or None in static mode). Raises PhaseError."""
    from hostside.fabric_client import FabricError

    def ask(op: str, config: str) -> None:
        try:
            getattr(fabric, op)(config)
        except FabricError as exc:
            raise PhaseError(f"rank {rank}: the fabric service did not {op} {config}: {exc}") from exc

    net = PhaseNet(rank, listen, timeout)
    phases = spec.phases
    try:
        for iteration in range(1, spec.iterations + 1):
            start = time.monotonic()
            stalled = 0.0
            for k, phase in enumerate(phases):
                waited = time.monotonic()
                if spec.mode != "static":
                    ask("setup", phase.config)  # provisioning: the change was prepared; this waits for the rest
                stalled += time.monotonic() - waited
                n = max(1, phase.nbytes // 8)
                got = net.exchange(iteration, k, phase, tensor(rank, iteration, k, n))
                for sender, vector in got.items():
                    if not np.array_equal(vector, tensor(sender, iteration, k, n)):
                        raise PhaseError(
                            f"rank {rank}: phase {phase.name} of iteration {iteration}: rank {sender}'s data arrived "
                            "altered"
                        )
                # The phase's collective: TP takes the partner's activations, DP sums the group's gradients.
                reduced = tensor(rank, iteration, k, n) + sum(got.values())
                assert reduced.shape == (n,)
                if spec.mode == "provisioning" and not (iteration == spec.iterations and k == len(phases) - 1):
                    ask("prepare", phases[(k + 1) % len(phases)].config)
                time.sleep(phase.compute_s)  # the phase's compute
            ms = (time.monotonic() - start) * 1000
            say(f"step {iteration} ms {ms:.3f} stall_ms {stalled * 1000:.3f}")
    finally:
        net.close()
    for (name, partner), n in sorted(net.sent.items()):
        say(f"sent {name} {partner} {n} written {net.written[(name, partner)]}")
