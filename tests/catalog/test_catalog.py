"""The catalog indexes every real run as it ends, rebuilds to the same state from the folders, selects by every
filter, keeps tags and notes across a rebuild, skips what is not a run, and survives writers ending at once.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from catalog_copies import copy_run

from testbed.catalog import add_note, add_tag, reindex, select_runs, span_samples, sync
from testbed.catalog.schema import TABLES, catalog_path
from testbed.contracts.errors import UserError


def table_dump(results: Path) -> dict[str, list[tuple]]:
    """Every row of every table, in a stable order, without the time each run was indexed."""
    conn = sqlite3.connect(catalog_path(results))
    conn.row_factory = sqlite3.Row
    folders = dict(conn.execute("SELECT id, folder FROM runs").fetchall())
    out = {}
    for table in TABLES:
        rows = [dict(r) for r in conn.execute(f"SELECT * FROM {table}")]
        for r in rows:  # a run's id is the catalog's own; its folder is what stays
            r.pop("indexed_at", None)
            r.pop("id", None)
            if "run" in r:
                r["run"] = folders[r["run"]]
        out[table] = sorted(tuple(sorted(r.items())) for r in rows)
    conn.close()
    return out


def test_a_run_is_indexed_when_it_ends(two_runs):
    results, first, second = two_runs
    runs = select_runs(results, sync_first=False)  # what the runs' own ends wrote, nothing synced since
    assert [r["folder"] for r in runs] == [first.name, second.name]
    for r in runs:
        assert r["status"] == "ok"
        assert (r["playbook"], r["inventory"], r["target"]) == ("ocs-reconfig", "emulated-rack", "twin")
        assert (r["trials_planned"], r["trials_ok"], r["trials_failed"]) == (2, 2, 0)
        assert r["switches"] == [
            {"name": "ocs1", "kind": "ocs", "driver": "polatis-scpi", "transport": "visa", "interface": "scpi"}
        ]
        info = json.loads(Path(r["path"], "run.json").read_text())
        assert r["git_commit"] and info["git_revision"].startswith(r["git_commit"])
        assert r["host"] == info["host"]["hostname"] and r["user"] == info["host"]["user"]
        # The ISO times are to the second and a two-trial run can start and end within one; duration_s is the
        # difference of the recorded times themselves.
        assert r["started"] <= r["ended"] and r["duration_s"] > 0
    assert [r["seed"] for r in runs] == [0, 7]
    # Every measured sample, as trials.csv has them.
    samples = span_samples(results, "reconfig.total", sync_first=False)
    assert len(samples) == 2 * 2 * 3  # two runs, two trials, three configurations
    for folder in (first, second):
        csv_rows = [line.split(",") for line in (folder / "trials.csv").read_text().splitlines()[1:]]
        expected = sorted(float(row[4]) for row in csv_rows if row[3] == "reconfig.total")
        assert sorted(s["ms"] for s in samples if s["folder"] == folder.name) == pytest.approx(expected, abs=1e-6)
    assert {s["trial"] for s in samples} == {0, 1} and all(s["sweep"] == {} for s in samples)


def test_reindex_rebuilds_the_same_catalog(two_runs, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(two_runs[0], results)
    sync(results)  # a copied results folder has no catalog of its own yet: its first query makes it
    indexed = table_dump(results)
    report = reindex(results)
    assert sorted(report.indexed) == sorted(p.name for p in (two_runs[1], two_runs[2]))
    assert report.skipped == []
    assert table_dump(results) == indexed
    catalog_path(results).unlink()  # the folders alone rebuild it
    for suffix in ("-wal", "-shm"):
        Path(str(catalog_path(results)) + suffix).unlink(missing_ok=True)
    sync(results)
    assert table_dump(results) == indexed


def test_filters(two_runs):
    results, first, second = two_runs
    names = lambda **f: [r["folder"] for r in select_runs(results, **f)]  # noqa: E731
    both = [first.name, second.name]
    assert names(playbook="ocs-reconfig") == both
    assert names(playbook="gpu-failover") == []
    assert names(inventory="emulated-rack") == both
    assert names(target="twin") == both and names(target="lab") == []
    assert names(status="ok") == both and names(status="failed") == []
    commit = select_runs(results)[0]["git_commit"]
    assert names(commit=commit[:7]) == both and names(commit="0000000") == []
    day = select_runs(results)[0]["started"][:10]
    assert names(since=day, until=day) == both
    assert names(until="2000-01-01") == [] and names(since="2999-01-01") == []
    assert names(run=second.name) == [second.name]
    assert names(protocol="polatis-scpi") == both and names(protocol="netconf") == []
    with pytest.raises(UserError, match="--since 'last week': not a date"):
        select_runs(results, since="last week")
    with pytest.raises(UserError, match="no results folder"):
        select_runs(results / "nowhere")


def test_tags_and_notes_are_kept_in_the_run_folder_and_survive_a_reindex(two_runs, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(two_runs[0], results)
    run = results / two_runs[2].name
    add_tag(run, "fig3")
    add_tag(run, "fig3")  # once is enough
    add_tag(run, "seed7")
    add_note(run, "fibre 12 reseated before this run")
    with pytest.raises(UserError, match="one word"):
        add_tag(run, "two words")
    for rebuild in (sync, reindex):
        rebuild(results)
        tagged = select_runs(results, tag="fig3")
        assert [r["folder"] for r in tagged] == [run.name]
        assert tagged[0]["tags"] == ["fig3", "seed7"]
        assert [n["text"] for n in tagged[0]["notes"]] == ["fibre 12 reseated before this run"]
        assert select_runs(results, tag=["fig3", "other"]) == []


@pytest.mark.unchecked_history("a run's history damaged on purpose")
def test_a_folder_that_is_not_a_run_or_is_damaged_is_reported_and_skipped(two_runs, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(two_runs[0], results)
    good = results / two_runs[1].name
    (results / "plots").mkdir()  # not a run
    damaged = copy_run(good, results, 1)
    lines = (damaged / "events.jsonl").read_text().splitlines(keepends=True)
    lines[3] = "{not json\n"  # damage no kill explains: not a torn last line
    (damaged / "events.jsonl").write_text("".join(lines))
    bad_json = copy_run(good, results, 2)
    (bad_json / "run.json").write_text("{")
    report = sync(results)
    skipped = dict(report.skipped)
    assert skipped["plots"] == "not a run: no run.json"
    assert skipped[damaged.name].startswith("damaged: ") and "events.jsonl:4: not a JSON line" in skipped[damaged.name]
    assert skipped[bad_json.name].startswith("damaged: ") and "run.json: not JSON" in skipped[bad_json.name]
    assert {r["folder"] for r in select_runs(results)} == {two_runs[1].name, two_runs[2].name}
    # A run indexed, then damaged: its rows go.
    (good / "run.json").write_text("{")
    assert good.name in sync(results).removed
    assert [r["folder"] for r in select_runs(results)] == [two_runs[2].name]


INDEXER = """
import sys
from pathlib import Path
from testbed.catalog import index_run
for folder in sys.argv[1:]:
    index_run(Path(folder))
"""


def test_runs_ending_at_once_never_corrupt_the_catalog(two_runs, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    copies = [copy_run(two_runs[1], results, i, started_offset_s=i) for i in range(48)]
    writers = [
        subprocess.Popen([sys.executable, "-c", INDEXER, *map(str, copies[i::8])], stderr=subprocess.PIPE, text=True)
        for i in range(8)
    ]
    writers.append(  # and a rebuild among them
        subprocess.Popen(
            [sys.executable, "-c", f"from testbed.catalog import reindex; reindex({str(results)!r})"],
            stderr=subprocess.PIPE,
            text=True,
        )
    )
    for w in writers:
        _, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
    conn = sqlite3.connect(catalog_path(results))
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 48
    spans_per_run = len((two_runs[1] / "trials.csv").read_text().splitlines()) - 1
    assert conn.execute("SELECT count(*) FROM spans").fetchone()[0] == 48 * spans_per_run
    orphans = "SELECT count(*) FROM spans WHERE run NOT IN (SELECT id FROM runs)"
    assert conn.execute(orphans).fetchone()[0] == 0
    assert conn.execute("SELECT count(DISTINCT run) FROM trials").fetchone()[0] == 48
    conn.close()
