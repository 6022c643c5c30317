"""compare_runs / testbed.results.compare.main: two runs side by side, verdicts no stronger than the CIs allow."""

from __future__ import annotations

import io

import numpy as np
from rich.console import Console

from testbed.results.compare import FASTER, NO_CI, OVERLAP, SLOWER, compare_runs, main, verdict


def render(renderable) -> str:
    console = Console(record=True, width=220, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def rows(text: str, span: str) -> tuple[list[str], list[str]]:
    """The cells of a span's two lines in the side-by-side table: run A's (with ratio and verdict), run B's."""
    lines = [line for line in text.splitlines() if line.startswith("│")]
    i = next(i for i, line in enumerate(lines) if line.split("│")[1].strip() == span)
    a, b = ([c.strip() for c in line.split("│")[1:-1]] for line in lines[i : i + 2])
    assert (a[1], b[1]) == ("A", "B")
    return a, b


def row(text: str, span: str) -> str:
    return "│".join(rows(text, span)[0])


def samples(mean: float, n: int, seed: int) -> list[float]:
    return [float(v) for v in np.random.default_rng(seed).normal(mean, mean * 0.05, n)]


def test_clearly_different_runs(runs):
    a = runs("plain", "a", values_ms=samples(100, 20, 1))
    b = runs("plain", "b", values_ms=samples(50, 20, 2))
    ra, rb = rows(render(compare_runs(a, b)), "reconfig.total")
    assert ra[6] == FASTER
    assert ra[2] == rb[2] == "20"  # n of each run
    assert abs(float(ra[5]) - 0.5) < 0.05  # ratio of medians B/A
    assert float(ra[3].split()[0]) > float(rb[3].split()[0])  # medians: A's above B's
    assert float(ra[4]) > float(rb[4])  # max
    reverse, _ = rows(render(compare_runs(b, a)), "reconfig.total")
    assert reverse[6] == SLOWER
    assert abs(float(reverse[5]) - 2.0) < 0.2


def test_overlapping_runs_claim_no_difference(runs):
    a = runs("plain", "a", values_ms=samples(100, 20, 1))
    b = runs("plain", "b", values_ms=samples(101, 20, 2))
    line = row(render(compare_runs(a, b)), "reconfig.total")
    assert OVERLAP in line
    assert FASTER not in line and SLOWER not in line


def test_small_runs_cannot_tell(runs):
    a = runs("plain", "a", values_ms=[100.0, 101.0, 99.0])
    b = runs("plain", "b", values_ms=[10.0, 11.0, 9.0])
    line = row(render(compare_runs(a, b)), "reconfig.total")
    assert NO_CI in line
    assert "n<6" in line


def test_spans_in_one_run_only_are_listed_separately(runs):
    a = runs("failover", "a", trials=8)
    b = runs("latency", "b", n=8)
    text = render(compare_runs(a, b))
    assert "no span measured by both runs" in text
    only_a = text.index("only in A")
    only_b = text.index("only in B")
    assert only_a < text.index("failover.total") < only_b < text.index("reconfig.total")


def test_full_failover_runs_side_by_side(runs):
    a = runs("failover", "a", seed=1)
    b = runs("failover", "b", seed=5, scale=0.5)
    text = render(compare_runs(a, b))
    assert FASTER in row(text, "failover.total")
    assert "only in" not in text
    assert "p99" not in text.split("No p99")[0]  # no p99 column from 20 samples


def test_verdict_rules():
    a = {"n": 20, "p50_ms": 10, "p50_ci95_ms": [9, 11]}
    assert verdict(a, {"n": 20, "p50_ms": 5, "p50_ci95_ms": [4, 8.9]}) == FASTER
    assert verdict(a, {"n": 20, "p50_ms": 12, "p50_ci95_ms": [11.1, 13]}) == SLOWER
    assert verdict(a, {"n": 20, "p50_ms": 12, "p50_ci95_ms": [11, 13]}) == OVERLAP  # touching counts
    assert verdict(a, {"n": 5, "p50_ms": 1, "p50_ci95_ms": None}) == NO_CI


def test_main_exit_codes(runs, tmp_path, capsys):
    a = runs("plain", "a", values_ms=samples(100, 10, 1))
    b = runs("plain", "b", values_ms=samples(100, 10, 2))
    out = io.StringIO()
    assert main(str(a), str(b), out=out) == 0
    assert "reconfig.total" in out.getvalue()
    not_a_run = tmp_path / "not-a-run"
    not_a_run.mkdir()
    assert main(str(a), str(not_a_run), out=io.StringIO()) == 2
    assert main(str(tmp_path / "missing"), str(b), out=io.StringIO()) == 2
    assert "summary.json" in capsys.readouterr().err
