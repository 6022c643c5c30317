"""Two real emulated runs of ocs-reconfig in a results folder of their own, shared by the catalog's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.cli.main import main


def run_ocs_reconfig(repo: Path, results: Path, *extra: str) -> Path:
    code = main(
        ["run", str(repo / "playbooks/ocs-reconfig.yaml"), "--emulate", "--trials", "2", "--results", str(results)]
        + list(extra)
    )
    assert code == 0
    return max(p for p in results.iterdir() if p.is_dir())  # run ids start with their UTC start time


@pytest.fixture(scope="session")
def two_runs(ray_cluster, repo, tmp_path_factory) -> tuple[Path, Path, Path]:
    """(results folder, a run of seed 0, a run of seed 7), each indexed as `testbed run` ended it."""
    results = tmp_path_factory.mktemp("catalog") / "results"
    first = run_ocs_reconfig(repo, results)
    second = run_ocs_reconfig(repo, results, "--seed", "7")
    assert first != second
    return results, first, second
