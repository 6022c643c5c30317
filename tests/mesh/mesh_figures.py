"""Measured figures for the mesh work: run `/work/venv/bin/python tests/mesh/mesh_figures.py` from the repo.

N=8 through the Qontrol driver over the emulator's pty (calibration, then the N-1 all-to-all matchings,
each timed around program()); N=32 on the engine directly. Per matching: the worst share of an input's
light reaching its target, and per output the worst extinction (target light / light from other inputs).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import LoopThread  # noqa: E402
from test_mesh_engine32 import DirectBench  # noqa: E402

from drivers.mesh import layout  # noqa: E402
from drivers.mesh.calibration import CalibrationSettings, calibrate  # noqa: E402
from drivers.transports import TransportSettings  # noqa: E402
from emulators.devices import build_device  # noqa: E402
from emulators.mesh.chip import MeshChip  # noqa: E402
from emulators.mesh.spec import MeshSpec  # noqa: E402
from testbed.fabric.topology import all_to_all_schedule  # noqa: E402
from testbed.families.drivers import make_driver  # noqa: E402


def score(t: np.ndarray, perm: list[int]) -> tuple[float, float]:
    n = len(perm)
    frac = t[perm, range(n)] / t.sum(axis=0)
    wanted = t[perm, range(n)]
    other = np.array([t[perm[i]].sum() - wanted[i] for i in range(n)])
    ext_db = 10 * np.log10(wanted / np.maximum(other, 1e-30))
    return float(frac.min()), float(ext_db.min())


def main() -> None:
    import asyncio

    n = 8
    spec = MeshSpec(name="chip1", size=n, seed=11, input_power_dbm={p: 0.0 for p in range(1, n + 1)})
    lt, dev = LoopThread(), build_device(spec)

    async def go():
        return await dev.start(asyncio.get_running_loop())

    ep = lt.run(go())
    mesh = make_driver(
        "qontrol-mesh", "chip1", TransportSettings(type="serial", address=ep["qontrol"], baudrate=115200)
    )
    t0 = time.perf_counter()
    mesh.calibrate(CalibrationSettings(points=20))
    print(f"N=8 qontrol-mesh over pty: calibration {time.perf_counter() - t0:.2f} s, 112 heaters")
    worst_frac, worst_ext, times = 1.0, 1e9, []
    for perm in ordered_matchings(n):
        t0 = time.perf_counter()
        mesh.program(perm)
        times.append(time.perf_counter() - t0)
        f, e = score(np.array(lt.call(dev.chip.transfer_power)), perm)
        worst_frac, worst_ext = min(worst_frac, f), min(worst_ext, e)
    print(
        f"  all-to-all (7 matchings): worst fraction to target {worst_frac:.6f}, worst extinction "
        f"{worst_ext:.1f} dB, program() per matching median {np.median(times) * 1e3:.1f} ms "
        f"max {max(times) * 1e3:.1f} ms"
    )
    scpi = make_driver("scpi-mesh", "chip1", TransportSettings(type="visa", address=ep["visa"]))
    scpi.calibration = mesh.calibration
    times = []
    for perm in ordered_matchings(n):
        t0 = time.perf_counter()
        scpi.program(perm)
        times.append(time.perf_counter() - t0)
    print(f"  scpi-mesh over TCP: program() per matching median {np.median(times) * 1e3:.1f} ms")
    lt.run(dev.close())
    lt.stop()

    n = 32
    chip = MeshChip(MeshSpec(name="c32", size=n, seed=4, input_power_dbm={p: 0.0 for p in range(1, n + 1)}))
    bench = DirectBench(chip)
    t0 = time.perf_counter()
    cal = calibrate(bench, n, CalibrationSettings(points=16))
    print(
        f"N=32 engine direct: calibration {time.perf_counter() - t0:.1f} s, 1984 heaters, "
        f"{len(cal.meta['uncalibrated'])} left uncalibrated"
    )
    worst_frac, worst_ext = 1.0, 1e9
    rng = np.random.default_rng(1)
    for _ in range(20):
        perm = [int(x) for x in rng.permutation(n)]
        bench.set_heater_powers(dict(enumerate(cal.powers_for_states(layout.route(perm)))))
        f, e = score(np.abs(chip.transfer(bench.now)) ** 2, perm)
        worst_frac, worst_ext = min(worst_frac, f), min(worst_ext, e)
    print(f"  20 random permutations: worst fraction to target {worst_frac:.6f}, worst extinction {worst_ext:.1f} dB")


if __name__ == "__main__":
    main()


def ordered_matchings(n: int) -> list[list[int]]:
    """The all-to-all schedule over ports 0..n-1 as permutations (matching k: i -> i + k mod n)."""
    return [[int(dst[0]) for _, dst in m] for m in all_to_all_schedule([str(i) for i in range(n)])]
