"""The real PyTorch job (testbed-torch-train, hostside/torch_train.py) under PyTorch's own torchrun, with no
framework around it: it prints testbed-train's lines, checkpoints, and a restart resumes exactly where the newest
checkpoint any rank holds left off, including on a rank that holds none (a spare's).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from peers import require_peer

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]


def _torchrun(checkpoints: Path, steps: int, logs: Path) -> list[str]:
    """Two ranks of the job to `steps` under PyTorch's torchrun; their output lines, each rank's from its own log
    (TESTBED_RANK_LOG, as testbed sets it for several ranks on a host: two ranks writing to one pipe would
    interleave their lines).
    """
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + ["-m", "hostside.torch_train", "--steps", str(steps), "--checkpoint-dir", str(checkpoints)]
        + ["--checkpoint-every", "10", "--timeout", "30"],
        cwd=REPO,
        env={**os.environ, "TESTBED_RANK_LOG": str(logs / "rank{rank}.log")},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line for rank in (0, 1) for line in (logs / f"rank{rank}.log").read_text().splitlines()]


def _losses(lines: list[str]) -> dict[int, str]:
    out: dict[int, str] = {}
    for line in lines:
        m = re.fullmatch(r"step (\d+) loss (\d+\.\d{6})", line)
        if m:
            assert out.setdefault(int(m[1]), m[2]) == m[2]  # every rank prints the same (mean) loss
    return out


def test_a_restart_resumes_from_the_newest_checkpoint_exactly_even_on_a_rank_that_holds_none(tmp_path):
    require_peer("torch", "testbed-torch-train is a PyTorch job")
    first = tmp_path / "first"
    lines = _torchrun(first, 25, tmp_path / "logs1")
    losses = _losses(lines)
    assert sorted(losses) == list(range(1, 26))
    assert {"ready rank 0 world 2 step 0", "ready rank 1 world 2 step 0", "done rank 0 steps 25"} <= set(lines)
    assert float(losses[25]) < float(losses[1])  # it learns
    # each rank's checkpoints, the newest three kept; none half-written
    assert sorted(p.name for p in first.iterdir()) == [f"ckpt-rank{r}-step{s}.pt" for r in (0, 1) for s in (10, 20)]

    # Rank 0's newest checkpoint lost and rank 1 holding none (a spare in its slot): both resume from step 10, which
    # rank 0 holds, and the steps after it repeat the first run's losses.
    (first / "ckpt-rank0-step20.pt").unlink()
    for p in first.glob("ckpt-rank1-*"):
        p.unlink()
    again = _torchrun(first, 25, tmp_path / "logs2")
    assert again.count("resumed from step 10 (checkpoint of rank 0)") == 2
    assert {"ready rank 0 world 2 step 10", "ready rank 1 world 2 step 10"} <= set(again)
    resumed = _losses(again)
    assert sorted(resumed) == list(range(11, 26))
    assert resumed == {s: losses[s] for s in range(11, 26)}
