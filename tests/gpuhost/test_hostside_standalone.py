"""What runs on a GPU host (the reference workload, the straggle agent, the fabric service's client) runs with
Python, its standard library and numpy alone: here in a virtual environment that holds nothing else, as on a lab
host where testbed's controller (Ray, pydantic, matplotlib, paramiko ...) is not installed (docs/jobs.md).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import venv
from pathlib import Path

import numpy
import pytest

REPO = Path(__file__).resolve().parents[2]
ALLOWED = set(sys.stdlib_module_names) | {"numpy", "hostside", "__main__"}


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A virtual environment with no package but `hostside` and numpy (each linked from where it lives)."""
    root = tmp_path_factory.mktemp("bare-host")
    venv.create(root / "venv", with_pip=False, symlinks=True)
    packages = root / "packages"
    packages.mkdir()
    (packages / "hostside").symlink_to(REPO / "hostside")
    numpy_dir = Path(numpy.__file__).parent
    (packages / "numpy").symlink_to(numpy_dir)
    libs = numpy_dir.parent / "numpy.libs"  # the wheel's bundled BLAS, where it ships one
    if libs.exists():
        (packages / "numpy.libs").symlink_to(libs)
    python = root / "venv" / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        env=_clean_env(),
    ).stdout.strip()
    Path(site, "hostside-only.pth").write_text(f"{packages}\n")
    return python


def _clean_env(**extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return {**keep, **extra}


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_the_bare_environment_has_neither_testbed_nor_its_dependencies(bare_python):
    probe = "import importlib.util as u; print([m for m in ('testbed', 'ray', 'pydantic', 'yaml') if u.find_spec(m)])"
    out = subprocess.run(
        [bare_python, "-c", probe], capture_output=True, text=True, check=True, env=_clean_env(), cwd=bare_python.parent
    )
    assert out.stdout.strip() == "[]"


def test_every_host_program_imports_only_the_standard_library_and_numpy(bare_python):
    probe = (
        "import sys\n"
        "import hostside.train, hostside.straggle_agent, hostside.phased, hostside.collective\n"
        "import hostside.fabric_client, hostside.fabric_protocol\n"
        "print(sorted({m.split('.')[0] for m in sys.modules}))\n"
    )
    out = subprocess.run(
        [bare_python, "-c", probe], capture_output=True, text=True, env=_clean_env(), cwd=bare_python.parent
    )
    assert out.returncode == 0, out.stderr
    loaded = set(eval(out.stdout))  # noqa: S307 (our own probe's list of names)
    assert loaded - ALLOWED == set()


def test_the_reference_workload_trains_two_ranks_in_the_bare_environment(bare_python, tmp_path):
    peers = ",".join(f"127.0.0.1:{p}" for p in _free_ports(2))
    ranks = [
        subprocess.Popen(
            [bare_python, "-m", "hostside.train", "--steps", "6", "--dim", "8", "--checkpoint-every", "3"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=_clean_env(
                RANK=str(r), WORLD_SIZE="2", TESTBED_PEERS=peers, TESTBED_CHECKPOINT_DIR=str(tmp_path / f"ckpt{r}")
            ),
        )
        for r in range(2)
    ]
    outputs = [p.communicate(timeout=60) for p in ranks]
    for p, (_, err) in zip(ranks, outputs, strict=True):
        assert p.returncode == 0, err
    last = [[line for line in out.splitlines() if line.startswith("step ")][-1] for out, _ in outputs]
    assert last[0].startswith("step 6 ") and last[0] == last[1]  # every rank holds the same sum
    assert list((tmp_path / "ckpt0").iterdir())  # and it checkpointed


def test_the_straggle_agent_runs_in_the_bare_environment(bare_python):
    target = subprocess.Popen(["sleep", "60"], start_new_session=True)
    agent = subprocess.Popen(
        [bare_python, "-m", "hostside.straggle_agent", "--pid", str(target.pid), "--duty", "0.5", "--period-ms", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_clean_env(),
        cwd=bare_python.parent,
    )
    try:
        started = agent.stdout.readline()  # the agent's own word that it has stopped the group once
        assert "started" in started, agent.stderr.read()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=10) == 0
        state = Path(f"/proc/{target.pid}/stat").read_text().split(") ")[1][0]
        assert state != "T"  # continued last, never left stopped
    finally:
        target.kill()
        target.wait()
