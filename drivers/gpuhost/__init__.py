"""GpuHost over SSH: nvidia-smi CSV, background jobs with a log file each, signals (drivers.capabilities).

Everything is plain POSIX shell + nvidia-smi, so the same calls work on a lab host's OpenSSH server and
on an emulated host. `GpuHostSsh` (driver.py) composes the parts: what nvidia-smi and the kernel say
(telemetry.py; the XML report: smi_xml.py; read by probes.py), jobs (jobs.py), the failure watch (watch.py),
the straggler agent (straggle.py), over one shared SSH session (shell.py).
"""

from drivers.gpuhost.driver import GpuHostSsh
from drivers.gpuhost.straggle import straggle_log
from drivers.gpuhost.telemetry import GPU_QUERY

__all__ = ["GPU_QUERY", "GpuHostSsh", "straggle_log"]
