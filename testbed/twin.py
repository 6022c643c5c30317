"""The bridge from an inventory to its emulated twin: which devices to emulate, and the inventory that
points the real drivers at the twin's loopback endpoints instead of the lab's addresses."""

from __future__ import annotations

import re

from emulators.gpuhost.spec import GpuHostSpec
from emulators.mesh.spec import MeshSpec
from emulators.spec import OcsSpec, TwinSpec
from testbed.config.inventory import (
    GpuHostDevice,
    Inventory,
    MeshDevice,
    OcsDevice,
    SerialTransport,
    SshTransport,
    VisaTransport,
    transport_address,
)
from testbed.errors import UserError

EMULATED_KINDS = {"ocs", "photonic_mesh", "gpu_host"}


def twin_spec(inv: Inventory, seed: int, only: set[str] | None = None) -> TwinSpec:
    devices = []
    for index, (name, dev) in enumerate(inv.devices.items()):
        if only is not None and name not in only:
            continue
        # Light enters where each fibre is really cabled (FibreEmulation), which the map may get wrong.
        lit = {f.actual()[0]: f.launch_power_dbm for f in inv.fibres if f.switch == name}
        if isinstance(dev, OcsDevice):
            e = dev.emulation
            devices.append(
                OcsSpec(
                    name=name,
                    size=dev.size,
                    switching_time_ms=e.switching_time_ms,
                    jitter_ms=e.jitter_ms,
                    insertion_loss_db=e.insertion_loss_db,
                    input_power_dbm=lit,
                    seed=seed * 1000 + index,
                    idn=e.idn,
                    circuits=[list(c) for c in e.circuits],
                )
            )
        elif isinstance(dev, MeshDevice):
            e = dev.emulation
            devices.append(
                MeshSpec(
                    name=name,
                    size=dev.size,
                    settling_time_us=e.settling_time_us,
                    drive=e.drive,
                    crosstalk=e.crosstalk,
                    insertion_loss_db=e.insertion_loss_db,
                    heater_resistance_ohm=e.heater_resistance_ohm,
                    p_pi_mw=e.p_pi_mw,
                    alpha_spread=e.alpha_spread,
                    phi0_spread_rad=e.phi0_spread_rad,
                    noise_rel=e.noise_rel,
                    input_power_dbm=lit,
                    seed=seed * 1000 + index,
                )
            )
        elif isinstance(dev, GpuHostDevice):
            user = dev.transport.user if isinstance(dev.transport, SshTransport) else "lab"
            devices.append(
                GpuHostSpec(
                    name=name, gpus=dev.gpus, gpu_name=dev.emulation.gpu_name, user=user, seed=seed * 1000 + index
                )
            )
    # The fibre map and the trunks drive the twin's data plane (emulators/dataplane): traffic between host
    # ports flows only along the light paths the emulated switches hold, within each path's loss budget.
    fibres = [
        {
            "host": f.host,
            "port": f.port,
            "switch": f.switch,
            "ingress": f.actual()[0],
            "egress": f.actual()[1],
            "launch_power_dbm": f.launch_power_dbm,
            "rx_sensitivity_dbm": f.rx_sensitivity_dbm,
        }
        for f in inv.fibres
    ]
    trunks = [
        {"from": t.from_, "egress": t.egress, "to": t.to, "ingress": t.ingress, "loss_db": t.loss_db}
        for t in inv.trunks
    ]
    return TwinSpec(devices=devices, fibres=fibres, trunks=trunks)


def not_emulated(inv: Inventory, devices) -> list[str]:
    return [d for d in devices if inv.devices[d].kind not in EMULATED_KINDS]


def point_at_twin(inv: Inventory, endpoints: dict) -> Inventory:
    """The same inventory with every emulated device's transport replaced by its twin endpoint."""
    devices = dict(inv.devices)
    for name, ep in endpoints["devices"].items():
        dev = devices[name]
        t = dev.transport
        if isinstance(t, VisaTransport):
            # Keep the wiring the lab uses: a LAN instrument stays on TCP, a serial one on the pty.
            # A chip's SCPI source is on TCP only; its pty ("qontrol") speaks the Qontrol protocol.
            on_tcp = t.resource.upper().startswith("TCPIP") or ep.get("kind") == "photonic_mesh" or "serial" not in ep
            resource = ep["visa"] if on_tcp else f"ASRL{ep['serial']}::INSTR"
            t = t.model_copy(update={"resource": resource})
        elif isinstance(t, SerialTransport):
            t = t.model_copy(update={"port": ep["serial"] if "serial" in ep else ep["qontrol"]})
        elif isinstance(t, SshTransport):
            host, _, port = ep["ssh"].rpartition(":")
            t = t.model_copy(
                update={"host": host, "port": int(port), "known_hosts": ep["known_hosts"], "key_file": ep["key_file"]}
            )
        devices[name] = dev.model_copy(update={"transport": t})
    return inv.model_copy(update={"devices": devices})


LOOPBACK = re.compile(
    r"^(TCPIP\d*::127\.0\.0\.1::\d+::SOCKET|ASRL/dev/pts/\d+::INSTR|/dev/pts/\d+|"
    r"socket://127\.0\.0\.1:\d+|.*@127\.0\.0\.1:\d+)$"
)


def assert_loopback(inv: Inventory, devices) -> None:
    """An emulated run never opens a real address: refuse to go on if any device still points outside."""
    outside = [
        f"{d} -> {transport_address(inv.devices[d].transport)}"
        for d in devices
        if not LOOPBACK.match(transport_address(inv.devices[d].transport))
    ]
    if outside:
        raise UserError(
            "--emulate: refusing to run, these devices would use a non-loopback address: " + ", ".join(outside)
        )
