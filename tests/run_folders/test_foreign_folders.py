"""A folder another account wrote (a colleague's archive, one planted in a shared results folder) is read by the
read-only commands, labelled with its owner, and never written into; a link in it to a file only the reader may
read is never followed into what the reader writes (docs/run-folders.md). The accounts are real: the folder is
planted by another uid, in a shared folder, as in a shared lab.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from accounts import MALLORY, as_account, needs_root, shared_folder
from folders import dead_pid, healable_run, summarised

from testbed.cli.main import main

pytestmark = [needs_root, pytest.mark.unchecked_history("the planted run is left as its planter wrote it")]

SECRET = b"root's secret: only root may read this\n"


@pytest.fixture
def planted(tmp_path) -> tuple[Path, Path]:
    """(mallory's run folder in a shared results folder, the root-only file its figure links to)."""
    secret_dir = tmp_path / "root-only"
    secret_dir.mkdir(mode=0o755)
    secret = secret_dir / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    results = shared_folder()
    twin_pid = dead_pid()

    def plant() -> Path:
        run = summarised(healable_run(results / "run", twin_pid=twin_pid, measures=6))
        (run / "latency_cdf.png").symlink_to(secret)  # a "figure" the reader's report would embed
        return run

    return as_account(MALLORY, plant), secret


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.iterdir()}


def test_report_html_of_another_s_folder_goes_where_the_user_says_and_embeds_no_linked_file(planted, tmp_path):
    run, _ = planted
    before = listing(run)
    out = tmp_path / "report.html"

    assert main(["report", str(run), "--html", str(out)]) == 0

    page = out.read_text(encoding="utf-8")
    assert base64.b64encode(SECRET).decode() not in page and "only root may read" not in page
    assert f"uid {MALLORY}" in page  # the folder's owner, shown with the run
    assert 'alt="latency_cdf.png"' in page  # the figure drawn from the run's data, in a private folder of root's
    assert listing(run) == before  # nothing written into it: no figure, no page, no .tmp


def test_report_of_another_s_folder_writes_nothing_into_it_and_names_its_owner(planted, capsys):
    run, _ = planted
    before = listing(run)

    assert main(["report", str(run)]) == 0
    said = capsys.readouterr()
    assert f"owned by uid {MALLORY}" in said.out and "figures not written" in said.err
    assert main(["report", str(run), "--html"]) == 2
    assert "pass --html FILE" in capsys.readouterr().err
    assert listing(run) == before


def test_a_figure_linked_to_a_root_only_file_is_named_not_embedded_in_root_s_own_report(planted, tmp_path):
    run, secret = planted
    out = tmp_path / "report.html"

    assert main(["report", str(run), "--html", str(out), "--no-plots"]) == 0  # the folder's own figures only

    page = out.read_text(encoding="utf-8")
    assert base64.b64encode(SECRET).decode() not in page
    assert f"latency_cdf.png: not embedded: {run / 'latency_cdf.png'}: a symbolic link (to {secret})" in page


def test_check_and_compare_read_another_s_folder_and_say_whose_it_is(planted, capsys):
    run, _ = planted
    before = listing(run)

    main(["check", str(run)])  # an aborted run: its verdict is the check's business; who owns it is ours
    assert f"is owned by uid {MALLORY}: read as another's record" in capsys.readouterr().out
    assert main(["compare", str(run), str(run)]) == 0
    assert f"owned by uid {MALLORY}" in capsys.readouterr().out
    assert listing(run) == before
    assert os.stat(run).st_uid == MALLORY
