"""`testbed runs` as a user types it: the list, its filters, --json, tag and note, and a mistaken RUN."""

from __future__ import annotations

import json
import shutil

from testbed.cli.main import main


def runs_json(capsys, *args: str) -> list[dict]:
    capsys.readouterr()
    assert main(["runs", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_runs_lists_filters_and_prints_json(two_runs, capsys):
    results, first, second = two_runs
    listed = runs_json(capsys, "--results", str(results))
    assert [r["run_id"] for r in listed] == [first.name, second.name]
    assert listed[1]["seed"] == 7 and listed[1]["path"] == str(second)
    assert runs_json(capsys, "--results", str(results), "--twin", "--status", "ok", "--playbook", "ocs-reconfig") == (
        listed
    )
    assert runs_json(capsys, "--results", str(results), "--lab") == []
    assert main(["runs", "--results", str(results)]) == 0
    table = capsys.readouterr().out
    assert "2 runs" in table and first.name in table and second.name in table


def test_tag_and_note_by_run_id_then_filter_and_reindex(two_runs, tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(two_runs[0], results)
    second = two_runs[2].name
    assert main(["runs", "tag", second, "fig3", "--results", str(results)]) == 0
    assert f"tagged {second}: fig3" in capsys.readouterr().out
    assert main(["runs", "--results", str(results), "note", str(results / second), "reseated", "fibre", "12"]) == 0
    for reindex in ((), ("--reindex",)):
        tagged = runs_json(capsys, "--results", str(results), "--tag", "fig3", *reindex)
        assert [r["run_id"] for r in tagged] == [second]
        assert [n["text"] for n in tagged[0]["notes"]] == ["reseated fibre 12"]


def test_a_mistaken_run_is_a_clear_error(two_runs, capsys, tmp_path):
    results = two_runs[0]
    capsys.readouterr()
    assert main(["runs", "tag", "20991231T000000", "fig3", "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert "no run '20991231T000000' in" in err and "testbed runs" in err and "Traceback" not in err
    assert main(["runs", "tag", "2", "fig3", "--results", str(results)]) == 2  # both runs start with 2
    assert "names 2 runs" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["runs", "note", str(tmp_path / "empty"), "x", "--results", str(results)]) == 2
    assert "a folder, but not a run" in capsys.readouterr().err
    assert main(["runs", "--results", str(tmp_path / "nowhere")]) == 2
    assert "no results folder" in capsys.readouterr().err
    assert main(["runs", "--results", str(results), "--since", "yesterday"]) == 2
    assert "--since 'yesterday': not a date" in capsys.readouterr().err


def test_reindex_reports_what_it_skipped(two_runs, tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(two_runs[0], results)
    (results / "scratch").mkdir()
    capsys.readouterr()
    assert main(["runs", "--results", str(results), "--reindex"]) == 0
    err = capsys.readouterr().err
    assert "2 runs indexed" in err
    assert "skipped" in err and "scratch: not a run: no run.json" in err.replace("\n", "")
