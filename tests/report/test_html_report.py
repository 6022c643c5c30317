"""`testbed report RUN --html`: one self-contained HTML file, opened in a real headless browser (Debian's chromium)
the way a reader opens an attachment, from a file:// address with every network lookup refused. What the reader
sees is read back from the DOM chromium renders (`--dump-dom`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from peers import require_program

from testbed.results.html_across import write_across_report
from testbed.results.html_report import DEFAULT_FILE, write_run_report
from testbed.results.milestones import MILESTONES

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Any name the page asked for would fail to resolve: a report that needed the network would show it.
    "--host-resolver-rules=MAP * ~NOTFOUND",
    # Headless chromium dumps once this much virtual time has passed with the page idle: the figures have decoded
    # and the page's own script has marked them by then.
    "--virtual-time-budget=10000",
)


def chromium(path: Path, tmp: Path, *extra: str) -> str:
    """What chromium renders of the file, as its DOM after the page's scripts ran (or, with --screenshot, a PNG)."""
    browser = require_program("chromium", "the HTML report is checked in a real browser (apt-get install chromium)")
    proc = subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'chromium-profile'}", *(extra or ("--dump-dom",))]
        + [path.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


class Page(HTMLParser):
    """The rendered DOM as a reader sees it: each table's caption and rows of cell texts, the images, the text."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.tables: list[dict] = []
        self.images: list[dict[str, str]] = []
        self.scripts = 0
        self.text: list[str] = []
        self._cell: list[str] | None = None
        self._caption: list[str] | None = None
        self._in_script = False
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        attrs = {k: v or "" for k, v in attrs}
        if tag == "table":
            self.tables.append({"caption": "", "rows": []})
        elif tag == "caption":
            self._caption = []
        elif tag == "tr":
            self.tables[-1]["rows"].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append(attrs)
        elif tag == "script":
            self.scripts += 1
            self._in_script = True

    def handle_endtag(self, tag):
        if tag == "caption" and self._caption is not None:
            self.tables[-1]["caption"] = "".join(self._caption).strip()
            self._caption = None
        elif tag in ("td", "th") and self._cell is not None:
            self.tables[-1]["rows"][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            return
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)
        if self._caption is not None:
            self._caption.append(data)

    def table(self, caption_start: str) -> list[list[str]]:
        found = [t for t in self.tables if t["caption"].startswith(caption_start)]
        assert found, f"no table captioned {caption_start!r}: {[t['caption'] for t in self.tables]}"
        return found[0]["rows"]

    def key_values(self) -> dict[str, str]:
        rows = [t for t in self.tables if not t["caption"]][0]["rows"]
        return {row[0]: row[1] for row in rows}


def text_report_rows(repo: Path, run: Path) -> dict[str, list[str]]:
    """The measured-spans rows `testbed report` prints (the terminal's own text), keyed by span."""
    proc = subprocess.run(
        [sys.executable, "-m", "testbed", "report", str(run), "--no-plots"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    rows = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line)[1:-1]]
        if len(cells) == 7 and cells[0] and cells[1].isdigit():
            rows.setdefault(cells[0], cells[1:])
    return rows


def assert_self_contained(html_text: str) -> None:
    assert re.search(r"https?:", html_text, re.IGNORECASE) is None, "an http(s) address in the report"
    assert re.search(r"""(src|href)\s*=\s*["'](?!data:)""", html_text) is None, "a reference outside the file"
    assert "default-src 'none'" in html_text  # the browser is told to fetch nothing


@pytest.fixture(scope="module")
def failover_folder(repo, tmp_path_factory) -> Path:
    """A real run: gpu-failover on the emulated twin, 3 trials (the user's command, as in tests/conftest.py)."""
    out = tmp_path_factory.mktemp("html-runs")
    proc = subprocess.run(
        [sys.executable, "-m", "testbed", "run", "playbooks/gpu-failover.yaml", "--emulate", "--trials", "3"]
        + ["--results", str(out)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Path(proc.stdout.strip().splitlines()[-1].removeprefix("results: "))


def test_a_reader_sees_the_run_its_latencies_milestones_faults_and_figures(repo, failover_folder, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "testbed", "report", str(failover_folder), "--html"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    path = failover_folder / DEFAULT_FILE
    assert proc.stdout.strip() == f"wrote {path}"
    html_text = path.read_text(encoding="utf-8")
    assert_self_contained(html_text)

    page = Page(chromium(path, tmp_path))
    run = json.loads((failover_folder / "run.json").read_text())
    summary = json.loads((failover_folder / "summary.json").read_text())

    facts = page.key_values()
    assert facts["run"] == failover_folder.name
    assert facts["status"] == "ok"
    assert facts["playbook"] == "gpu-failover (playbooks/gpu-failover.yaml)"
    assert facts["inventory"] == "emulated-rack (playbooks/inventory/emulated-rack.yaml)"
    assert facts["lab or twin"] == "twin (emulated)"
    assert facts["seed"] == "0"
    assert facts["trials"] == "3 ok / 0 failed of 3"
    assert facts["git commit"] == run["git_revision"]
    assert facts["start (UTC)"].startswith(failover_folder.name[:4])
    assert "end (UTC)" in facts

    # The latency tables: every span once (the milestones' in their table, the others in the next), each with the
    # very numbers (median, its CI, ...) the text report prints; no table repeats another's numbers.
    printed = text_report_rows(repo, failover_folder)
    milestones = {row[0]: row[1:] for row in page.table("failover milestones")[1:]}
    captions = [t["caption"] for t in page.tables]
    assert not [c for c in captions if "measured spans" in c]  # every span of this run is a milestone's
    assert set(milestones) == set(summary["spans"]) and list(milestones)[-1] == "failover.total"
    for span, cells in milestones.items():
        assert cells == printed[span], span
    assert milestones["failover.total"][0] == "3"

    # The timeline: an SVG, and each trial's time since fault_injected at every milestone, in milestone order.
    assert '<svg role="img" aria-label="failover timeline"' in html_text
    timeline = page.table("ms since fault_injected")
    assert timeline[0] == ["trial", *MILESTONES]
    assert [row[0] for row in timeline[1:]] == ["0", "1", "2"]
    for row in timeline[1:]:
        times = [float(v) for v in row[1:]]
        assert times[0] == 0.0 and times == sorted(times)
        assert f"{times[-1]:.3f}" in {f"{v:.3f}" for v in _totals(failover_folder)}

    faults = page.table("each fault injected")
    assert len(faults) == 4
    for row in faults[1:]:
        assert row[3] == "gpu.fail" and row[5] == "ok" and row[6] == "ok" and row[8] == "ok"

    # Every figure the run has is on the page, and the browser decoded each.
    pngs = sorted(p.name for p in failover_folder.glob("*.png"))
    assert {"failover_cdf.png", "failover_timeline.png"} <= set(pngs)
    assert sorted(img["alt"] for img in page.images) == pngs
    for img in page.images:
        assert int(img["data-natural-width"]) > 100, img["alt"]
    assert "did not decode" not in "".join(page.text)

    # And it renders: a screenshot that is more than a blank page.
    shot = tmp_path / "shot.png"
    chromium(path, tmp_path, f"--screenshot={shot}", "--window-size=1200,1600")
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[0] >= 1600 and (pixels[..., :3] < 0.5).mean() > 0.005


def _totals(run: Path) -> list[float]:
    lines = (run / "trials.csv").read_text().splitlines()[1:]
    return [float(line.split(",")[-2]) for line in lines if ",failover.total," in line]


WALL0 = 1_700_000_000.0
HOSTILE = "<script>document.body.dataset.pwned='yes'</script><img src=x onerror=\"document.body.dataset.pwned='img'\">"


def test_strings_from_the_run_show_as_text_and_never_run(runs, tmp_path):
    folder = runs("failover", "hostile", trials=6)
    summary = json.loads((folder / "summary.json").read_text())
    summary["playbook"] = "fig3 " + HOSTILE
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "run.json").write_text(
        json.dumps({"run": folder.name, "status": "failed", "error": "device said " + HOSTILE, "emulate": True})
    )
    with open(folder / "events.jsonl", "a", encoding="utf-8") as f:
        base = {"run": folder.name, "trial": 5, "step": "failover " + HOSTILE, "device": "gpu01"}
        data = {"fault": "gpu.fail@rank0", "kind": "gpu.fail", "host": "gpu01"}
        f.write(
            json.dumps(
                {**base, "seq": 9001, "type": "invoke", "op": "fault.inject", "mono_ns": 1, "wall": WALL0, "data": data}
            )
            + "\n"
        )
        fail = {**data, "error": "refused: " + HOSTILE}
        f.write(
            json.dumps(
                {**base, "seq": 9002, "type": "fail", "op": "fault.inject", "mono_ns": 2, "wall": WALL0, "data": fail}
            )
            + "\n"
        )

    path = write_run_report(folder, tmp_path / "out" / "hostile.html", plots=False)
    assert_self_contained(path.read_text(encoding="utf-8"))
    dom = chromium(path, tmp_path)
    page = Page(dom)

    assert "data-pwned" not in dom  # neither the script nor the image's handler ran
    assert page.scripts == 1  # the report's own, nothing from the run
    assert [img for img in page.images] == []  # the hostile <img> is text, not an image
    facts = page.key_values()
    assert facts["playbook"] == "fig3 " + HOSTILE
    assert facts["error"] == "device said " + HOSTILE
    faults = page.table("each fault injected")
    assert faults[1][1] == "failover " + HOSTILE
    assert faults[1][5] == "failed" and faults[1][9] == "refused: " + HOSTILE
    assert HOSTILE in "".join(page.text)  # the whole string reads as it was written, in the heading too


def test_a_run_without_failover_has_its_spans_and_no_timeline(runs, tmp_path):
    folder = runs("latency")
    path = write_run_report(folder)
    assert path == folder / DEFAULT_FILE
    html_text = path.read_text(encoding="utf-8")
    assert_self_contained(html_text)
    page = Page(chromium(path, tmp_path))
    shown = {row[0] for row in page.table("measured spans (all trials)")[1:]}
    assert shown == {"reconfig.total", "link.latency", "reconfig.ack"}
    assert "Failover milestones" not in "".join(page.text)
    assert [img["alt"] for img in page.images] == ["latency_cdf.png"]
    assert int(page.images[0]["data-natural-width"]) > 100


def test_a_folder_that_is_not_a_run_is_refused_without_a_traceback(repo, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "testbed", "report", str(tmp_path), "--html"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "no summary.json here" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / DEFAULT_FILE).exists()


def test_several_runs_side_by_side_and_pooled(runs, tmp_path):
    slow = runs("failover", "slow", trials=8, seed=4, scale=2.0)
    fast = runs("failover", "fast", trials=12, seed=5)
    path = write_across_report([slow, fast], tmp_path / "across.html")
    assert_self_contained(path.read_text(encoding="utf-8"))
    page = Page(chromium(path, tmp_path))

    assert [row[0] for row in page.table("")[1:]] == ["slow", "fast"]  # the runs, in the order given
    side = page.table("p50 ms [95% CI of the median] n, per run")
    assert side[0][0] == "run" and "failover.total" in side[0]  # the runs as rows: any number of them reads
    assert [row[0] for row in side[1:]] == ["slow", "fast"]
    totals = [row[side[0].index("failover.total")] for row in side[1:]]
    for cell, folder in zip(totals, (slow, fast), strict=True):
        s = json.loads((folder / "summary.json").read_text())["spans"]["failover.total"]
        ci = s["p50_ci95_ms"]
        assert cell == f"{s['p50_ms']:.3f} [{ci[0]:.2f}-{ci[1]:.2f}] n={s['n']}"
    pooled = {row[0]: row[1:] for row in page.table("every sample of the 2 runs pooled")[1:]}
    assert pooled["failover.total"][0] == "20"
    assert float(totals[1].split()[0]) < float(pooled["failover.total"][1]) < float(totals[0].split()[0])


def test_several_sweeps_are_pooled_point_by_point(runs, tmp_path):
    a = runs("sweep", "a", seed=2)
    b = runs("sweep", "b", seed=3)
    path = write_across_report([a, b], tmp_path / "across.html")
    page = Page(chromium(path, tmp_path))
    side = page.table("p50 ms [95% CI of the median] n, per run and sweep point")
    assert side[0] == ["run", "sweep point", "iteration.time"]
    assert len(side) == 1 + 2 * 21 and side[1][:2] == ["a", "delay_ms=0 mode=static"]
    pooled = page.table("every sample of the 2 runs pooled, delay_ms=1000 mode=on-demand")
    assert pooled[1][0] == "iteration.time" and pooled[1][1] == "16"  # 8 samples of that point in each run, no more
    assert not any(t["caption"] == "every sample of the 2 runs pooled" for t in page.tables)  # no pool of all points


def test_a_sweeps_figure_comes_before_its_tables_and_the_per_point_tables_are_folded(runs):
    """A sweep's page opens on its figure; the latency tables follow; the tables of each sweep point (21 here, one
    a point) are folded under one line, not thousands of pixels the reader scrolls past.
    """
    run = runs("sweep")
    path = write_run_report(run)
    text = path.read_text()
    figure, spans = text.index('<img src="data:image/png'), text.index("measured spans (all trials)")
    assert figure < spans
    folded = text[text.index('<details class="points">') : text.index("</details>")]
    assert "<summary>every span at each of the 21 sweep points</summary>" in folded
    assert folded.count("<caption>sweep point ") == 21
    assert text.count("<caption>sweep point ") == 21  # none outside the fold


def test_each_span_is_in_one_table_only(runs):
    """A run with failover milestones and other spans: the milestones' numbers in their table, the rest in the table
    of other spans; none twice.
    """
    from testbed.results.html_report import latency_section

    summary = json.loads((runs("failover") / "summary.json").read_text())
    summary["spans"]["reconfig.total"] = summary["spans"]["failover.reconfigure"]
    html_text = latency_section(summary)
    page = Page(html_text)
    milestones = [row[0] for row in page.table("failover milestones")[1:]]
    others = [row[0] for row in page.table("other measured spans (all trials)")[1:]]
    assert others == ["reconfig.total"] and "failover.total" in milestones
    assert sorted(milestones + others) == sorted(summary["spans"])
