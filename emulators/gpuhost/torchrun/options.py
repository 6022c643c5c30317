"""torchrun's command line as the stand-in takes it: torchrun's own argparse options (both spellings, PET_<NAME>
defaults from the environment, argparse's prefixes and errors), parsed into a `Config`. An option torchrun has
that the stand-in does not implement is refused by name, as is what it implements only in part (elastic node
ranges, restarts, rendezvous backends other than static and c10d); every refusal is argparse's exit, status 2
with the usage on stderr.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

PROG = "torchrun"
DEFAULT_RDZV_TIMEOUT_S = 600.0  # static_tcp_rendezvous' and dynamic rendezvous' join timeout
DEFAULT_C10D_PORT = 29400  # torchrun's default port of a c10d endpoint given without one
MAX_NPROC = 1024  # workers per launcher: an emulated host's processes are this machine's
MAX_SECONDS = 86400.0  # the longest monitor interval or rendezvous timeout this stand-in takes

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


def build_parser() -> argparse.ArgumentParser:
    """torchrun's parser, its defaults read from the environment now."""
    p = argparse.ArgumentParser(prog=PROG, description="Torch Distributed Elastic Training Launcher (emulated host)")
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
