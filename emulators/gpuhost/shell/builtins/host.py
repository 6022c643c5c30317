"""What the host says about itself: hostname, whoami, nvidia-smi."""

from __future__ import annotations

from emulators.gpuhost.nvsmi import nvidia_smi as render
from emulators.gpuhost.nvsmi_xml import asks_for_report, nvidia_smi_report
from emulators.gpuhost.shell.context import Context, Result


def hostname(args: list[str], ctx: Context) -> Result:
    return ctx.engine.spec.name + "\n", "", 0


def whoami(args: list[str], ctx: Context) -> Result:
    return ctx.engine.spec.user + "\n", "", 0


def nvidia_smi(args: list[str], ctx: Context) -> Result:
    if asks_for_report(args):
        return nvidia_smi_report(args, ctx.engine.view())
    return render(args, ctx.engine.view())
