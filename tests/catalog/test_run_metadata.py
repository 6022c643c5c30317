"""Metadata given at run time: `testbed run --tag T --note TEXT --param K=V` is kept in the run's folder, indexed,
and selects the run (`runs --param`, `--tag`); a mistake in it is refused before the run starts. A run whose output
is not a terminal prints a line per trial.
"""

from __future__ import annotations

import json
from pathlib import Path

from testbed.catalog import select_runs
from testbed.cli.main import main


def run_ocs_reconfig(repo: Path, results: Path, *extra: str) -> Path:
    playbook = str(repo / "playbooks/ocs-reconfig.yaml")
    assert main(["run", playbook, "--emulate", "--trials", "2", "--results", str(results), *extra]) == 0
    return max(p for p in results.iterdir() if p.is_dir())  # run ids start with their UTC start time


def test_tags_notes_and_params_given_at_run_time_select_the_run(ray_cluster, repo, tmp_path, capsys):
    results = tmp_path / "results"
    plain = run_ocs_reconfig(repo, results)
    tagged = run_ocs_reconfig(
        repo, results, "--tag", "fibre20", "--tag", "rack2", "--note", "fibre swapped", "--param", "fibre_m=20"
    )
    printed = capsys.readouterr().out  # not a terminal, as in a CI log: a line per trial
    assert "trial 1/2 ok" in printed and "trial 2/2 ok" in printed and "eta 0:00:00" in printed
    (run,) = select_runs(results, param={"fibre_m": "20"})
    assert run["path"] == str(tagged) and run["tags"] == ["fibre20", "rack2"] and run["params"] == {"fibre_m": "20"}
    assert [n["text"] for n in run["notes"]] == ["fibre swapped"]
    assert select_runs(results, run=plain.name)[0]["params"] == {}
    capsys.readouterr()
    assert main(["runs", "--results", str(results), "--param", "fibre_m=20", "--json"]) == 0
    assert [r["folder"] for r in json.loads(capsys.readouterr().out)] == [tagged.name]
    assert main(["runs", "--results", str(results)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if tagged.name in line)
    assert "fibre20 rack2 fibre_m=20" in line  # the tags, even when the output is not a terminal
    # The run's own report, named by its id, says them too, with its status and its inventory by content.
    assert main(["report", tagged.name, "--results", str(results), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    digest = run["inventory_digest"][:6]
    assert f"inventory emulated-rack@{digest} (" in printed and "twin  tags fibre20 rack2  params fibre_m=20" in printed
    assert "note: fibre swapped" in printed and "status ok" in printed
    # ... and so does its HTML page.
    page = tmp_path / "tagged.html"
    assert main(["report", tagged.name, "--results", str(results), "--no-plots", "--html", str(page)]) == 0
    text = page.read_text()
    assert f"emulated-rack@{run['inventory_digest'][:12]}" in text and "fibre20 rack2" in text
    assert "fibre_m=20" in text and "fibre swapped" in text


def test_a_mistake_in_the_metadata_is_refused_before_the_run(repo, tmp_path, capsys):
    playbook = str(repo / "playbooks/ocs-reconfig.yaml")
    for extra, said in (
        (["--param", "fibre_m"], "--param 'fibre_m': give KEY=VALUE"),
        (["--tag", "two words"], "--tag 'two words': a tag is one word"),
        (["--note", " "], "--note: an empty note"),
    ):
        capsys.readouterr()
        code = main(["run", playbook, "--emulate", "--results", str(tmp_path / "results"), *extra])
        err = capsys.readouterr().err
        assert code == 2 and said in err and "Traceback" not in err
        assert not (tmp_path / "results").exists()  # nothing ran
