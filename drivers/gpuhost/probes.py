"""Asking a GPU host what it has and how it is: identity, GPUs, compute processes, kernel Xids, health (with
details: the XML report's readings per GPU, drivers/gpuhost/smi_xml.py).
"""

from __future__ import annotations

import dataclasses

from drivers.capabilities import GpuInfo, GpuProcess, Identity
from drivers.errors import DeviceCommandError, DeviceError
from drivers.gpuhost.reply import BadReply
from drivers.gpuhost.shell import HostShell
from drivers.gpuhost.smi_xml import CONDITIONS, SmiReport, read_report
from drivers.gpuhost.telemetry import (
    APP_QUERY,
    GPUS_ARGS,
    IDENTITY_QUERY,
    STATUS_MARK,
    bus_key,
    read_gpus,
    read_identity,
    read_processes,
    smi_output,
    split_status,
    xid_codes,
    xid_lines,
)
from drivers.transports.ssh import ExecResult

REPORT_ARGS = "-q -x"  # the XML report (drivers/gpuhost/smi_xml.py)


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

    def report(self) -> SmiReport:
        r = self.shell.exec(f"nvidia-smi {REPORT_ARGS}", check=False)
        return self._report(r.command, self._listing(r.command, r.stdout, r.stderr, r.status))

    def health(self, details: bool = False) -> dict:
        error = kernel_error = None
        # One exec for all (a round trip and a channel fewer per probe): nvidia-smi, its exit status, (with
        # details: the XML report and its exit status), dmesg.
        report = f"nvidia-smi {REPORT_ARGS} ; echo {STATUS_MARK} $? ; " if details else ""
        r = self.shell.exec(f"nvidia-smi {GPUS_ARGS} ; echo {STATUS_MARK} $? ; {report}dmesg", check=False)
        smi_out, status, kernel = self._split_status(r, r.stdout)
        if details:
            xml_out, xml_status, kernel = self._split_status(r, kernel)
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
        probe = {
            "ok": error is None and not lost and not xids,
            "gpus": [dataclasses.asdict(g) for g in gpus],
            "lost": lost,
            "xids": xids,
            "xid_codes": xid_codes(xids),
            "error": error,
            "kernel_log_error": kernel_error,
        }
        if details:
            probe.update(self._details(r.command, xml_out, r.stderr, xml_status))
            probe["ok"] = probe["ok"] and not probe["conditions"]
        return probe

    def _details(self, command: str, out: str, stderr: str, status: int) -> dict:
        """The XML report's readings per GPU (with its index, by bus id) and the conditions a lab acts on. A
        report that cannot be read is in readings_error and does not make the host unhealthy on its own (the
        CSV listing says whether nvidia-smi works).
        """
        try:
            report = self._report(command, self._listing(command, out, stderr, status))
        except DeviceError as exc:
            return {"readings": [], "conditions": [], "readings_error": exc.message}
        readings, conditions = [], []
        for gpu in report.gpus:
            index = self._bus_index.get(bus_key(gpu.bus_id))
            readings.append({"index": index, **dataclasses.asdict(gpu)})
            conditions += [
                {"gpu": index, "bus_id": gpu.bus_id, "condition": name, "detail": CONDITIONS[name]}
                for name in gpu.conditions()
            ]
        return {"readings": readings, "conditions": conditions, "readings_error": None}

    def _report(self, command: str, out: str) -> SmiReport:
        try:
            return read_report(out)
        except BadReply as bad:
            raise self.shell.rejected(bad, sent=command, received=out) from bad.__cause__

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
