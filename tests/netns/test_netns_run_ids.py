"""Run ids that cannot collide, and the network tags derived from them: two runs started in the same instant, in two
results folders, get two ids and two tags, and two `--netns` runs started together both pass.

"The same instant" is made so, not hoped for: the clock a run id is stamped from (testbed.results.folder's
`datetime`) reads one instant for both runs, as it does for two CI jobs started in the same millisecond. Left to
the real clock, two runs started together mostly straddle a millisecond and the test would prove nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from peers import require_peer

import testbed.results.folder
from testbed.results.folder import make_run_dir, new_run_id
from testbed.twin import netns

# The instant both runs read when their ids are stamped; the rest of the process keeps the real clock.
SAME_INSTANT = """
import datetime
import testbed.results.folder
class SameInstant(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime.datetime(2026, 11, 27, 18, 1, 41, 123456, tzinfo=tz)
testbed.results.folder.datetime = SameInstant
from testbed.cli.main import entry
entry()  # as python -m testbed: the arguments after -c's code are the command's
"""


class SameInstant(datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime(2026, 11, 27, 18, 1, 41, 123456, tzinfo=tz)


def test_two_runs_made_in_one_instant_in_two_results_folders_get_two_ids_and_two_tags(tmp_path, monkeypatch):
    monkeypatch.setattr(testbed.results.folder, "datetime", SameInstant)
    first_id, first = make_run_dir(tmp_path / "a", "gpu-health")
    second_id, second = make_run_dir(tmp_path / "b", "gpu-health")
    # The time part is the same: the random part is what tells them apart.
    assert first_id[:20] == second_id[:20] == "20261127T180141.123Z"
    assert first_id != second_id and first.name == first_id and second.name == second_id
    assert netns.run_tag(first_id) != netns.run_tag(second_id)
    assert first.is_dir() and second.is_dir() and not any(first.iterdir())


def test_a_run_id_sorts_by_time_and_names_its_playbook():
    run_id = new_run_id("gpu-health")
    stamp, _, rest = run_id.partition("-")
    random_part, _, playbook = rest.partition("_")
    assert stamp.endswith("Z") and len(stamp) == len("20261127T180141.123Z")  # to the millisecond
    assert len(random_part) == 6 and int(random_part, 16) >= 0 and playbook == "gpu-health"


def test_a_run_never_takes_a_folder_that_exists(tmp_path):
    """make_run_dir creates the folder itself (no exist_ok): every id it returns names a folder it made, empty."""
    made = [make_run_dir(tmp_path, "p")[1] for _ in range(50)]
    assert len(set(made)) == 50 and all(not any(p.iterdir()) for p in made)


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
def test_two_netns_runs_started_in_one_instant_with_two_results_folders_both_pass(repo, tmp_path):
    require_peer("pyroute2", "the twin makes its namespaces and links with pyroute2")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SAME_INSTANT, "run", "playbooks/gpu-health.yaml", "--emulate", "--netns"]
            + ["--results", str(tmp_path / name)],
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out + err
    run_dirs = [Path(out.strip().splitlines()[-1].removeprefix("results: ")) for out, _ in outputs]
    tags = [json.loads((d / "run.json").read_text())["twin"]["netns"]["tag"] for d in run_dirs]
    assert run_dirs[0].name[:20] == run_dirs[1].name[:20] == "20261127T180141.123Z"  # stamped in one instant
    assert run_dirs[0].name != run_dirs[1].name and tags[0] != tags[1]
    for run_dir, tag in zip(run_dirs, tags, strict=True):
        checked = subprocess.run(
            [sys.executable, "-m", "testbed", "check", str(run_dir)], cwd=repo, capture_output=True, text=True
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert netns.leftovers(tag) == {"namespaces": [], "links": [], "processes": []}
