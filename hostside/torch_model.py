"""testbed-torch-train's model, data and checkpoints, shared by its two recovery modes (torch_train: restart,
torch_injob: in-job).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

EXIT_COMM = 3  # as testbed-train: a peer is gone
CHECKPOINT = re.compile(r"ckpt-rank\d+-step(\d+)\.pt")


def latest_checkpoint(directory: Path | None) -> tuple[int, Path | None]:
    """The newest checkpoint in `directory` (any rank's): its step and path, or (0, None)."""
    best, path = 0, None
    if directory is not None:
        for p in directory.glob("ckpt-rank*-step*.pt"):
            m = CHECKPOINT.fullmatch(p.name)
            if m and int(m.group(1)) > best:
                best, path = int(m.group(1)), p
    return best, path


def _step_of(path: Path) -> int:
    m = CHECKPOINT.fullmatch(path.name)
    assert m is not None  # only the names the glob and the pattern both matched come here
    return int(m.group(1))


def save_checkpoint(torch, directory: Path, rank: int, step: int, state: dict, keep: int = 3) -> None:
    """This rank's checkpoint of `step`, whole or not at all (written aside, then renamed); its oldest beyond
    `keep` removed.
    """
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"ckpt-rank{rank}-step{step}.pt"
    tmp = directory / f".ckpt-rank{rank}-step{step}.tmp"
    torch.save({**state, "step": step}, tmp)
    os.replace(tmp, final)
    mine = [p for p in directory.glob(f"ckpt-rank{rank}-step*.pt") if CHECKPOINT.fullmatch(p.name)]
    mine.sort(key=_step_of)
    for old in mine[:-keep]:
        old.unlink(missing_ok=True)


def _seed(*parts: int) -> int:
    """A 63-bit seed from the parts (numpy's SeedSequence: independent streams per rank and step)."""
    import numpy as np

    return int(np.random.SeedSequence(list(parts)).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


def add_model_arguments(p: argparse.ArgumentParser, per: str) -> None:
    """The model's and the data's options, as every training program here takes them (`per`: whose batch it is)."""
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--dim", type=int, default=32, help="input features")
    p.add_argument("--hidden", type=int, default=64, help="hidden units")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--batch", type=int, default=64, help=f"samples per {per} and step")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)


def build(torch, args: argparse.Namespace):
    """(student, teacher): two perceptrons of one shape; the teacher's fixed weights label the data."""
    nn = torch.nn

    def mlp():
        return nn.Sequential(nn.Linear(args.dim, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.classes))

    torch.manual_seed(_seed(args.seed, 1))
    teacher = mlp()
    torch.manual_seed(_seed(args.seed, 2))
    student = mlp()  # the same initial weights on every rank (DDP also sends rank 0's)
    for p in teacher.parameters():
        p.requires_grad_(False)
    return student, teacher


def batch(torch, args: argparse.Namespace, teacher, step: int):
    """Rank `args.rank`'s batch of `step`: the same whenever it is drawn (a resumed run redraws it)."""
    gen = torch.Generator().manual_seed(_seed(args.seed, 3, args.rank, step))
    x = torch.randn(args.batch, args.dim, generator=gen)
    with torch.no_grad():
        y = teacher(x).argmax(dim=1)
    return x, y


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
