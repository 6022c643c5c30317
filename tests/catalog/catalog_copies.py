"""Run folders made by copying a real one under new run ids: many runs without running each (scale, concurrency)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def copy_run(source: Path, results: Path, index: int, *, started_offset_s: float = 0.0) -> Path:
    """A copy of the run folder `source` in `results`, as run number `index`: its own run id and start time."""
    run_id = f"{source.name}-copy{index:04d}"
    target = results / run_id
    shutil.copytree(source, target)
    info = json.loads((target / "run.json").read_text())
    info["run"] = run_id
    info["clock"]["wall_start"] += started_offset_s
    (target / "run.json").write_text(json.dumps(info, indent=2) + "\n")
    return target
