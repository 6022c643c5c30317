"""One way to name a run: every command that takes a run folder also takes a run id, or a unique start of one,
found in the results folders, and says on stderr which folder it resolved; an unknown or ambiguous id is an error
(exit 2) that lists the candidates.
"""

from __future__ import annotations

import json

from testbed.cli.main import main


def unique_prefix(name: str, other: str) -> str:
    return next(name[:i] for i in range(1, len(name) + 1) if not other.startswith(name[:i]))


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_report_compare_and_check_take_an_id_or_its_start(two_runs, capsys):
    results, first, second = two_runs
    prefix = unique_prefix(first.name, second.name)
    code, out, err = cli(capsys, "report", prefix, "--results", str(results), "--json")
    assert code == 0 and json.loads(out) == json.loads((first / "summary.json").read_text())
    assert f"run {prefix}: {first}" in err
    code, out, err = cli(capsys, "compare", first.name, second.name, "--results", str(results))
    assert code == 0 and f"A = {first.name}" in out and f"B = {second.name}" in out
    assert f"run {first.name}: {first}" in err and f"run {second.name}: {second}" in err
    code, out, err = cli(capsys, "check", second.name, "--results", str(results))
    assert code == 0 and f"run {second.name}: {second}" in err


def test_an_unknown_or_ambiguous_id_lists_the_candidates(two_runs, capsys):
    results, first, second = two_runs
    assert second.name.startswith(first.name[:4])  # the year
    code, _, err = cli(capsys, "report", first.name[:4], "--results", str(results))
    assert code == 2 and "names 2 runs" in err and str(first) in err and str(second) in err
    assert "Traceback" not in err
    code, _, err = cli(capsys, "compare", first.name + "x", second.name, "--results", str(results))
    assert code == 2 and f"no run '{first.name}x'" in err and f"the closest: {first.name}" in err
    code, _, err = cli(capsys, "replay", "nosuchrun", "--results", str(results / "nowhere"))
    assert code == 2 and "neither a run folder nor a run id" in err
