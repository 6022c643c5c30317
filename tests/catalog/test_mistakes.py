"""A user's mistakes with the commands across runs are messages with exit 2, never a traceback: a folder that cannot
be written, a reader that leaves (`| head`), a misspelled span, status or key (with the valid ones and the closest),
and a run folder the figures cannot be written in. Also `testbed spans`, and `runs untag`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from accounts import needs_root

from testbed.catalog import select_runs
from testbed.cli.main import main
from testbed.results.plots import LATENCY_CDF_FILE

NOBODY = 65534  # an account that is not the one running the tests


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


@pytest.fixture
def not_a_folder(tmp_path) -> Path:
    """An --out no one can write in, whoever runs the tests (root included): a folder under a file."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    return blocker / "figures"


def test_an_out_that_cannot_be_written_is_a_clear_error(two_runs, capsys, not_a_folder):
    results = str(two_runs[0])
    for argv in (
        ["trend", "reconfig.total", "--results", results],
        ["report", "--across", "--results", results],
        ["report", str(two_runs[1]), "--results", results],
    ):
        code, _, err = cli(capsys, *argv, "--out", str(not_a_folder))
        assert code == 2 and f"--out {not_a_folder}: cannot write the figures there" in err, (argv, err)
    folder = not_a_folder.parent.parent / "a-folder"
    folder.mkdir()
    code, _, err = cli(capsys, "export", "--results", results, "--out", str(folder))  # a folder, not a file's name
    assert code == 2 and f"{folder}" in err
    assert sorted(p.name for p in folder.parent.iterdir()) == ["a-file", "a-folder"]  # nothing half-written


@needs_root
def test_a_run_folder_the_figures_cannot_be_written_in_is_reported_from(two_runs, tmp_path, capsys):
    run = tmp_path / two_runs[1].name
    shutil.copytree(two_runs[1], run)
    # A folder report may not write into (an archive of another account's; root could write anything else)
    before = sorted(p.name for p in run.iterdir())
    os.chown(run, NOBODY, NOBODY)
    code, out, err = cli(capsys, "report", str(run))
    assert code == 0 and "reconfig.total" in out
    assert "cannot write the figures in" in err and "figures not written" in err
    assert sorted(p.name for p in run.iterdir()) == before  # tables only: nothing written into it
    page = tmp_path / "pages"
    page.mkdir()
    code, out, err = cli(capsys, "report", str(run), "--html", str(page))  # --html DIR: the page goes in it
    assert code == 0 and "drawn for the page only" in err
    html = (page / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 1 and LATENCY_CDF_FILE in html
    assert sorted(p.name for p in page.iterdir()) == ["report.html"]  # nothing half-written beside it
    assert sorted(p.name for p in run.iterdir()) == before
    assert not (tmp_path / "pages.tmp").exists()


def test_a_reader_that_leaves_ends_the_output_quietly(two_runs, repo):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line, as `| head` is after its lines
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "testbed", "trend", "reconfig.total", "--results", str(two_runs[0]), "--json"],
            cwd=repo,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert proc.returncode == 0 and proc.stderr == ""


def test_a_misspelled_span_status_or_key_lists_the_valid_ones(two_runs, capsys, tmp_path):
    results = str(two_runs[0])
    code, _, err = cli(capsys, "trend", "reconfig.totl", "--results", results)
    assert code == 2 and "'reconfig.totl'; did you mean 'reconfig.total'?" in err and "reconfig.ack" in err
    code, _, err = cli(capsys, "export", "--results", results, "--span", "reconfig.totl", "--out", str(tmp_path / "x"))
    assert code == 2 and "did you mean 'reconfig.total'?" in err and not (tmp_path / "x").exists()
    code, _, err = cli(capsys, "report", "--across", "--results", results, "--span", "reconfig.totl")
    assert code == 2 and "did you mean 'reconfig.total'?" in err
    code, _, err = cli(
        capsys, "gate", "reconfig.totl", "--baseline", "seed=0", "--candidate", "tag=x", "--results", results
    )
    assert code == 2 and "unknown key 'seed'" in err
    code, _, err = cli(capsys, "gate", "reconfig.total", "--baseline", "tags=a", "--candidate", "tag=x")
    assert code == 2 and "unknown key 'tags'; did you mean 'tag'?" in err
    code, _, err = cli(capsys, "runs", "--results", results, "--status", "sucess")
    assert code == 2 and "status 'sucess': one of ok, failed, aborted, running" in err
    code, _, err = cli(capsys, "runs", "--results", results, "--status", "abortd")
    assert code == 2 and "did you mean 'aborted'?" in err


def test_spans_lists_the_selections_spans_with_their_counts(two_runs, capsys):
    results, first, _ = two_runs
    code, out, _ = cli(capsys, "spans", "--results", str(results), "--json")
    counts = json.loads(out)
    assert code == 0 and counts["reconfig.total"] == {"runs": 2, "samples": 2 * 2 * 3}  # 2 runs, 2 trials, 3 steps
    assert set(counts) >= {"reconfig.ack", "reconfig.light", "reconfig.total"}
    code, out, _ = cli(capsys, "spans", "--results", str(results), "--tag", "no-such-tag")
    assert code == 2


def test_untag_takes_a_tag_off(two_runs, tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(two_runs[0], results)
    run = select_runs(results)[0]["folder"]
    assert cli(capsys, "runs", "tag", run, "keep", "--results", str(results))[0] == 0
    assert cli(capsys, "runs", "tag", run, "drop", "--results", str(results))[0] == 0
    code, out, _ = cli(capsys, "runs", "untag", run, "drop", "--results", str(results))
    assert code == 0 and f"untagged {run}: drop" in out
    assert select_runs(results, tag="drop") == [] and [r["folder"] for r in select_runs(results, tag="keep")] == [run]
    code, _, err = cli(capsys, "runs", "untag", run, "drop", "--results", str(results))
    assert code == 2 and "has no tag 'drop'; its tags: keep" in err


def test_a_run_folder_that_cannot_be_written_is_not_tagged_with_a_traceback(two_runs, tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(two_runs[0], results)
    run = select_runs(results)[0]["folder"]
    (results / run / "annotations.jsonl").mkdir()  # where the tag would go cannot be written (not a file)
    code, _, err = cli(capsys, "runs", "tag", run, "x", "--results", str(results))
    assert code == 2 and "annotations.jsonl" in err and "not a regular file" in err and "Traceback" not in err


def test_trend_marks_a_run_that_did_not_end_ok(two_runs, tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(two_runs[0], results)
    aborted = select_runs(results)[1]
    info = json.loads((Path(aborted["path"]) / "run.json").read_text())
    info["status"] = "aborted"
    (Path(aborted["path"]) / "run.json").write_text(json.dumps(info))
    code, out, _ = cli(capsys, "trend", "reconfig.total", "--results", str(results), "--json")
    assert code == 0 and [r["statuses"] for r in json.loads(out)] == [["ok"], ["aborted"]]
    code, out, _ = cli(capsys, "trend", "reconfig.total", "--results", str(results), "--out", str(tmp_path))
    line = next(line for line in out.splitlines() if aborted["run_id"] in line)
    assert "aborted" in line and "1 row(s) hold a run that did not end ok" in out


def test_a_misspelled_step_key_is_named_at_its_line_with_the_step_kinds(repo, tmp_path, capsys):
    text = (repo / "playbooks/ocs-reconfig.yaml").read_text()
    step = "  - {action: fabric.apply, configuration: east-west, measure: reconfig}\n"
    assert step in text
    lines = text.replace(step, step.replace("action:", "acton:"), 1).splitlines(keepends=True)
    line = next(i for i, x in enumerate(lines, 1) if "acton:" in x)
    playbook = tmp_path / "misspelled.yaml"
    playbook.write_text("".join(lines))
    results = tmp_path / "results"
    for argv in (["validate", str(playbook)], ["run", str(playbook), "--emulate", "--results", str(results)]):
        code, out, err = cli(capsys, *argv)
        said = " ".join((out + err).split())  # validate prints its problems on stdout, run on stderr
        assert code == 2, (argv, out, err)
        assert f"{playbook}:{line}:" in said and "`acton` is not a key of a step (did you mean `action`?)" in said
        assert "step kinds: fabric.apply, fabric.cycle, fabric.clear" in said and "discriminator" not in said
    assert not results.exists()  # refused before anything ran
