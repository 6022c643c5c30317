"""The rendezvous: every launcher of a job meets the others at the endpoint, and each learns its node's place in
the job (its group rank, its workers' first global rank, the sizes) and where the workers bootstrap from.

`static`: the launcher of --node-rank 0 hosts the store at --rdzv-endpoint; node ranks are the --node-rank of
each launcher; MASTER_ADDR and MASTER_PORT are the endpoint (torchrun's agent store). `c10d`: the launcher that
binds the endpoint first hosts the store; --node-rank is ignored and the nodes are ranked by (address, pid), as
DynamicRendezvousHandler sorts its participants; MASTER_ADDR is node 0's address (--local-addr, else its FQDN)
and MASTER_PORT a free port that node holds. A launcher waits for all --nnodes of them within the rendezvous
timeout. The wire protocol is one JSON line each way: the node's join, the store's answer.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass

from emulators.gpuhost.torchrun.options import Config

JOIN_RETRY_S = 0.05  # between attempts to reach a store whose launcher has not started yet


class RendezvousError(Exception):
    """The rendezvous failed; its message is the error torchrun would die of."""


@dataclass
class Assignment:
    """What the rendezvous gives a node: its group rank, its workers' first global rank, the sizes, and the
    address workers bootstrap their own communication from.
    """

    group_rank: int
    group_world_size: int
    base_rank: int
    world_size: int
    master_addr: str
    master_port: int


class Store:
    """The rendezvous store one launcher hosts: it collects each node's join, and once all --nnodes have joined
    answers every one of them with its assignment. Its socket stays open while the launcher runs (torchrun's
    agent store: under `static`, MASTER_PORT is this port).
    """

    def __init__(self, listener: socket.socket, cfg: Config, deadline: float) -> None:
        self.listener, self.cfg, self.deadline = listener, cfg, deadline
        self.joined: list[dict] = []
        self.result: dict[int, dict] | None = None  # join index -> reply
        self.changed = threading.Condition()
        threading.Thread(target=self._accept, name="rdzv-store", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(max(0.1, self.deadline - time.monotonic()))
                join = json.loads(_read_line(conn))
                reply = self._join(join)
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return  # a client that went away, or something that is not a launcher's join

    def _join(self, join: dict) -> dict:
        cfg = self.cfg
        with self.changed:
            if self.result is not None:
                return {"error": f"the rendezvous {cfg.run_id!r} is complete: a late node was not admitted"}
            if join.get("run_id") != cfg.run_id or join.get("backend") != cfg.rdzv_backend:
                return {
                    "error": f"a node of rendezvous {join.get('run_id')!r} ({join.get('backend')}) came to this "
                    f"store of {cfg.run_id!r} ({cfg.rdzv_backend})"
                }
            if cfg.rdzv_backend == "static" and any(j["node_rank"] == join["node_rank"] for j in self.joined):
                return {"error": f"node rank {join['node_rank']} joined the rendezvous {cfg.run_id!r} twice"}
            index = len(self.joined)
            self.joined.append(join)
            if len(self.joined) == cfg.nnodes:
                self.result = self._assign()
                self.changed.notify_all()
            while self.result is None:
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    return {
                        "error": f"Timed out after {cfg.rdzv_timeout_s:g} seconds waiting for clients. "
                        f"{len(self.joined)}/{cfg.nnodes} clients joined."
                    }
                self.changed.wait(remaining)
            return self.result[index]

    def _assign(self) -> dict[int, dict]:
        cfg = self.cfg
        if cfg.rdzv_backend == "static":
            order = sorted(range(len(self.joined)), key=lambda i: self.joined[i]["node_rank"])
        else:  # DynamicRendezvousHandler: `for rank, node in enumerate(sorted(state.participants))`
            order = sorted(range(len(self.joined)), key=lambda i: (self.joined[i]["addr"], self.joined[i]["pid"]))
        world = sum(j["nproc"] for j in self.joined)
        if cfg.rdzv_backend == "static":
            master = (cfg.endpoint[0], cfg.endpoint[1])
        else:
            first = self.joined[order[0]]
            master = (first["addr"], first["master_port"])
        out, base = {}, 0
        for group_rank, i in enumerate(order):
            out[i] = {
                "group_rank": group_rank,
                "group_world_size": cfg.nnodes,
                "base_rank": base,
                "world_size": world,
                "master_addr": master[0],
                "master_port": master[1],
            }
            base += self.joined[i]["nproc"]
        return out


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return data


def _bind(host: str, port: int) -> socket.socket:
    return socket.create_server((host, port), reuse_port=False)


def rendezvous(cfg: Config, keep: list) -> Assignment:
    """Meet the other launchers at the endpoint; `keep` receives the sockets that must stay open while the
    job runs (the store, MASTER_PORT's holder).
    """
    deadline = time.monotonic() + cfg.rdzv_timeout_s
    host, port = cfg.endpoint
    join: dict[str, object] = {
        "run_id": cfg.run_id,
        "backend": cfg.rdzv_backend,
        "nproc": cfg.nproc_per_node,
        "pid": os.getpid(),
    }
    if cfg.rdzv_backend == "static":
        join["node_rank"] = cfg.node_rank
        if cfg.node_rank == 0:
            try:
                listener = _bind(host, port)
            except OSError as exc:
                raise RendezvousError(
                    f"torch.distributed.DistNetworkError: The server socket has failed to listen on {host}:{port} "
                    f"(errno: {exc.errno} - {exc.strerror})."
                ) from None
            keep.append(listener)
            Store(listener, cfg, deadline)
    else:
        addr = join["addr"] = cfg.local_addr or socket.getfqdn()
        holder = _bind(addr if cfg.local_addr else "", 0)  # MASTER_PORT, should this node be node 0
        keep.append(holder)
        join["master_port"] = holder.getsockname()[1]
        if _is_local(host):  # c10d_rendezvous_backend: a host matching the endpoint tries to serve, else joins
            try:
                listener = _bind(host, port)
            except OSError:
                pass
            else:
                keep.append(listener)
                Store(listener, cfg, deadline)
    reply = _join(host, port, join, deadline, cfg.rdzv_timeout_s)
    if "error" in reply:
        raise RendezvousError(f"torch.distributed.elastic.rendezvous.api.RendezvousError: {reply['error']}")
    return Assignment(**reply)


def _is_local(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    for *_, addr in infos:
        ip = str(addr[0])  # an address string for TCP (the stubs allow an int for other families)
        try:
            with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as probe:
                probe.bind((ip, 0))
            return True
        except OSError:
            continue
    return False


def _join(host: str, port: int, join: dict, deadline: float, timeout_s: float) -> dict:
    while True:
        remaining = deadline - time.monotonic()
        try:
            conn = socket.create_connection((host, port), timeout=max(0.05, min(1.0, remaining)))
            break
        except OSError as exc:
            if remaining <= 0:
                raise RendezvousError(
                    f"torch.distributed.DistNetworkError: The client socket has timed out after {timeout_s:g} "
                    f"seconds while trying to connect to ({host}, {port}): {exc}"
                ) from None
            time.sleep(JOIN_RETRY_S)  # the store's host has not started yet: try again, as a TCPStore client does
    with conn:
        # The store answers once every node has joined, or when its deadline passes (a second's grace here).
        conn.settimeout(max(0.1, deadline - time.monotonic()) + 1.0)
        conn.sendall(json.dumps(join).encode() + b"\n")
        try:
            return json.loads(_read_line(conn))
        except (OSError, ValueError) as exc:
            raise RendezvousError(
                f"torch.distributed.DistStoreError: the rendezvous store at {host}:{port} went away: {exc}"
            ) from None
