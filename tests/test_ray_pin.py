"""Ray is pinned to the versions testbed is tested on: pyproject's range, the lowest that .ci/run installs and
tests, and the range ray_local passes its full system config to (testbed/engine/ray_local.py TESTED_RAY) agree.
"""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement

from testbed.engine.ray_local import TESTED_RAY


def ray_requirement(repo) -> Requirement:
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    (ray,) = [r for r in map(Requirement, project["dependencies"]) if r.name == "ray"]
    return ray


def test_pyproject_allows_the_tested_ray_versions_and_no_later_minor(repo):
    allowed = ray_requirement(repo).specifier
    (low_major, low_minor), (high_major, high_minor) = TESTED_RAY
    assert f"{low_major}.{low_minor}.0" in allowed and f"{high_major}.{high_minor}.9" in allowed
    assert f"{low_major}.{low_minor - 1}.99" not in allowed  # older than tested: refused at install
    assert f"{high_major}.{high_minor + 1}.0" not in allowed  # newer than tested: refused until tested


def test_ci_tests_the_lowest_version_pyproject_allows(repo):
    pinned = re.search(r"^RAY_LOWEST=(\S+)$", (repo / ".ci/run").read_text(), re.M)
    assert pinned, ".ci/run sets RAY_LOWEST and installs it"
    lowest = pinned.group(1)
    assert lowest in ray_requirement(repo).specifier
    assert tuple(int(p) for p in lowest.split(".")[:2]) == TESTED_RAY[0]
