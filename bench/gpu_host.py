"""This machine as a GPU host: the driver's probes against its nvidia-smi, the job's recovery on its GPUs, detection.

    python bench/gpu_host.py [--out bench/out/gpu_host.json] [--samples 10] [--trials 5] [--ranks 3]

No Ray: the repository on PYTHONPATH, PyTorch and paramiko. Three figures, each recorded as skipped (with the
reason) where this machine cannot give it:

- probes: the GPU-host driver (drivers/gpuhost), connected over SSH to a real OpenSSH sshd on 127.0.0.1 run by
  this user (bench/detect_zombie.py's), runs its probes against this machine's nvidia-smi: the GPU list, the
  kernel log's Xid lines and the health probe with `nvidia-smi -q -x` read (details=True); p50 over --samples
  each, the GPUs' names and what the health probe found. Needs nvidia-smi on PATH and /usr/sbin/sshd.
- recovery: bench/inplace_recovery.py's kill -> the spare's first step, in-job against a cold restart, --trials
  each. testbed-torch-train's `--device cuda` is NCCL with one GPU per rank, so the job runs on CUDA (rank r on
  GPU r) where PyTorch sees at least two GPUs (ranks: at most the GPUs), else on the CPU over gloo, saying why.
- detection: bench/detect_zombie.py's kill -> the watch's exit (real sshd when installed), --samples each.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import detect_zombie
import inplace_recovery
from benchlib import machine, stats
from rich.console import Console

from drivers.errors import DeviceError

DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "gpu_host.json"


def timed(call: Callable[[], Any], samples: int) -> tuple[dict, Any]:
    """stats of `samples` calls (ms) and the last call's answer; a probe the host refuses (dmesg restricted and no
    journal, say) is recorded as its error, not a traceback.
    """
    seen: list[float] = []
    answer = None
    for _ in range(samples):
        t0 = time.perf_counter()
        try:
            answer = call()
        except DeviceError as exc:
            return {"n": 0, "error": str(exc)}, None
        seen.append((time.perf_counter() - t0) * 1000)
    return stats(seen), answer


def probes(samples: int) -> dict:
    if shutil.which("nvidia-smi") is None:
        return {"skipped": "nvidia-smi is not on PATH: no NVIDIA driver on this machine"}
    if not os.path.exists(detect_zombie.SSHD):
        return {"skipped": f"{detect_zombie.SSHD} is not installed: the driver needs a real sshd on 127.0.0.1"}
    with tempfile.TemporaryDirectory(prefix="gpu-host-") as tmp:
        folder = Path(tmp)
        os.chmod(folder, 0o700)
        with detect_zombie.real_sshd(folder) as drv:
            gpus_ms, gpus = timed(drv.gpus, samples)
            xids_ms, xids = timed(drv.kernel_xids, samples)
            health_ms, health = timed(lambda: drv.health(details=True), samples)
    health = health or {}
    return {
        "path": "GPU-host driver over a real sshd on 127.0.0.1",
        "gpus": [{"index": g.index, "name": g.name, "lost": g.lost} for g in gpus or []],
        "xid_lines": None if xids is None else len(xids),
        "health_ok": health.get("ok"),
        "health_error": health.get("error"),
        "kernel_log_error": health.get("kernel_log_error"),
        "conditions": health.get("conditions", []),
        "readings_error": health.get("readings_error"),
        "gpus_ms": gpus_ms,
        "kernel_xids_ms": xids_ms,
        "health_details_ms": health_ms,
    }


def recovery(trials: int, ranks: int, steps: int) -> dict:
    try:
        import torch
    except ImportError as exc:
        return {"skipped": f"PyTorch is not installed ({exc}): pip install 'testbed[torch]'"}
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= 2:
        ranks = min(ranks, gpus)
        device = "cuda"
        how = f"{ranks} ranks on NCCL, one GPU each (rank r and its spare on GPU r), {gpus} GPUs seen"
    else:
        device = "cpu"
        why = "no CUDA device" if gpus == 0 else "one GPU"
        how = (
            f"{ranks} ranks on the CPU over gloo ({why}: testbed-torch-train's --device cuda is NCCL, which takes "
            "one GPU per rank and refuses two ranks on one GPU, and the job has no gloo-on-CUDA mode; world size "
            "1 would leave no survivor to recover with)"
        )
    args = argparse.Namespace(ranks=ranks, steps=steps, device=device, gpus=max(1, gpus))
    samples: dict[str, list[float]] = {m: [] for m in inplace_recovery.MODES}
    for trial in range(trials):
        order = inplace_recovery.MODES if trial % 2 == 0 else inplace_recovery.MODES[::-1]
        for mode in order:  # alternating, the order turning every trial, as inplace_recovery.py does
            run = inplace_recovery.in_job_trial if mode == "in-job" else inplace_recovery.restart_trial
            with tempfile.TemporaryDirectory(prefix="gpu-host-recovery-") as tmp:
                samples[mode].append(run(args, Path(tmp)) * 1000)
    return {
        "device": device,
        "how": how,
        "gpu_name": torch.cuda.get_device_name(0) if gpus else None,
        "in_job_ms": stats(samples["in-job"]),
        "restart_ms": stats(samples["restart"]),
        "samples_ms": samples,
    }


def p50(s: dict) -> str:
    if "error" in s:
        return f"failed: {s['error'].splitlines()[0]}"  # the whole message is in the JSON
    return f"p50 {s['p50']:.1f} ms" if s.get("n") else "never ended"


def table(f: dict) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pr = f["probes"]
    if "skipped" in pr:
        out.append(("probes against nvidia-smi", f"skipped: {pr['skipped']}"))
    else:
        names = ", ".join(sorted({g["name"] for g in pr["gpus"]})) or "no GPU listed"
        out.append(("GPUs", f"{len(pr['gpus'])} x {names}"))
        out.append(("probe: GPU list", f"{p50(pr['gpus_ms'])}"))
        out.append(("probe: Xid lines", f"{p50(pr['kernel_xids_ms'])} ({pr['xid_lines']} lines)"))
        error = pr["health_error"] or pr["readings_error"]
        why = f": {error.splitlines()[0]}" if error else f": {len(pr['conditions'])} conditions"
        out.append(("probe: health, -q -x read", f"{p50(pr['health_details_ms'])} (ok {pr['health_ok']}{why})"))
    rc = f["recovery"]
    if "skipped" in rc:
        out.append(("recovery", f"skipped: {rc['skipped']}"))
    else:
        out.append(("recovery: in-job, kill -> spare's step", f"{p50(rc['in_job_ms'])} (n={rc['in_job_ms']['n']})"))
        out.append(("recovery: restart, kill -> step", f"{p50(rc['restart_ms'])} (n={rc['restart_ms']['n']})"))
        gpu = f" ({rc['gpu_name']})" if rc["device"] == "cuda" else ""
        out.append(("recovery ran as", rc["how"] + gpu))
    for row in f["detection"]["rows"]:
        never = f" ({row['never_ended']}/{row['n']} not ended {f['detection']['give_up_s']:g} s after the kill)"
        never = never if row["never_ended"] else ""
        out.append((f"detection: {row['watch']}, {row['adopter']}", f"{p50(row['ms'])}{never}"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the figures go (JSON)")
    parser.add_argument("--samples", type=int, default=10, help="samples per probe and per watch and adopter")
    parser.add_argument("--trials", type=int, default=5, help="recovery trials per mode")
    parser.add_argument("--ranks", type=int, default=3, help="the job's ranks (on CUDA: at most the GPUs)")
    parser.add_argument("--steps", type=int, default=400, help="the job's --steps (long enough not to end in a trial)")
    args = parser.parse_args()
    if args.samples < 1 or args.trials < 1 or args.ranks < 2:
        parser.error("--samples and --trials must be at least 1, --ranks at least 2")
    console = Console()
    figures: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
    }
    figures["probes"] = probes(args.samples)
    console.print("probes done", style="dim")
    figures["recovery"] = recovery(args.trials, args.ranks, args.steps)
    console.print("recovery done", style="dim")
    figures["detection"] = detect_zombie.measure(args.samples, console=console)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    for what, figure in table(figures):
        print(f"{what:58} {figure}")
    print(f"figures: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
