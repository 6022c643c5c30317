"""`torchrun` on an emulated GPU host: a stand-in for PyTorch's launcher (torch.distributed.run), which CI
does not have. The emulated shell runs it (`python -m emulators.gpuhost.torchrun`) when asked for `torchrun`
(emulators/gpuhost/host.py, LAUNCHERS).

What it does as torchrun does (torch/distributed/run.py; elastic/agent/server/api.py and
local_elastic_agent.py; elastic/rendezvous/static_tcp_rendezvous.py and dynamic_rendezvous.py):

- options: the subset in `SUPPORTED`, with their dash and underscore spellings, defaults from PET_<NAME>
  environment variables, and argparse's own errors (prefixes of option names, unknown options: exit 2). An
  option torchrun has that this stand-in does not is refused by name;
- rendezvous, every launcher waiting for all --nnodes of them within the rendezvous timeout (--rdzv-conf
  timeout= for static, join_timeout= for c10d; 600 s by default, as torchrun's):
  `static`: the launcher of --node-rank 0 hosts the store at --rdzv-endpoint; node ranks are the
  --node-rank of each launcher; MASTER_ADDR and MASTER_PORT are the endpoint (torchrun's agent store);
  `c10d`: the launcher that binds the endpoint first hosts the store; --node-rank is ignored and the nodes are
  ranked by (address, pid), as DynamicRendezvousHandler sorts its participants; MASTER_ADDR is node 0's
  address (--local-addr, else its FQDN) and MASTER_PORT a free port that node holds;
- a node's workers get consecutive global ranks after those of the nodes before it; each worker's environment
  is the launcher's own plus torchrun's variables (`worker_env`), its arguments with ${local_rank}
  substituted; --no-python runs the program itself, otherwise `python -u [-m] SCRIPT`;
- the workers are checked every --monitor-interval seconds (0.1): when one fails the others are stopped
  (SIGTERM, SIGKILL after 30 s) and it exits 1 with torchrun's failure summary; when all succeed it exits 0.
  SIGTERM, SIGINT, SIGHUP and SIGQUIT are passed on to the workers, and it exits 1 once they are gone (the
  SignalException torchrun dies of).

Where it differs, on purpose:
- the workers stay in the launcher's process group (torchrun gives each a session of its own): the emulated
  host tracks the processes it started by process group, so what it does to the launcher's job (a lost GPU,
  power off, a stop) reaches the ranks, as losing the host would;
- started by an emulated host (TESTBED_EMULATED_PROGRAMS, set by the host, lists its job programs), it starts
  only those programs, by bare name with --no-python: the host runs nothing outside its allowlist;
- --max-restarts must be 0 (no re-rendezvous), --nnodes a fixed number and --nproc-per-node an integer.

With TESTBED_TWIN_TORCHRUN=real in its environment it hands the (checked) command line to PyTorch's own
launcher (`python -m torch.distributed.run`): a twin run with real PyTorch ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

PROG = "torchrun"
ALLOWLIST_ENV = "TESTBED_EMULATED_PROGRAMS"  # set by the emulated host: the programs it may start
REAL_ENV = "TESTBED_TWIN_TORCHRUN"  # "real": run PyTorch's torchrun instead of this stand-in
DEFAULT_RDZV_TIMEOUT_S = 600.0  # static_tcp_rendezvous' and dynamic rendezvous' join timeout
DEFAULT_C10D_PORT = 29400  # torchrun's default port of a c10d endpoint given without one
CLOSE_TIMEOUT_S = 30.0  # torchrun's grace before SIGKILL when it stops its workers
MAX_NPROC = 1024  # workers per launcher: an emulated host's processes are this machine's
MAX_SECONDS = 86400.0  # the longest monitor interval or rendezvous timeout this stand-in takes
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)  # --signals-to-handle's default

# (dest, spellings, default, type): torchrun's options this stand-in implements, typed as torchrun types them
# (None: a flag).
SUPPORTED = (
    ("nnodes", ("--nnodes",), "1:1", str),
    ("nproc_per_node", ("--nproc-per-node", "--nproc_per_node"), "1", str),
    ("rdzv_backend", ("--rdzv-backend", "--rdzv_backend"), "static", str),
    ("rdzv_endpoint", ("--rdzv-endpoint", "--rdzv_endpoint"), "", str),
    ("rdzv_id", ("--rdzv-id", "--rdzv_id"), "none", str),
    ("rdzv_conf", ("--rdzv-conf", "--rdzv_conf"), "", str),
    ("max_restarts", ("--max-restarts", "--max_restarts"), 0, int),
    ("monitor_interval", ("--monitor-interval", "--monitor_interval"), 0.1, float),
    ("role", ("--role",), "default", str),
    ("no_python", ("--no-python", "--no_python"), False, None),
    ("module", ("-m", "--module"), False, None),
    ("log_dir", ("--log-dir", "--log_dir"), None, str),
    ("node_rank", ("--node-rank", "--node_rank"), 0, int),
    ("master_addr", ("--master-addr", "--master_addr"), "127.0.0.1", str),
    ("master_port", ("--master-port", "--master_port"), 29500, int),
    ("local_addr", ("--local-addr", "--local_addr"), None, str),
)
# torchrun's options this stand-in does not implement: parsed (so that prefixes resolve as torchrun resolves
# them), then refused by name.
UNSUPPORTED = (
    ("standalone", ("--standalone",), False),
    ("start_method", ("--start-method", "--start_method"), True),
    ("event_log_handler", ("--event-log-handler", "--event_log_handler"), True),
    ("run_path", ("--run-path", "--run_path"), False),
    ("redirects", ("-r", "--redirects"), True),
    ("tee", ("-t", "--tee"), True),
    ("local_ranks_filter", ("--local-ranks-filter", "--local_ranks_filter"), True),
    ("logs_specs", ("--logs-specs", "--logs_specs"), True),
    ("numa_binding", ("--numa-binding", "--numa_binding"), True),
    ("signals_to_handle", ("--signals-to-handle", "--signals_to_handle"), True),
)


class _Parser(argparse.ArgumentParser):
    def __init__(self) -> None:
        super().__init__(prog=PROG, description="Torch Distributed Elastic Training Launcher (emulated host)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser()
    env = os.environ
    for dest, names, default, kind in SUPPORTED:
        # torchrun's `env` / `check_env` actions: PET_<DEST> supplies the default (argparse converts it)
        pet = env.get(f"PET_{dest.upper()}")
        if kind is not None:
            p.add_argument(*names, dest=dest, type=kind, default=pet if pet is not None else default)
        else:
            flag = pet is not None and pet.strip().lower() in ("1", "true")
            p.add_argument(*names, dest=dest, action="store_true", default=flag or default)
    for dest, names, valued in UNSUPPORTED:
        if valued:
            p.add_argument(*names, dest=dest, default=None, help=argparse.SUPPRESS)
        else:
            p.add_argument(*names, dest=dest, action="store_true", default=None, help=argparse.SUPPRESS)
    p.add_argument("training_script", help="the program (with --no-python) or Python script to launch")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


@dataclass
class Config:
    """A parsed command line."""

    nnodes: int
    nproc_per_node: int
    rdzv_backend: str  # "static" or "c10d"
    endpoint: tuple[str, int]
    run_id: str
    rdzv_timeout_s: float
    max_restarts: int
    monitor_interval: float
    role: str
    node_rank: int
    local_addr: str | None
    no_python: bool
    module: bool
    log_dir: str | None
    program: str
    args: list[str] = field(default_factory=list)


def parse_args(argv: list[str]) -> Config:
    """torchrun's command line, as this stand-in accepts it; argparse's exit (status 2, usage on stderr) for
    anything else.
    """
    p = build_parser()
    ns = p.parse_args(argv)
    for dest, names, _ in UNSUPPORTED:
        if getattr(ns, dest) is not None:
            p.error(f"argument {'/'.join(names)}: not supported by the emulated host's torchrun")

    def number(kind, option: str, text: str):
        try:
            return kind(text)
        except ValueError:
            p.error(f"argument {option}: invalid {kind.__name__} value: {text!r}")

    low, sep, high = ns.nnodes.partition(":")
    nmin = number(int, "--nnodes", low)
    nmax = number(int, "--nnodes", high) if sep else nmin
    if not 0 < nmin <= nmax:
        p.error(f"argument --nnodes: {ns.nnodes!r} is not a node count (MIN:MAX with 0 < MIN <= MAX)")
    if nmin != nmax:
        p.error(f"argument --nnodes: {ns.nnodes}: elastic ranges are not supported by the emulated host's torchrun")
    nproc = number(int, "--nproc-per-node", ns.nproc_per_node)
    if not 1 <= nproc <= MAX_NPROC:
        p.error(f"argument --nproc-per-node: {nproc} is not a number of processes (1 to {MAX_NPROC} here)")
    if ns.max_restarts != 0:
        p.error("argument --max-restarts: only 0 is supported by the emulated host's torchrun (no re-rendezvous)")
    if not 0 < ns.monitor_interval <= MAX_SECONDS:
        p.error(f"argument --monitor-interval: {ns.monitor_interval} is not an interval in (0, {MAX_SECONDS}] seconds")
    node_rank = ns.node_rank
    backend = ns.rdzv_backend
    if backend not in ("static", "c10d"):
        p.error(f"argument --rdzv-backend: {backend!r} is not supported by the emulated host's torchrun (static, c10d)")
    if backend == "static" and not 0 <= node_rank < nmin:
        p.error(f"argument --node-rank: {node_rank} is not a node of --nnodes {nmin}")
    conf = _rdzv_conf(p, ns.rdzv_conf)
    key = "timeout" if backend == "static" else "join_timeout"
    timeout = number(float, "--rdzv-conf", conf[key]) if key in conf else DEFAULT_RDZV_TIMEOUT_S
    if not 0 < timeout <= MAX_SECONDS:
        p.error(f"argument --rdzv-conf: {key}={conf[key]} is not a timeout in (0, {MAX_SECONDS}] seconds")
    if backend == "static":
        text = ns.rdzv_endpoint or f"{ns.master_addr}:{ns.master_port}"  # run.py's get_rdzv_endpoint
        default_port = -1
    else:
        text, default_port = ns.rdzv_endpoint, DEFAULT_C10D_PORT
    endpoint = _endpoint(p, text, default_port)
    if ns.no_python and ns.module:
        p.error("Don't use both the '--no-python' flag and the '--module' flag at the same time.")
    return Config(
        nnodes=nmin,
        nproc_per_node=nproc,
        rdzv_backend=backend,
        endpoint=endpoint,
        run_id=ns.rdzv_id,
        rdzv_timeout_s=timeout,
        max_restarts=ns.max_restarts,
        monitor_interval=ns.monitor_interval,
        role=ns.role,
        node_rank=node_rank,
        local_addr=ns.local_addr,
        no_python=ns.no_python,
        module=ns.module,
        log_dir=ns.log_dir,
        program=ns.training_script,
        args=list(ns.training_script_args),
    )


def _rdzv_conf(p: argparse.ArgumentParser, text: str) -> dict[str, str]:
    """--rdzv-conf key1=value1,key2=value2 (rendezvous/utils.py's _parse_rendezvous_config)."""
    conf: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            p.error(
                f"argument --rdzv-conf: the rendezvous configuration option '{item}' must be in format <key>=<value>."
            )
        conf[key.strip()] = value.strip()
    return conf


def _endpoint(p: argparse.ArgumentParser, text: str, default_port: int) -> tuple[str, int]:
    """host[:port] (rendezvous/utils.py's parse_rendezvous_endpoint)."""
    text = text.strip()
    if not text:
        p.error("argument --rdzv-endpoint: the rendezvous endpoint is empty (host:port)")
    host, sep, port = text.rpartition(":") if not text.endswith("]") else (text, "", "")
    if not sep:
        host, port = text, ""
    host = host.strip("[]")
    if not host:
        p.error(f"argument --rdzv-endpoint: the hostname of the rendezvous endpoint '{text}' must be non-empty")
    if not port:
        if default_port < 0:
            p.error(f"argument --rdzv-endpoint: Port is absent in endpoint: {text}. Try launching with --master-port")
        return host, default_port
    if not port.isascii() or not port.isdigit() or not 0 <= int(port) <= 65535:
        p.error(
            f"argument --rdzv-endpoint: the port number of the rendezvous endpoint '{text}' must be an integer "
            "between 0 and 65536."
        )
    return host, int(port)


# --- rendezvous ------------------------------------------------------------------------------------------


class RendezvousError(Exception):
    pass


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
    join = {"run_id": cfg.run_id, "backend": cfg.rdzv_backend, "nproc": cfg.nproc_per_node, "pid": os.getpid()}
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
        join["addr"] = cfg.local_addr or socket.getfqdn()
        holder = _bind(join["addr"] if cfg.local_addr else "", 0)  # MASTER_PORT, should this node be node 0
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
        try:
            with socket.socket(socket.AF_INET6 if ":" in addr[0] else socket.AF_INET) as probe:
                probe.bind((addr[0], 0))
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
            time.sleep(0.05)  # the store's host has not started yet: try again, as a TCPStore client does
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


# --- workers ---------------------------------------------------------------------------------------------


def worker_env(cfg: Config, a: Assignment, local_rank: int) -> dict[str, str]:
    """torchrun's variables for one worker (LocalElasticAgent._start_workers)."""
    rank = a.base_rank + local_rank
    return {
        "RANK": str(rank),
        "GROUP_RANK": str(a.group_rank),
        "ROLE_RANK": str(rank),  # one role: a worker's rank among its role's is its global rank
        "ROLE_NAME": cfg.role,
        "LOCAL_WORLD_SIZE": str(cfg.nproc_per_node),
        "WORLD_SIZE": str(a.world_size),
        "GROUP_WORLD_SIZE": str(a.group_world_size),
        "ROLE_WORLD_SIZE": str(a.world_size),
        "MASTER_ADDR": a.master_addr,
        "MASTER_PORT": str(a.master_port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": str(cfg.max_restarts),
        "TORCHELASTIC_RUN_ID": cfg.run_id,
        "TORCHELASTIC_USE_AGENT_STORE": str(cfg.rdzv_backend == "static"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "LOCAL_RANK": str(local_rank),
    }


def worker_argv(cfg: Config, local_rank: int) -> list[str]:
    args = [a.replace("${local_rank}", str(local_rank)) for a in cfg.args]  # torchrun's macros.substitute
    if cfg.no_python:
        return [cfg.program, *args]
    python = os.environ.get("PYTHON_EXEC", sys.executable)
    return [python, "-u", *(["-m"] if cfg.module else []), cfg.program, *args]


class SignalException(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(f"Process {os.getpid()} got signal: {signum}")
        self.signum = signum


def _raise_signal(signum, frame) -> None:
    raise SignalException(signum)


@dataclass
class Worker:
    local_rank: int
    rank: int
    proc: subprocess.Popen
    error_file: str


def start_workers(cfg: Config, a: Assignment, attempt_dir: str, workers: list[Worker]) -> None:
    """Start the node's workers into `workers` (a signal in between leaves the ones started there)."""
    base = {k: v for k, v in os.environ.items() if k != ALLOWLIST_ENV}
    for local in range(cfg.nproc_per_node):
        clog = os.path.join(attempt_dir, str(local))
        os.makedirs(clog, exist_ok=True)
        error_file = os.path.join(clog, "error.json")
        env = {**base, **worker_env(cfg, a, local), "TORCHELASTIC_ERROR_FILE": error_file}
        proc = subprocess.Popen(worker_argv(cfg, local), env=env, close_fds=True)  # in this process group
        workers.append(Worker(local, a.base_rank + local, proc, error_file))


def stop_workers(workers: list[Worker], sig: int = signal.SIGTERM, timeout: float = CLOSE_TIMEOUT_S) -> None:
    for w in workers:
        if w.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(sig)
    deadline = time.monotonic() + timeout
    for w in workers:
        try:
            w.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                w.proc.kill()
            w.proc.wait()


def monitor(cfg: Config, workers: list[Worker]) -> list[tuple[Worker, int, float]]:
    """Poll the workers every monitor interval until one has failed or all are done; the failures."""
    running = list(workers)
    failures: list[tuple[Worker, int, float]] = []
    while running and not failures:
        time.sleep(cfg.monitor_interval)  # torchrun's monitor loop (the agent's _monitor_workers)
        for w in list(running):
            code = w.proc.poll()
            if code is not None:
                running.remove(w)
                if code != 0:
                    failures.append((w, code, time.time()))
    return failures


def failure_summary(cfg: Config, failures: list[tuple[Worker, int, float]]) -> str:
    """torchrun's ChildFailedError report, its root cause first."""
    host = os.environ.get("HOSTNAME") or socket.gethostname()
    bar = "=" * 60
    first, *others = sorted(failures, key=lambda f: f[2])

    def entry(f) -> str:
        w, code, when = f
        exit_text = f"{code} (pid: {w.proc.pid})"
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            exit_text += f"\n  error_file: <N/A>\n  traceback : Signal {-code} ({name}) received by PID {w.proc.pid}"
        else:
            exit_text += "\n  error_file: <N/A>\n  traceback : To enable traceback see: "
            exit_text += "https://pytorch.org/docs/stable/elastic/errors.html"
        stamp = time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(when))
        return (
            f"[{w.local_rank}]:\n  time      : {stamp}\n  host      : {host}\n"
            f"  rank      : {w.rank} (local_rank: {w.local_rank})\n  exitcode  : {exit_text}"
        )

    return (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        f"{bar}\n{cfg.program} FAILED\n{'-' * 60}\nFailures:\n"
        + ("\n".join(entry(f) for f in others) if others else "  <NO_OTHER_FAILURES>")
        + f"\n{'-' * 60}\nRoot Cause (first observed failure):\n{entry(first)}\n{bar}\n"
    )


def _check_program(cfg: Config) -> str | None:
    """On an emulated host, only its allowlisted programs may start; why this one may not, or None."""
    allowed = os.environ.get(ALLOWLIST_ENV)
    if allowed is None:
        return None
    names = [n for n in allowed.split(",") if n]
    if not cfg.no_python:
        return (
            "the emulated host starts only its own programs: launch one by name with --no-python "
            f"(allowed: {', '.join(names) or 'none'})"
        )
    if "/" in cfg.program or cfg.program not in names:
        return f"FileNotFoundError: [Errno 2] No such file or directory: '{cfg.program}'"
    return None


def _log_dirs(cfg: Config) -> tuple[str, str | None]:
    """DefaultLogsSpecs' layout, <log_dir>/<run_id>_<random>/attempt_0, where each worker's error file goes
    (TORCHELASTIC_ERROR_FILE); and the folder made for it when no --log-dir was given, removed at exit. That
    folder is a temporary one, as torchrun's; on an emulated host, in the host's own home (its /tmp).
    """
    made = None
    base = cfg.log_dir
    if not base:
        tmp = None
        if ALLOWLIST_ENV in os.environ and os.environ.get("HOME"):
            tmp = os.path.join(os.environ["HOME"], ".tmp")
            os.makedirs(tmp, exist_ok=True)
        base = made = tempfile.mkdtemp(prefix="torchelastic_", dir=tmp)
    os.makedirs(base, exist_ok=True)
    run_dir = tempfile.mkdtemp(prefix=f"{cfg.run_id}_", dir=base)
    attempt = os.path.join(run_dir, "attempt_0")
    os.makedirs(attempt)
    return attempt, made


def run(cfg: Config) -> int:
    why = _check_program(cfg)
    if why is not None:
        print(why, file=sys.stderr, flush=True)
        return 1
    if "OMP_NUM_THREADS" not in os.environ and cfg.nproc_per_node > 1:
        print(
            "\n*****************************************\nSetting OMP_NUM_THREADS environment variable for each "
            "process to be 1 in default, to avoid your system being overloaded, please further tune the variable "
            "for optimal performance in your application as needed. \n*****************************************",
            file=sys.stderr,
            flush=True,
        )
        os.environ["OMP_NUM_THREADS"] = "1"
    keep: list[socket.socket] = []
    workers: list[Worker] = []
    made = None
    for sig in HANDLED_SIGNALS:
        signal.signal(sig, _raise_signal)
    try:
        try:
            assignment = rendezvous(cfg, keep)
        except RendezvousError as exc:
            print(exc, file=sys.stderr, flush=True)
            return 1
        try:
            attempt, made = _log_dirs(cfg)
            start_workers(cfg, assignment, attempt, workers)
        except OSError as exc:  # a log folder that cannot be made, a program that cannot be executed
            stop_workers(workers)
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return 1
        failures = monitor(cfg, workers)
        if failures:
            stop_workers(workers)
            print(failure_summary(cfg, failures), file=sys.stderr, flush=True)
            return 1
        return 0
    except SignalException as exc:
        for sig in HANDLED_SIGNALS:  # a second signal must not interrupt the shutdown
            signal.signal(sig, signal.SIG_IGN)
        print(f"Received {exc.signum} death signal, shutting down workers", file=sys.stderr, flush=True)
        stop_workers(workers, exc.signum)
        print(f"torch.distributed.elastic.multiprocessing.api.SignalException: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        for s in keep:
            s.close()
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_args(argv)
    if os.environ.get(REAL_ENV) == "real":
        why = _check_program(cfg)
        if why is not None:
            print(why, file=sys.stderr, flush=True)
            return 1
        os.environ.pop(REAL_ENV)
        os.environ.pop(ALLOWLIST_ENV, None)
        os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", *argv])
    return run(cfg)


if __name__ == "__main__":
    raise SystemExit(main())
