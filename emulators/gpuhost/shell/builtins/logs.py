"""The host's kernel log: dmesg, and journalctl -k (the only journal an emulated host keeps)."""

from __future__ import annotations

import time

from emulators.gpuhost.shell.context import Context, Result


def dmesg(args: list[str], ctx: Context) -> Result:
    with ctx.engine.lock:
        k = ctx.engine.kernel
        lines = list(k.lines)
    human = any(a in ("-T", "--ctime") for a in args)
    out = []
    for t, msg in lines:
        if human:
            out.append(f"[{time.strftime('%a %b %e %H:%M:%S %Y', time.localtime(k.boot_wall + t))}] {msg}\n")
        else:
            out.append(f"[{t:12.6f}] {msg}\n")
    return "".join(out), "", 0


def journalctl(args: list[str], ctx: Context) -> Result:
    if not any(a in ("-k", "--dmesg") or (a.startswith("-") and not a.startswith("--") and "k" in a) for a in args):
        return "-- No entries --\n", "", 0
    with ctx.engine.lock:
        k = ctx.engine.kernel
        lines = list(k.lines)
    host = ctx.engine.spec.name
    return (
        "".join(
            f"{time.strftime('%b %d %H:%M:%S', time.localtime(k.boot_wall + t))} {host} kernel: {msg}\n"
            for t, msg in lines
        ),
        "",
        0,
    )
