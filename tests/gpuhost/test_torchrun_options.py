"""The emulated host's torchrun, its command line (emulators/gpuhost/torchrun/options.py): defaults from PET_
variables, the rendezvous configuration and endpoint as torchrun reads them, and what it refuses (argparse's
exit, status 2, the reason on stderr).
"""

from __future__ import annotations

import contextlib
import io

import pytest

from emulators.gpuhost.torchrun.options import DEFAULT_C10D_PORT, DEFAULT_RDZV_TIMEOUT_S, Config, parse_args


def parse(argv: list[str]) -> tuple[Config | None, int | None, str]:
    """(config, None, '') or (None, exit status, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return parse_args(argv), None, ""
        except SystemExit as exc:
            return None, exc.code, err.getvalue()


def test_the_defaults_are_torchruns():
    cfg, _, err = parse(["train.py"])
    assert cfg is not None, err
    assert (cfg.nnodes, cfg.nproc_per_node, cfg.rdzv_backend, cfg.node_rank) == (1, 1, "static", 0)
    assert (cfg.endpoint, cfg.run_id, cfg.rdzv_timeout_s) == (("127.0.0.1", 29500), "none", DEFAULT_RDZV_TIMEOUT_S)
    assert (cfg.monitor_interval, cfg.role, cfg.no_python, cfg.module, cfg.log_dir) == (
        0.1,
        "default",
        False,
        False,
        None,
    )


def test_pet_variables_supply_defaults_the_command_line_overrides(monkeypatch):
    monkeypatch.setenv("PET_NNODES", "3")
    monkeypatch.setenv("PET_NODE_RANK", "2")
    monkeypatch.setenv("PET_NO_PYTHON", "true")
    cfg, _, err = parse(["--master-port", "1234", "prog"])
    assert cfg is not None, err
    assert (cfg.nnodes, cfg.node_rank, cfg.no_python) == (3, 2, True)
    cfg, _, err = parse(["--node-rank", "0", "prog"])
    assert cfg is not None and cfg.node_rank == 0, err


def test_the_rendezvous_timeout_is_the_backends_own_key():
    static, _, _ = parse(["--rdzv-conf", "timeout=5, other=x", "prog"])
    assert static is not None and static.rdzv_timeout_s == 5.0
    c10d, _, _ = parse(["--rdzv-backend", "c10d", "--rdzv-endpoint", "h", "--rdzv-conf", "join_timeout=7", "prog"])
    assert c10d is not None and c10d.rdzv_timeout_s == 7.0
    ignored, _, _ = parse(["--rdzv-backend", "c10d", "--rdzv-endpoint", "h", "--rdzv-conf", "timeout=5", "prog"])
    assert ignored is not None and ignored.rdzv_timeout_s == DEFAULT_RDZV_TIMEOUT_S


def test_endpoints_are_read_as_torchrun_reads_them():
    assert parse(["--rdzv-backend", "c10d", "--rdzv-endpoint", "node0", "p"])[0].endpoint == (
        "node0",
        DEFAULT_C10D_PORT,
    )
    assert parse(["--rdzv-endpoint", "[::1]:1234", "p"])[0].endpoint == ("::1", 1234)
    assert parse(["--master-addr", "10.0.0.9", "--master-port", "99", "p"])[0].endpoint == ("10.0.0.9", 99)


def test_the_program_and_its_arguments_are_kept_as_given():
    cfg, _, _ = parse(["--no-python", "testbed-train", "--steps", "3", "--nnodes", "9"])
    assert (cfg.program, cfg.args) == ("testbed-train", ["--steps", "3", "--nnodes", "9"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--standalone", "p"], "argument --standalone: not supported by the emulated host's torchrun"),
        (["--max-restarts", "1", "p"], "only 0 is supported"),
        (["--nproc-per-node", "gpu", "p"], "argument --nproc-per-node: invalid int value: 'gpu'"),
        (["--nproc-per-node", "0", "p"], "0 is not a number of processes"),
        (["--nnodes", "2:1", "p"], "is not a node count"),
        (["--nnodes", "2", "--node-rank", "2", "p"], "argument --node-rank: 2 is not a node of --nnodes 2"),
        (["--rdzv-backend", "etcd", "p"], "'etcd' is not supported"),
        (["--rdzv-conf", "timeout", "p"], "'timeout' must be in format <key>=<value>"),
        (["--rdzv-conf", "timeout=0", "p"], "timeout=0 is not a timeout"),
        (["--monitor-interval", "0", "p"], "is not an interval"),
        (["--rdzv-endpoint", "host", "p"], "Port is absent in endpoint: host"),
        (["--rdzv-endpoint", "host:70000", "p"], "must be an integer between 0 and 65536"),
        (["--rdzv-backend", "c10d", "p"], "the rendezvous endpoint is empty"),
        (["--no-python", "-m", "p"], "Don't use both the '--no-python' flag and the '--module' flag"),
        ([], "the following arguments are required: training_script"),
    ],
)
def test_what_the_stand_in_does_not_do_is_refused_with_status_2(argv, message):
    cfg, code, err = parse(argv)
    assert (cfg, code) == (None, 2)
    assert message in err and err.startswith("usage: torchrun")
