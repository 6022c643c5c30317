"""`testbed emulate INVENTORY`: the twin standalone, with every endpoint printed, until Ctrl-C."""

from __future__ import annotations

import secrets
import signal
import threading

from rich.console import Console

from emulators.frontends import TWIN_PASSWORD
from testbed.contracts.errors import EXIT_OK
from testbed.documents import load_inventory
from testbed.twin.bridge import emulated_kinds, twin_spec


def endpoint_lines(ep: dict, user: str = "admin", password: str = TWIN_PASSWORD) -> list[str]:
    """How to reach one emulated device with ordinary tools, one line per endpoint, each working as printed
    (`user`: who logs in on a switch's TL1 and NETCONF, as the inventory says; `password`: the twin's).
    """
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
    if "redfish" in ep:
        bmc, ca, who = ep["redfish"], ep["redfish_ca"], ep.get("redfish_user", "admin")
        lines.append(
            f"redfish: python3 -c \"import redfish; c = redfish.redfish_client(base_url='{bmc}', username='{who}', "
            f"password='{password}', cafile='{ca}', max_retry=0); c.login(auth='session'); "
            "print(c.get('/redfish/v1/Systems/1').dict['PowerState']); c.logout()\""
        )
        lines.append(f"redfish (curl): curl -sS --cacert {ca} -u {who}:{password} {bmc}/redfish/v1/Systems/1")
    if "tcp" in ep:
        lines.append(f"tcp: {ep['tcp']}")
    if "tl1" in ep:
        host, _, port = ep["tl1"].rpartition(":")
        query = "RTRV-CRS:::3::ALL;" if "tl1-calient" in ep.get("interfaces", "") else "RTRV-PATCH:::3:;"
        lines.append(
            f"tl1: python3 -c \"import socket, time; s = socket.create_connection(('{host}', {port})); "
            f"s.sendall(b'ACT-USER::{user}:1::{password};{query}'); time.sleep(0.5); "
            'print(s.recv(65536).decode())"'
        )
    if "netconf" in ep:
        host, _, port = ep["netconf"].rpartition(":")
        key = _host_key_b64(ep["known_hosts"], f"[{host}]:{port}")
        lines.append(
            f"ncclient: python3 -c \"from ncclient import manager; m = manager.connect(host='{host}', port={port}, "
            f"username='{user}', key_filename='{ep['key_file']}', hostkey_verify=True, hostkey_b64='{key}', "
            "allow_agent=False, look_for_keys=False); print(m.get_config('running').data_xml)\""
        )
    return lines


def _host_key_b64(known_hosts: str, host: str) -> str:
    """The base64 host key a known_hosts file lists for `host` ([127.0.0.1]:port), for ncclient's hostkey_b64."""
    for line in open(known_hosts, encoding="utf-8"):  # noqa: SIM115 (a small file, read once)
        fields = line.split()
        if len(fields) >= 3 and host in fields[0].split(","):
            return fields[2]
    return "(not in known_hosts)"


def fault_proxy_lines(ep: dict) -> list[str]:
    """With --fault-proxy: the proxy in front of the device (its listen address is the one printed above, the
    address a lab's inventory gives the device) and the `fault_proxy:` line of its inventory entry, as pasted.
    """
    if "proxy_api" not in ep:
        return []
    role = "tcp" if "tcp_direct" in ep else "ssh"
    return [
        f"fault proxy: listens on {ep[role]} (the device's address in a lab inventory), in front of "
        f"{ep[role + '_direct']}",
        f'fault_proxy: {{api: "{ep["proxy_api"]}", proxy: {ep["proxy"]}}}',
    ]


def serve_twin(inventory_file: str, seed: int, console: Console, fault_proxy: bool = False, netns: bool = False) -> int:
    from emulators.twin import TwinProcess

    inv = load_inventory(inventory_file).model
    spec = twin_spec(inv, seed)
    if netns:  # each GPU host a network namespace of its own (docs/netns.md), tagged at random: no run owns it
        from testbed.twin.netns import refuse_without_privilege, run_tag

        refuse_without_privilege()
        spec.netns = {"tag": run_tag(None)}
    spec.fault_proxy = fault_proxy  # a lab's Toxiproxy, as the twin's proxy with its HTTP API (emulators/twin.py)
    spec.password = secrets.token_urlsafe(16)  # its own: other accounts of the machine reach its endpoints too
    with TwinProcess(spec) as twin:
        assert twin.endpoints is not None and twin.process is not None  # the `with` started it
        endpoints = twin.endpoints.to_json()
        # Plain lines, not a table: endpoints are for copying into other tools and must never wrap.
        console.print(f"emulated twin of {inv.name} ({inventory_file})", style="bold")
        for name, ep in endpoints["devices"].items():
            console.print(f"{name} ({ep['kind']})", style="bold", highlight=False)
            user = getattr(inv.devices[name].transport, "user", "admin")
            for line in [*endpoint_lines(ep, user, spec.password), *fault_proxy_lines(ep)]:
                console.print(f"  {line}", soft_wrap=True, markup=False, highlight=False)
        skipped = [n for n, d in inv.devices.items() if d.kind not in emulated_kinds()]
        if skipped:
            console.print(f"not emulated yet: {', '.join(skipped)}", style="dim", soft_wrap=True)
        network = endpoints.get("netns")
        if network:
            console.print(
                f"management network {network['subnet']} on bridge {network['bridge']} (this side: "
                f"{network['gateway']}); a host's shell: ip netns exec testbed-{network['tag']}-HOST ...",
                soft_wrap=True,
                markup=False,
            )
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
