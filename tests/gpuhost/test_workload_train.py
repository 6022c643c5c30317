"""testbed-train with local ranks: it learns, ranks agree, a dead peer fails the others, it resumes."""

from __future__ import annotations

import re
import socket
import subprocess
import sys

import pytest


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def launch(world: int, tmp_path, *extra: str) -> list[subprocess.Popen]:
    peers = ",".join(f"127.0.0.1:{p}" for p in free_ports(world))
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hostside.train",
                "--rank",
                str(r),
                "--peers",
                peers,
                "--checkpoint-dir",
                str(tmp_path / "ckpt"),
                "--timeout",
                "10",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]


def losses(out: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^step (\d+) loss (\S+)$", out, re.M)}


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_learn_together_and_resume_from_checkpoint(world, tmp_path):
    procs = launch(world, tmp_path, "--steps", "20", "--checkpoint-every", "5")
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * world
    per_rank = [losses(o) for o in outs]
    assert list(per_rank[0]) == list(range(1, 21))
    assert all(r == per_rank[0] for r in per_rank)  # every rank prints the same global loss
    assert float(per_rank[0][20]) < 0.5 * float(per_rank[0][1])
    procs = launch(world, tmp_path, "--steps", "23")
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * world
    assert "resumed from step 20" in outs[0]
    assert list(losses(outs[world - 1])) == [21, 22, 23]


def test_a_killed_rank_makes_the_others_fail_with_a_clear_error(tmp_path):
    procs = launch(3, tmp_path, "--steps", "100000", "--step-time", "0.01")
    for line in procs[0].stdout:  # wait until training really runs
        if line.startswith("step 3 "):
            break
    procs[1].kill()
    errs = [p.communicate(timeout=60)[1] for p in (procs[0], procs[2])]
    assert [procs[0].returncode, procs[2].returncode] == [3, 3]
    assert "rank 2: rank 1 (127.0.0.1:" in errs[1] and "the peer died" in errs[1]
    assert errs[0].startswith("error: rank 0:")


def test_a_hung_rank_makes_the_others_time_out(tmp_path):
    procs = launch(2, tmp_path, "--steps", "100000", "--timeout", "1")
    for line in procs[0].stdout:
        if line.startswith("step 2 "):
            break
    procs[1].send_signal(19)  # SIGSTOP: the rank hangs
    err = procs[0].communicate(timeout=60)[1]
    procs[1].kill()
    procs[1].communicate()
    assert procs[0].returncode == 3 and "for 1 s" in err and "hangs or the link is down" in err


THREADS_AFTER_IMPORT = (
    "import os, hostside.train\nprint(len(os.listdir('/proc/self/task')), os.environ['OPENBLAS_NUM_THREADS'])"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
def test_a_rank_runs_on_one_thread_unless_the_user_asks_for_more(monkeypatch):
    """Ranks share a host with the twin here (and with their own data loaders on a lab): NumPy's BLAS must not
    start a thread per core for a 64-wide model. A user's own setting is kept.
    """
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    out = subprocess.run([sys.executable, "-c", THREADS_AFTER_IMPORT], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1"]
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    out = subprocess.run([sys.executable, "-c", THREADS_AFTER_IMPORT], capture_output=True, text=True, check=True)
    assert out.stdout.split()[1] == "2"
