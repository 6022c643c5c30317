"""`testbed emulate INVENTORY`: the twin standalone, with every endpoint printed, until Ctrl-C."""

from __future__ import annotations

import signal
import threading

from rich.console import Console
from rich.table import Table

from testbed.config import load_inventory
from testbed.errors import EXIT_OK
from testbed.twin import EMULATED_KINDS, twin_spec


def serve_twin(inventory_file: str, seed: int, console: Console) -> int:
    from emulators.twin import TwinProcess

    inv = load_inventory(inventory_file).model
    spec = twin_spec(inv, seed)
    with TwinProcess(spec) as twin:
        endpoints = twin.endpoints.to_json()
        table = Table(title=f"emulated twin of {inv.name}", title_justify="left")
        for col in ("device", "kind", "pyvisa resource (TCP)", "serial (raw pty)", "tcp"):
            table.add_column(col)
        for name, ep in endpoints["devices"].items():
            table.add_row(name, ep.get("kind", ""), ep.get("visa", ""), ep.get("serial", ""), ep.get("tcp", ""))
        console.print(table)
        skipped = [n for n, d in inv.devices.items() if d.kind not in EMULATED_KINDS]
        if skipped:
            console.print(f"[dim]not emulated yet: {', '.join(skipped)}[/]")
        console.print(f"control API (JSON lines): {endpoints['control']}")
        console.print(
            "example: python -c \"import pyvisa; r = pyvisa.ResourceManager('@py').open_resource("
            f"'{next(iter(endpoints['devices'].values()))['visa']}', read_termination='\\n'); "
            "print(r.query('*IDN?'))\"",
            soft_wrap=True,
            markup=False,
        )
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
