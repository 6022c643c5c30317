"""Asking a GPU host what it has and how it is: identity, GPUs, compute processes, kernel Xids, health."""

from __future__ import annotations

import dataclasses

from drivers.capabilities import GpuInfo, GpuProcess, Identity
from drivers.errors import DeviceCommandError
from drivers.gpuhost.reply import BadReply
from drivers.gpuhost.shell import HostShell
from drivers.gpuhost.telemetry import (
    APP_QUERY,
    GPUS_ARGS,
    IDENTITY_QUERY,
    STATUS_MARK,
    read_gpus,
    read_identity,
    read_processes,
    smi_output,
    split_status,
    xid_codes,
    xid_lines,
)
from drivers.transports.ssh import ExecResult


class HostProbes:
    """nvidia-smi and the kernel log over the host's shell, read by drivers/gpuhost/telemetry.py.

    It remembers each GPU's index by bus id while the GPU is healthy, so one lost later keeps its index.
    """

    def __init__(self, shell: HostShell) -> None:
        self.shell = shell
        self._bus_index: dict[str, int] = {}

    def identify(self) -> Identity:
        # One exec for both (a channel and a round trip fewer: a run connects to every host this way):
        # the hostname, then nvidia-smi's output and its exit status.
        both = self.shell.exec(f"hostname || echo ; {IDENTITY_QUERY} ; echo {STATUS_MARK} $?", check=False)
        hostname, _, rest = both.stdout.partition("\n")  # a line each
        smi_out, status, _ = self._split_status(both, rest)
        listing = self._listing(both.command, smi_out, both.stderr, status)
        try:
            return read_identity(hostname, listing)
        except BadReply as bad:
            raise self.shell.rejected(bad, sent=both.command, received=listing) from bad.__cause__

    def gpus(self) -> list[GpuInfo]:
        r = self.shell.exec(f"nvidia-smi {GPUS_ARGS}", check=False)
        return self._gpus(r.command, self._listing(r.command, r.stdout, r.stderr, r.status))

    def processes(self) -> list[GpuProcess]:
        r = self.shell.exec(f"nvidia-smi --query-compute-apps={APP_QUERY} --format=csv,noheader,nounits", check=False)
        listing = self._listing(r.command, r.stdout, r.stderr, r.status)
        try:
            return read_processes(listing)
        except BadReply as bad:
            raise self.shell.rejected(bad, sent=r.command, received=listing) from bad.__cause__

    def kernel_xids(self) -> list[str]:
        r = self.shell.exec("dmesg", check=False)
        if r.status != 0:
            r = self.shell.exec("journalctl -k --no-pager -o short", check=True)
        return xid_lines(r.stdout)

    def health(self) -> dict:
        error = kernel_error = None
        # One exec for both (a round trip and a channel fewer per probe): nvidia-smi, its exit status, dmesg.
        r = self.shell.exec(f"nvidia-smi {GPUS_ARGS} ; echo {STATUS_MARK} $? ; dmesg", check=False)
        smi_out, status, kernel = self._split_status(r, r.stdout)
        try:
            gpus = self._gpus(r.command, self._listing(r.command, smi_out, r.stderr, status))
        except DeviceCommandError as exc:
            gpus, error = [], exc.message
        if r.status == 0:
            xids = xid_lines(kernel)
        else:  # dmesg is restricted here: the journal instead (kernel_xids' fallback)
            try:
                xids = self.kernel_xids()
            except DeviceCommandError as exc:
                xids, kernel_error = [], exc.message
        lost = [g.index for g in gpus if g.lost]
        return {
            "ok": error is None and not lost and not xids,
            "gpus": [dataclasses.asdict(g) for g in gpus],
            "lost": lost,
            "xids": xids,
            "xid_codes": xid_codes(xids),
            "error": error,
            "kernel_log_error": kernel_error,
        }

    def _split_status(self, r: ExecResult, out: str) -> tuple[str, int, str]:
        try:
            return split_status(out)
        except BadReply as bad:
            raise self.shell.rejected(bad, sent=r.command, received=r.stdout[-600:]) from bad.__cause__

    def _listing(self, command: str, stdout: str, stderr: str, status: int) -> str:
        try:
            return smi_output(stdout, stderr, status)
        except BadReply as bad:
            raise self.shell.rejected(bad, sent=command, received=stdout + stderr) from bad.__cause__

    def _gpus(self, command: str, listing: str) -> list[GpuInfo]:
        try:
            return read_gpus(listing, self._bus_index)
        except BadReply as bad:
            raise self.shell.rejected(bad, sent=command, received=listing) from bad.__cause__
