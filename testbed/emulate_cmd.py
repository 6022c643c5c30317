"""`testbed emulate INVENTORY`: the twin standalone, with every endpoint printed, until Ctrl-C."""

from __future__ import annotations

import signal
import threading

from rich.console import Console

from testbed.config import load_inventory
from testbed.errors import EXIT_OK
from testbed.twin import emulated_kinds, twin_spec


def endpoint_lines(ep: dict) -> list[str]:
    """How to reach one emulated device with ordinary tools, one line per endpoint."""
    lines = []
    if "visa" in ep:
        lines.append(f"pyvisa: {ep['visa']}")
    if "serial" in ep:
        lines.append(f"serial: {ep['serial']}   (pyvisa: ASRL{ep['serial']}::INSTR)")
    if "qontrol" in ep:
        lines.append(f"qontrol: {ep['qontrol']}   (qontrol.QXOutput(serial_port_name=...))")
    if "ssh" in ep:
        host, _, port = ep["ssh"].rpartition(":")
        lines.append(
            f"ssh: ssh -F /dev/null -p {port} -i {ep['key_file']} -o UserKnownHostsFile={ep['known_hosts']} "
            f"-o StrictHostKeyChecking=yes {ep['user']}@{host} nvidia-smi"
        )
    if "tcp" in ep:
        lines.append(f"tcp: {ep['tcp']}")
    return lines


def serve_twin(inventory_file: str, seed: int, console: Console) -> int:
    from emulators.twin import TwinProcess

    inv = load_inventory(inventory_file).model
    spec = twin_spec(inv, seed)
    with TwinProcess(spec) as twin:
        endpoints = twin.endpoints.to_json()
        # Plain lines, not a table: endpoints are for copying into other tools and must never wrap.
        console.print(f"emulated twin of {inv.name} ({inventory_file})", style="bold")
        for name, ep in endpoints["devices"].items():
            console.print(f"{name} ({ep['kind']})", style="bold", highlight=False)
            for line in endpoint_lines(ep):
                console.print(f"  {line}", soft_wrap=True, markup=False, highlight=False)
        skipped = [n for n, d in inv.devices.items() if d.kind not in emulated_kinds()]
        if skipped:
            console.print(f"not emulated yet: {', '.join(skipped)}", style="dim", soft_wrap=True)
        console.print(f"control: {endpoints['control']}  (JSON lines)", soft_wrap=True, markup=False)
        console.print("running; press Ctrl-C to stop", style="bold")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(0.5):
                if twin.process.poll() is not None:
                    console.print("[red]the twin process ended unexpectedly[/]")
                    return 1
        except KeyboardInterrupt:
            pass
        console.print("stopped")
    return EXIT_OK
