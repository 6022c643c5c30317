"""Heater calibration for the tree layout: sweep, fit a*sin(b*P + c) + d, store P_pi and offsets.

Model (per heater h, P in mW of electrical power): theta_h = phi0_h + alpha_h * (P_h + k*(P_{h-1} + P_{h+1})),
k the thermal crosstalk to the physical neighbours. P_pi = pi / alpha.

Why this works with output photodiodes only: in the tree layout light of one input has a single path to
each output, and light of different inputs (different lasers) adds in power. So while one heater is swept,
every output power is const + A*cos(theta) (no interference term): its extremes are exactly the BAR and
CROSS states, and the topology says which one is the maximum.
1. Splitters, top down within each tree (ancestors already routed toward the cell): signal = light in the
   cell's CROSS subtree outputs minus its BAR subtree outputs; maximal at CROSS.
2. Crosstalk k: a few splitters swept again with both neighbours at p_ref; k = phase shift / (alpha*2*p_ref).
3. Combiners: splitters route input i to output (i+s) mod N; each combiner tree then has one lit leaf; the
   cells on that path are swept leaf to root, all trees in parallel (each output sees only its own tree);
   the maximum is BAR if the lit arm is the upper one, else CROSS. Weak fits retry with the next shift s.
4. Splitters whose fit was weak are swept again with every combiner tree passing that input.
Every input must carry light (at any power): a dark input's splitter tree cannot be calibrated.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from drivers.mesh.layout import (
    BAR,
    LAYOUT_NAME,
    check_size,
    combiner_heater,
    heater_count,
    path_nodes,
    splitter_heater,
)

TWO_PI = 2 * math.pi


class Bench(Protocol):
    """What calibration needs from a driver: heater powers in, output photodiode powers out."""

    def set_heater_powers(self, powers: dict[int, float]) -> None: ...

    def read_output_mw(self) -> np.ndarray: ...


@dataclass
class HeaterCal:
    phi0_rad: float = 0.0
    alpha_rad_per_mw: float = math.pi / 30.0
    amplitude_mw: float = 0.0  # fit amplitude (signal strength); 0 = not calibrated
    rms_mw: float = 0.0  # fit residual
    r_ohm: float = 1000.0

    @property
    def p_pi_mw(self) -> float:
        return math.pi / self.alpha_rad_per_mw


@dataclass
class Calibration:
    size: int
    heaters: list[HeaterCal]
    crosstalk: float = 0.0
    layout: str = LAYOUT_NAME
    convention: str = "theta=pi BAR, theta=0 CROSS; T=B diag(e^{i theta},1) B, B=[[1,i],[i,1]]/sqrt2"
    meta: dict = field(default_factory=dict)

    # ---- persistence ----------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {
            "size": self.size,
            "layout": self.layout,
            "convention": self.convention,
            "crosstalk": self.crosstalk,
            "meta": self.meta,
            "heaters": [{**asdict(h), "p_pi_mw": h.p_pi_mw} for h in self.heaters],
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        tmp.replace(path)
        return path

    @classmethod
    def from_json(cls, d: dict) -> Calibration:
        fields = set(HeaterCal.__dataclass_fields__)
        heaters = [HeaterCal(**{k: v for k, v in h.items() if k in fields}) for h in d["heaters"]]
        return cls(
            size=d["size"],
            heaters=heaters,
            crosstalk=d.get("crosstalk", 0.0),
            layout=d.get("layout", ""),
            meta=d.get("meta", {}),
        )

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        return cls.from_json(json.loads(Path(path).read_text()))

    # ---- use --------------------------------------------------------------------------------------

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.array([h.phi0_rad for h in self.heaters]), np.array([h.alpha_rad_per_mw for h in self.heaters]))

    def powers_for(self, theta: dict[int, float] | np.ndarray, fixed: np.ndarray | None = None) -> np.ndarray:
        """Heater powers (mW) that give the target phases, compensating crosstalk.

        `theta` maps heater -> target phase (or is a full array); heaters not in it keep `fixed` (default 0).
        """
        count = len(self.heaters)
        phi0, alpha = self.arrays()
        if isinstance(theta, dict):
            target = np.array(list(theta.keys()), dtype=int)
            want = np.array(list(theta.values()), dtype=float)
        else:
            target, want = np.arange(count), np.asarray(theta, dtype=float)
        p = np.zeros(count) if fixed is None else np.array(fixed, dtype=float)
        period = TWO_PI / alpha[target]
        branch = None
        for _ in range(30):
            nb = np.zeros(count)
            nb[1:] += p[:-1]
            nb[:-1] += p[1:]
            raw = (want - phi0[target]) / alpha[target] - self.crosstalk * nb[target]
            if branch is None:
                branch = np.ceil(-raw / period)  # the smallest power >= 0 on the first pass
            branch = np.where(raw + branch * period < 0, branch + 1, branch)  # then keep the branch
            new = raw + branch * period
            done = np.max(np.abs(new - p[target]), initial=0.0) < 1e-9
            p[target] = new
            if done:
                break
        return p

    def powers_for_states(self, states: list[int]) -> np.ndarray:
        return self.powers_for(np.pi * np.asarray(states, dtype=float))

    def phases(self, p: np.ndarray) -> np.ndarray:
        phi0, alpha = self.arrays()
        nb = np.zeros(len(p))
        nb[1:] += p[:-1]
        nb[:-1] += p[1:]
        return phi0 + alpha * (p + self.crosstalk * nb)

    def states_of(self, p: np.ndarray) -> list[int]:
        """BAR/CROSS per heater from applied powers (the nearer of the two)."""
        return [BAR if math.cos(t) < 0 else 1 - BAR for t in self.phases(np.asarray(p, dtype=float))]


# ---- fitting ---------------------------------------------------------------------------------------


@dataclass
class Fit:
    a: float
    b: float
    c: float
    d: float
    rms: float

    @property
    def snr(self) -> float:
        return self.a / max(self.rms, 1e-15)


def fit_sine(x: np.ndarray, y: np.ndarray, b_min: float, b_max: float, grid: int = 160) -> Fit:
    """Least-squares a*sin(b*x + c) + d with a >= 0: a grid over b (linear least squares for the rest,
    batched), then a golden-section refinement of b. NumPy only.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)

    def solve(bs: np.ndarray):
        bx = bs[:, None] * x[None, :]
        m = np.stack([np.sin(bx), np.cos(bx), np.ones_like(bx)], axis=2)  # (G, n, 3)
        mt = np.transpose(m, (0, 2, 1))
        coef = np.linalg.solve(mt @ m + 1e-12 * np.eye(3), mt @ y[None, :, None])[:, :, 0]
        res = np.sum((np.einsum("gnk,gk->gn", m, coef) - y[None, :]) ** 2, axis=1)
        return coef, res

    bs = np.linspace(b_min, b_max, grid)
    _, res = solve(bs)
    k = int(np.argmin(res))
    lo, hi = bs[max(k - 1, 0)], bs[min(k + 1, grid - 1)]
    g = (math.sqrt(5) - 1) / 2
    for _ in range(28):
        m1, m2 = hi - g * (hi - lo), lo + g * (hi - lo)
        _, r = solve(np.array([m1, m2]))
        if r[0] < r[1]:
            hi = m2
        else:
            lo = m1
    b = (lo + hi) / 2
    coef, res = solve(np.array([b]))
    s, cc, d = coef[0]
    return Fit(a=math.hypot(s, cc), b=b, c=math.atan2(cc, s), d=d, rms=math.sqrt(res[0] / len(x)))


# ---- the routine ------------------------------------------------------------------------------------


@dataclass
class CalibrationSettings:
    points: int = 24
    sweep_max_mw: float = 80.0
    b_range: tuple[float, float] = (TWO_PI / 320.0, TWO_PI / 20.0)  # alpha search: P_2pi 20..320 mW
    crosstalk_samples: int = 6
    p_ref_mw: float = 40.0
    min_snr: float = 20.0
    retries: int = 4


def calibrate(
    bench: Bench, n: int, settings: CalibrationSettings | None = None, progress: Callable[[str], None] | None = None
) -> Calibration:
    st = settings or CalibrationSettings()
    n = check_size(n)
    count = heater_count(n)
    cal = Calibration(size=n, heaters=[HeaterCal(amplitude_mw=0.0) for _ in range(count)])
    grid = np.linspace(0.0, st.sweep_max_mw, st.points)
    applied = np.zeros(count)
    neighbour_mw: dict[int, float] = {}  # neighbours' power during each accepted sweep
    rng = np.random.default_rng(0)

    def apply(powers: dict[int, float]) -> None:
        bench.set_heater_powers(powers)
        for h, p in powers.items():
            applied[h] = p

    def sweep(heaters: list[int]) -> np.ndarray:
        """Output powers (points x N) while `heaters` all step through the grid together."""
        rows = []
        for x in grid:
            apply({h: float(x) for h in heaters})
            rows.append(bench.read_output_mw())
        apply({h: 0.0 for h in heaters})
        return np.array(rows)

    def accept(h: int, fit: Fit, theta_at_max: float) -> bool:
        if fit.snr < st.min_snr:
            return False
        lo, hi = st.b_range
        if not lo * 1.02 < fit.b < hi * 0.98:  # a fit pinned to the search edge is a trend, not a fringe
            return False
        nb = (applied[h - 1] if h > 0 else 0.0) + (applied[h + 1] if h + 1 < count else 0.0)
        neighbour_mw[h] = nb
        phi0 = theta_at_max - math.pi / 2 + fit.c - fit.b * cal.crosstalk * nb
        hc = cal.heaters[h]
        hc.phi0_rad, hc.alpha_rad_per_mw = math.remainder(phi0, TWO_PI), fit.b
        hc.amplitude_mw, hc.rms_mw = fit.a, fit.rms
        return True

    def leaves(node: int) -> range:
        span = n >> int(math.log2(node))
        return range(node * span - n, node * span - n + span)

    def route_splitter_ancestors(i: int, node: int) -> None:
        want, child = {}, node
        while child > 1:
            nd = child // 2
            want[splitter_heater(n, i, nd)] = math.pi * (BAR if child == 2 * nd else 1 - BAR)
            child = nd
        if want:
            p = cal.powers_for(want, applied)
            apply({h: float(p[h]) for h in want})

    def splitter_pass(todo: list[tuple[int, int]], combiners_pass: bool) -> list[tuple[int, int]]:
        weak = []
        for i, node in todo:
            h = splitter_heater(n, i, node)
            if combiners_pass:  # every combiner tree passes input i: full signal in both subtrees
                want = {}
                for o in range(n):
                    for nd, child in path_nodes(n, i):
                        want[combiner_heater(n, o, nd)] = math.pi * (BAR if child == 2 * nd else 1 - BAR)
                p = cal.powers_for(want, applied)
                apply({k: float(p[k]) for k in want})
            route_splitter_ancestors(i, node)
            rows = sweep([h])
            signal = rows[:, list(leaves(2 * node + 1))].sum(axis=1) - rows[:, list(leaves(2 * node))].sum(axis=1)
            if not accept(h, fit_sine(grid, signal, *st.b_range), 0.0):  # max at CROSS (theta = 0)
                weak.append((i, node))
            apply({splitter_heater(n, i, nd): 0.0 for nd in range(1, n)})
        return weak

    # 1. splitters, top down
    order = [(i, node) for node in range(1, n) for i in range(n)]
    weak = splitter_pass(order, combiners_pass=False)
    for _ in range(st.retries):  # a dark combiner path hid the fringe: retry under other combiner states
        if not weak:
            break
        comb = range(n * (n - 1), count)
        apply({h: float(x) for h, x in zip(comb, rng.uniform(0, st.sweep_max_mw, len(comb)), strict=True)})
        weak = splitter_pass(weak, combiners_pass=False)
    apply({h: 0.0 for h in range(n * (n - 1), count)})
    _say(progress, f"splitters: {len(order) - len(weak)}/{len(order)} calibrated")

    # 2. crosstalk from a few well-fitted splitters with both neighbours
    candidates = [splitter_heater(n, i, nd) for i, nd in order if (i, nd) not in weak]
    candidates = [h for h in candidates if 0 < h < count - 1]
    spots = np.linspace(0, len(candidates) - 1, min(st.crosstalk_samples, len(candidates))).astype(int)
    picks = [candidates[k] for k in spots]
    estimates = []
    for h in dict.fromkeys(picks):
        i, node = divmod(h, n - 1)
        node += 1
        apply({h - 1: st.p_ref_mw, h + 1: st.p_ref_mw})
        route_splitter_ancestors(i, node)
        rows = sweep([h])
        signal = rows[:, list(leaves(2 * node + 1))].sum(axis=1) - rows[:, list(leaves(2 * node))].sum(axis=1)
        fit = fit_sine(grid, signal, *st.b_range)
        hc = cal.heaters[h]
        apply({k: 0.0 for k in (h - 1, h + 1)})
        apply({splitter_heater(n, i, nd): 0.0 for nd in range(1, n)})
        if fit.snr >= st.min_snr:
            shift = math.remainder((fit.c - math.pi / 2) - hc.phi0_rad, TWO_PI)
            estimates.append(shift / (hc.alpha_rad_per_mw * 2 * st.p_ref_mw))
    cal.crosstalk = float(np.median(estimates)) if estimates else 0.0
    for h, nb in neighbour_mw.items():  # sweeps so far assumed no crosstalk
        hc = cal.heaters[h]
        hc.phi0_rad = math.remainder(hc.phi0_rad - hc.alpha_rad_per_mw * cal.crosstalk * nb, TWO_PI)
    _say(progress, f"crosstalk: {cal.crosstalk:.4f} from {len(estimates)} heaters")

    # 3. combiners, one lit leaf per tree, leaf to root, all trees in parallel
    pending = {combiner_heater(n, o, nd) for o in range(n) for nd in range(1, n)}
    for s in range(n):
        if not pending:
            break
        perm = [(i + s) % n for i in range(n)]
        want = {}
        for i, o in enumerate(perm):
            for nd, child in path_nodes(n, o):
                want[splitter_heater(n, i, nd)] = math.pi * (BAR if child == 2 * nd else 1 - BAR)
        p = cal.powers_for(want, applied)
        apply({k: float(p[k]) for k in want})
        for depth in range(int(math.log2(n)) - 1, -1, -1):
            batch, arms = [], {}
            for o in range(n):
                i = perm.index(o)
                nd, child = path_nodes(n, i)[depth]
                h = combiner_heater(n, o, nd)
                arms[h] = (o, math.pi * (BAR if child == 2 * nd else 1 - BAR))
                if h in pending:
                    batch.append(h)
            if batch:
                rows = sweep(batch)
                for h in batch:
                    o, theta_max = arms[h]
                    if accept(h, fit_sine(grid, rows[:, o], *st.b_range), theta_max):
                        pending.discard(h)
            # leave this level passing its lit arm, for the levels above
            ready = {h: t for h, (_, t) in arms.items() if h not in pending}
            if ready:
                p = cal.powers_for(ready, applied)
                apply({k: float(p[k]) for k in ready})
    _say(progress, f"combiners: {n * (n - 1) - len(pending)}/{n * (n - 1)} calibrated")

    # 4. weak splitters again, with the combiners passing their input
    if weak:
        weak = splitter_pass(weak, combiners_pass=True)
    apply({h: 0.0 for h in range(count)})
    cal.meta = {
        "points": st.points,
        "sweep_max_mw": st.sweep_max_mw,
        "uncalibrated": sorted([splitter_heater(n, i, nd) for i, nd in weak] + sorted(pending)),
    }
    return cal


def _say(progress: Callable[[str], None] | None, text: str) -> None:
    if progress is not None:
        progress(text)
