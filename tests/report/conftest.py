"""Synthetic run folders, written the way `testbed run` writes them: events as testbed.events.Event fed to
the real SummaryCollector, which writes trials.csv and builds summary.json.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from testbed.events import Event
from testbed.results.folder import SummaryCollector, write_json
from testbed.results.milestones import MILESTONES, measure_name, milestone_spans

T0_NS = 5_000_000_000
WALL0 = 1_700_000_000.0


class RunWriter:
    def __init__(self, path: Path, playbook: str) -> None:
        self.path = path
        self.playbook = playbook
        self.events: list[Event] = []
        self.collector = SummaryCollector()
        self.seq = 0
        self.trials = 0

    def emit(self, type_: str, op: str, mono_ns: int, trial: int | None = None, data: dict | None = None) -> None:
        self.seq += 1
        event = Event(
            seq=self.seq,
            type=type_,
            op=op,
            mono_ns=mono_ns,
            wall=WALL0 + mono_ns / 1e9,
            run=self.path.name,
            trial=trial,
            data=data or {},
        )
        self.events.append(event)
        self.collector.on_event(event)

    def finish(self) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.path / "events.jsonl", "w", encoding="utf-8") as f:
            for event in self.events:
                f.write(json.dumps(event.to_dict()) + "\n")
        self.collector.write_trials_csv(self.path / "trials.csv")
        write_json(self.path / "summary.json", self.collector.summary(self.path.name, self.playbook, "ok", self.trials))
        write_json(self.path / "run.json", {"run": self.path.name, "status": "ok", "trials": self.trials})
        return self.path


def failover_run(
    path: Path,
    trials: int = 20,
    seed: int = 1,
    scale: float = 1.0,
    skip: tuple[str, ...] = (),
) -> Path:
    """A failover run: per trial the job's first launch (job_ready, first_step), then the eight milestones
    (minus `skip`), the failover.* measures the runner derives from them, and the trial's boundaries.
    """
    rng = np.random.default_rng(seed)
    w = RunWriter(path, "gpu-failover")
    w.trials = trials
    means_ms = [40, 5, 25, 10, 150, 300, 200]  # detect .. first_step
    t = T0_NS
    for trial in range(trials):
        w.emit("mark", "trial.start", t, trial, {"sweep": {}})
        w.emit("mark", "job_ready", t + 1_000_000, trial)  # first launch: before the fault
        w.emit("mark", "first_step", t + 2_000_000, trial)
        t += 50_000_000
        marks = {MILESTONES[0]: t}
        for name, mean in zip(MILESTONES[1:], means_ms, strict=True):
            t += int(rng.gamma(8.0, mean * scale / 8.0) * 1e6)
            marks[name] = t
        for name, ns in marks.items():
            if name not in skip:
                w.emit("mark", name, ns, trial)
        trial_events = [e for e in w.events if e.trial == trial]
        for seg in milestone_spans(trial_events):
            w.emit("measure", measure_name(seg["segment"]), seg["end_ns"], trial, {"ms": seg["ms"]})
        w.emit("mark", "trial.end", t + 1_000_000, trial, {"status": "ok"})
        t += 100_000_000
    return w.finish()


def sweep_run(path: Path, per_point: int = 8, seed: int = 2) -> Path:
    """An Opus-like rail sweep: iteration.time per (delay_ms, mode); provisioning hides small delays."""
    rng = np.random.default_rng(seed)
    w = RunWriter(path, "rail-reconfig")
    delays = [0, 10, 50, 100, 250, 500, 1000]
    modes = ["static", "on-demand", "provisioning"]
    t = T0_NS
    trial = 0
    for mode in modes:
        for delay in delays:
            for _ in range(per_point):
                w.emit("mark", "trial.start", t, trial, {"sweep": {"delay_ms": delay, "mode": mode}})
                base = 400.0
                extra = {"static": 0.0, "on-demand": 2 * delay, "provisioning": max(0.0, 2 * delay - 200)}[mode]
                ms = base + extra + float(rng.normal(0, 5))
                t += int(ms * 1e6)
                w.emit("measure", "iteration.time", t, trial, {"ms": ms})
                w.emit("mark", "trial.end", t, trial, {"status": "ok"})
                trial += 1
    w.trials = trial
    return w.finish()


def straggler_run(path: Path, per_point: int = 20, seed: int = 4) -> Path:
    """A straggler-like sweep: one trial per duty cycle, each measuring the iteration time without the straggler
    (baseline.time) and with it (straggled.time), step by step; no iteration.time.
    """
    rng = np.random.default_rng(seed)
    w = RunWriter(path, "straggler")
    t = T0_NS
    duties = [0.25, 0.5, 0.75]
    for trial, duty in enumerate(duties):
        w.emit("mark", "trial.start", t, trial, {"sweep": {"duty": duty}})
        for span, slowdown in (("baseline.time", 1.0), ("straggled.time", 1.0 / (1.0 - duty))):
            for _ in range(per_point):
                ms = 20.0 * slowdown + float(rng.normal(0, 1))
                t += int(ms * 1e6)
                w.emit("measure", span, t, trial, {"ms": ms})
        w.emit("mark", "trial.end", t, trial, {"status": "ok"})
    w.trials = len(duties)
    return w.finish()


def latency_run(path: Path, n: int = 30, seed: int = 3) -> Path:
    """No failover: two reconfiguration spans, reconfig.total and link.latency (and an unrelated span)."""
    rng = np.random.default_rng(seed)
    w = RunWriter(path, "ocs-reconfig")
    w.trials = n
    t = T0_NS
    for trial in range(n):
        w.emit("mark", "trial.start", t, trial, {"sweep": {}})
        t += 1_000_000
        w.emit("measure", "reconfig.total", t, trial, {"ms": float(rng.normal(25, 2))})
        w.emit("measure", "link.latency", t, trial, {"ms": float(rng.normal(3, 0.5))})
        w.emit("measure", "reconfig.ack", t, trial, {"ms": float(rng.normal(20, 2))})
        w.emit("mark", "trial.end", t, trial, {"status": "ok"})
    return w.finish()


def plain_run(path: Path, values_ms: list[float], span: str = "reconfig.total") -> Path:
    w = RunWriter(path, "plain")
    w.trials = len(values_ms)
    t = T0_NS
    for trial, ms in enumerate(values_ms):
        w.emit("mark", "trial.start", t, trial, {"sweep": {}})
        t += int(ms * 1e6)
        w.emit("measure", span, t, trial, {"ms": ms})
        w.emit("mark", "trial.end", t, trial, {"status": "ok"})
    return w.finish()


@pytest.fixture
def runs(tmp_path) -> Callable[..., Path]:
    """runs(kind, name, **kw): a synthetic run folder under tmp_path."""
    makers = {
        "failover": failover_run,
        "sweep": sweep_run,
        "straggler": straggler_run,
        "latency": latency_run,
        "plain": plain_run,
    }

    def make(kind: str, name: str | None = None, **kw) -> Path:
        return makers[kind](tmp_path / (name or kind), **kw)

    return make
