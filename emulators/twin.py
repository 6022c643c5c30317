"""The twin: every emulated device of a TwinSpec served in one separate process.

Inside the twin process (`python -m emulators serve SPEC`): `TwinServer` runs the engines, their TCP
and PTY endpoints and the control server on one asyncio loop, prints one JSON line describing the
endpoints, and serves until SIGTERM/SIGINT (or stdin EOF with --exit-on-stdin-eof).

In the caller: `TwinProcess(spec)` spawns that process, reads the JSON line into `Endpoints`, and gives
a `TwinControl` for fault injection. The twin never runs inside the caller's process: its timers must
not compete with the caller's work (Ray, the GIL), and a crashed twin must not take the caller down.

Fault proxy (TwinSpec.fault_proxy = True): every device that announces a "tcp" endpoint gets a
FaultProxy (emulators/proxy, seeded with the device spec's seed) in front of it, on the twin's loop.
The announced "tcp" and "visa" endpoints then lead through the proxy; "tcp_direct" is the device's own
endpoint. A GPU host's "ssh" endpoint is proxied the same way ("ssh_direct" is the host's own): the
known_hosts file the twin hands out lists the host's key under the proxy's port too, so a client still
verifies the real host key through the proxy. A pty cannot be proxied (see emulators/mesh/device.py for
the serial-line faults). Control ops, all on the device's name:

    proxy.add_toxic     name, type, stream="downstream", toxicity=1.0, attributes={}  -> the toxic
                        (types and attributes as Toxiproxy's: latency, bandwidth, slow_close, timeout,
                        reset_peer, slicer, limit_data; see emulators/proxy/toxics.py)
    proxy.update_toxic  name, toxicity=None, attributes={}                            -> the toxic
    proxy.remove_toxic  name
    proxy.set_enabled   enabled  (false = "down": new connections refused, open ones closed)
    proxy.reset         every toxic removed and the proxy up (also twin-wide: "device": null)
    proxy.state         {name, listen, upstream, enabled, toxics, seed, connections}
    proxy.connections   recent connections with the toxics applied to each (for repeatability checks)

The same proxies are served over Toxiproxy's HTTP API too (emulators/proxy/http.py, one server for the
twin), announced with each proxied device as "proxy_api" (http://127.0.0.1:PORT) and "proxy" (its name
there): a lab's Toxiproxy as `testbed emulate --fault-proxy` shows it.

Without the field the twin opens no proxy and the proxy.* ops answer an error.

Timed requests: a request with "at_ns" runs its op at that moment of the twin's CLOCK_MONOTONIC (the
runner's clock too: the twin runs on the runner's machine), as a lab's clock-synced fault injector fires
at a set time. The response comes once the op has run. Only ops a device lists in `timed_ops` (ops safe
to run off the loop) can be timed. A request that arrives after its moment is refused with
"missed": true and nothing applied: the caller schedules it again, further ahead. The op's thread waits
as emulators/realtime.py says, at real-time priority where the machine allows it; the ground truth logs a
"trigger" event with "realtime": true or false for every timed op.

Data plane (TwinSpec.fibres, emulators/dataplane): loopback TCP relays between job ranks that pass
bytes only while the emulated switches hold a light path between the two host ports, both ways; with
--netns, the kernel instead (emulators/dataplane/kernel.py, docs/netns.md).
Twin-wide control ops ("device": null):

    dataplane.link   src_host, src_port, dst_host, dst_port, target_port -> "127.0.0.1:P", the relay
                     src_host:src_port uses to reach dst_host:dst_port's rank on 127.0.0.1:target_port
                     (same arguments, same relay)
    dataplane.path   src_host, src_port, dst_host, dst_port -> {lit, forward: {lit, why}, backward: ...}
    dataplane.state  {now, check_interval_ms, fibres, relays: [...], totals, events}
    dataplane.reset  every relay closed (open connections reset), counters cleared
    dataplane.routes links: [[host, port, peer, peer_port], ...] -> {host: routes}: with --netns, a launch's
                     routes on the kernel data plane (emulators/dataplane/kernel.py), which replaces the relays

BMCs: every GPU host also has a BMC speaking Redfish on HTTPS (emulators/redfish), announced with the host's
endpoints as "redfish" (https://127.0.0.1:PORT), "redfish_ca" (the certificate to verify it with) and
"redfish_user" (its password is the twin's: TwinSpec.password). Its ComputerSystem.Reset ForceOff / On
are the host's power_off / power_on. The BMCs are not behind the fault proxy.

Network namespaces (TwinSpec.netns, docs/netns.md): every GPU host is a network namespace of its own on a
management network the twin makes first (emulators/netns.py) and removes last, however it stops short of
SIGKILL; the host's SSH server and BMC listen on its address there, and what it starts runs there. The
endpoints announce the network as "netns" (its tag, subnet, the control side's address, each host's namespace
and address); the data plane's relays then listen on the control side's address and reach each rank at its
host's address.

Other twin-wide ops: ping; clock (the twin's CLOCK_MONOTONIC); endpoints; truth.open path (the ground
truth goes on in another file: a warm session's twin outlives its runs, each keeps its own).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn

from emulators.control import TwinControl
from emulators.dataplane import DataPlane
from emulators.dataplane.kernel import DATA_IFNAME, KernelPlane
from emulators.devices import EmulatedDevice, build_device
from emulators.endpoints import precise_event_loop
from emulators.proxy import FaultProxy, ProxyServer
from emulators.realtime import run_at
from emulators.spec import TwinSpec
from emulators.truth import GroundTruth

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the directory that holds `emulators/`
GIL_SWITCH_S = 0.0001


@dataclass
class Endpoints:
    control: str  # "127.0.0.1:PORT"
    # device -> {"kind": ..., and its endpoints by role, e.g. "tcp", "visa", "serial", "ssh"}
    devices: dict[str, dict[str, str]] = field(default_factory=dict)
    netns: dict[str, Any] | None = None  # the management network (emulators/netns.py, describe()), with --netns

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if out["netns"] is None:  # on loopback the announcement is as it always was
            del out["netns"]
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Endpoints:
        return cls(
            control=raw["control"],
            devices={name: dict(d) for name, d in raw["devices"].items()},
            netns=raw.get("netns"),
        )


class TwinServer:
    """Runs inside the twin process; all of it lives on the one running event loop."""

    def __init__(self, spec: TwinSpec):
        names = [d.name for d in spec.devices]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate device names in twin spec: {names}")
        from emulators.frontends import set_twin_password

        set_twin_password(spec.password)  # what this process's switches and BMCs accept
        self.devices: dict[str, EmulatedDevice] = {d.name: build_device(d, spec.kinds) for d in spec.devices}
        self.fault_proxy = spec.fault_proxy
        self._seeds = {d.name: int(getattr(d, "seed", 0)) for d in spec.devices}
        self.proxies: dict[str, FaultProxy] = {}
        self.network = None  # emulators.netns.ManagementNetwork, with --netns
        self.kernel: KernelPlane | None = None  # the kernel data plane, with --netns
        if spec.netns:
            from emulators.netns import ManagementNetwork

            hosts = [n for n, d in self.devices.items() if d.kind == "gpu_host" and hasattr(d, "place")]
            self.network = ManagementNetwork(spec.netns["tag"], hosts)
        self.dataplane = DataPlane(spec.fibres, self.devices, trunks=spec.trunks)
        self.truth = GroundTruth(spec.truth_log) if spec.truth_log else None
        for device in self.devices.values():
            if self.truth is not None and hasattr(device, "attach_truth"):
                device.attach_truth(self.truth)
        self._control: asyncio.Server | None = None
        self.endpoints: Endpoints | None = None
        self.bmcs: Any = None  # emulators.redfish.RedfishServer, when the twin has GPU hosts
        self.proxy_api: ProxyServer | None = None  # Toxiproxy's HTTP API over self.proxies, with the fault proxy

    async def start(self) -> Endpoints:
        loop = asyncio.get_running_loop()
        self._control = await asyncio.start_server(self._control_client, "127.0.0.1", 0)
        port = self._control.sockets[0].getsockname()[1]
        self.endpoints = Endpoints(control=f"127.0.0.1:{port}")
        if self.network is not None:
            _off_the_loop(self.network.up)  # first: every host's namespace exists before anything listens in it
            network = self.network
            self.kernel = KernelPlane(self.dataplane.paths, network.tag, network.namespaces, network.data_addresses)
            self.kernel.up()
            for host in self.network.hosts:  # the gpu_host devices that have place() (chosen above with hasattr)
                # A lab host's profile names the interface that holds its data address, for PyTorch's gloo
                self.devices[host].place(  # type: ignore[attr-defined]
                    self.network.namespaces[host],
                    self.network.addresses[host],
                    profile={"GLOO_SOCKET_IFNAME": DATA_IFNAME},
                )
            self.dataplane.listen = self.network.gateway
            self.dataplane.addresses = dict(self.network.addresses)
            self.dataplane.kernel = self.kernel
            self.kernel.watch(loop)
            self.endpoints.netns = {**self.network.describe(), "fabric": self.kernel.namespace}
        for name, device in self.devices.items():
            endpoints = {"kind": device.kind, **await device.start(loop)}
            if self.fault_proxy and "tcp" in endpoints:
                endpoints = await self._put_proxy_in_front(name, endpoints)
            elif self.fault_proxy and "ssh" in endpoints:
                endpoints = await self._put_proxy_in_front_of_ssh(name, device, endpoints)
            self.endpoints.devices[name] = endpoints
        if self.proxies:
            await self._serve_proxy_api()
        self._start_bmcs()
        return self.endpoints

    def _announced(self) -> Endpoints:
        """The endpoints start() announces, while it fills them in."""
        assert self.endpoints is not None, "the twin is not started"
        return self.endpoints

    def _start_bmcs(self) -> None:
        """Every emulated GPU host gets a BMC speaking Redfish over HTTPS (emulators/redfish), all served by
        one thread: its ForceOff / On are the host's own power_off / power_on.
        """
        hosts = {n: d for n, d in self.devices.items() if d.kind == "gpu_host" and hasattr(d, "engine")}
        if not hosts:
            return
        from emulators.frontends import twin_password
        from emulators.redfish import TWIN_BMC_USER, RedfishServer

        network = self.network
        self.bmcs = RedfishServer(addresses=tuple(network.addresses.values()) if network is not None else ())
        for name, host in hosts.items():
            where = {}
            if network is not None and name in network.namespaces:  # the BMC in the host's namespace, at its address
                where = {"address": network.addresses[name], "netns": network.namespaces[name]}
            self._announced().devices[name].update(
                self.bmcs.add(name, host.engine, TWIN_BMC_USER, twin_password(), **where)
            )
        self.bmcs.start()

    async def _put_proxy_in_front(self, name: str, endpoints: dict[str, str]) -> dict[str, str]:
        direct = endpoints["tcp"]
        host, _, port = direct.rpartition(":")
        proxy = FaultProxy(name, (host, int(port)), seed=self._seeds[name], listen=(host, 0))
        address = await proxy.start()
        self.proxies[name] = proxy
        out = {**endpoints, "tcp": address, "tcp_direct": direct}
        if endpoints.get("visa") == f"TCPIP0::{host}::{port}::SOCKET":
            out["visa"] = f"TCPIP0::{host}::{proxy.listen[1]}::SOCKET"
        return out

    async def _serve_proxy_api(self) -> None:
        """Toxiproxy's HTTP API over the twin's own proxies (one server, the same FaultProxy objects the
        proxy.* ops drive), announced with each proxied device as "proxy_api" (http://127.0.0.1:PORT) and
        "proxy" (its name there): what a lab's inventory names in `fault_proxy:` (testbed emulate --fault-proxy).
        """
        self.proxy_api = ProxyServer("127.0.0.1", 0)
        self.proxy_api.proxies = self.proxies  # shared: a toxic added either way is on the same proxy
        address = await self.proxy_api.start()
        for name in self.proxies:
            self._announced().devices[name].update({"proxy_api": f"http://{address}", "proxy": name})

    async def _put_proxy_in_front_of_ssh(self, name: str, host: Any, endpoints: dict[str, str]) -> dict[str, str]:
        direct = endpoints["ssh"]
        address, _, port = direct.rpartition(":")
        # With --netns the host's address is inside its namespace: the proxy, a box of the control side's, listens
        # on the control side's loopback and reaches the host over the management network.
        listen = "127.0.0.1" if self.network is not None else address
        proxy = FaultProxy(name, (address, int(port)), seed=self._seeds[name], listen=(listen, 0))
        proxied = await proxy.start()
        self.proxies[name] = proxy
        # Host key checking stays on: the client looks the key up under the port it connects to.
        host.keys.add_known_host(proxy.listen[1], host.host_key, listen)
        return {**endpoints, "ssh": proxied, "ssh_direct": direct}

    async def close(self) -> None:
        try:
            await self._close_servers()
        finally:
            if self.kernel is not None:  # its netlink sockets hold the namespaces: closed before they go
                self.kernel.close()
            if self.network is not None:  # last, whatever failed before: the processes left in it go with it
                _off_the_loop(self.network.down)

    async def _close_servers(self) -> None:
        if self.bmcs is not None:
            self.bmcs.close()
        await self.dataplane.close()
        if self.proxy_api is not None:
            await self.proxy_api.close()  # its clients cut, and the proxies (the dict is shared) closed
        for proxy in self.proxies.values():
            await proxy.close()
        for device in self.devices.values():
            await device.close()
        if self.truth is not None:
            self.truth.close()
        if self._control is not None:
            self._control.close()
            await self._control.wait_closed()

    def dispatch(self, request: Any) -> dict[str, Any]:
        """One control request -> response; never raises."""
        if not isinstance(request, dict):
            return {"ok": False, "error": "request must be a JSON object"}
        device, op, args = request.get("device"), request.get("op"), request.get("args") or {}
        if not isinstance(args, dict):
            return {"ok": False, "error": f"args must be a JSON object, got {type(args).__name__}"}
        if isinstance(op, str) and op.startswith("proxy."):
            return self._proxy_op(device, op, args)
        if isinstance(op, str) and op.startswith("dataplane."):
            if device is not None:
                return {"ok": False, "error": f"{op} is a twin-wide op: send it with device null"}
            return self.dataplane.control(op, args)
        if device is None:
            if op == "ping":
                return {"ok": True, "result": "pong"}
            if op == "clock":  # the ground truth's clock, for the caller to measure its offset
                return {"ok": True, "result": {"mono_ns": time.monotonic_ns(), "wall": time.time()}}
            if op == "endpoints":
                return {"ok": True, "result": self.endpoints.to_json() if self.endpoints else None}
            if op == "truth.open":  # the next run of a warm session: its ground truth goes to its own folder
                return self._open_truth(args.get("path"))
            return {"ok": False, "error": f"unknown twin op {op!r} (twin ops: ping, clock, endpoints, truth.open)"}
        target = self.devices.get(device)
        if target is None:
            return {"ok": False, "error": f"unknown device {device!r} (devices: {sorted(self.devices)})"}
        if op not in target.control_ops:
            return {"ok": False, "error": f"device {device!r} has no op {op!r} (ops: {target.control_ops})"}
        try:
            return {"ok": True, "result": getattr(target, op)(**args)}
        except Exception as exc:  # bad arguments, out-of-range ports: the caller gets the message
            return {"ok": False, "error": f"{op} on {device!r} failed: {type(exc).__name__}: {exc}"}

    def _open_truth(self, path: Any) -> dict[str, Any]:
        if not isinstance(path, str) or not path:
            return {"ok": False, "error": f"truth.open needs a file path, got {path!r}"}
        if self.truth is None:
            return {"ok": False, "error": "truth.open: this twin keeps no ground truth (start it with a truth_log)"}
        try:
            self.truth.reopen(path)
        except OSError as exc:
            return {"ok": False, "error": f"truth.open: cannot open {path}: {exc}"}
        return {"ok": True, "result": None}

    def dispatch_at(self, request: dict[str, Any]) -> dict[str, Any]:
        """A timed request: its op runs at request["at_ns"] (see Timed requests above); never raises."""
        at_ns, device, op = request["at_ns"], request.get("device"), request.get("op")
        if not isinstance(at_ns, int) or isinstance(at_ns, bool):
            return {"ok": False, "error": f"at_ns must be an integer (CLOCK_MONOTONIC ns), got {at_ns!r}"}
        target = self.devices.get(device) if isinstance(device, str) else None
        timed = getattr(target, "timed_ops", ())
        if op not in timed:
            ops = ", ".join(timed) or "none"
            return {"ok": False, "error": f"{op!r} on {device!r} cannot be timed (timed ops: {ops})"}
        late_ns = time.monotonic_ns() - at_ns
        if late_ns > 0:
            return {
                "ok": False,
                "missed": True,
                "error": f"{op} on {device!r} arrived {late_ns / 1e6:.3f} ms after its moment; nothing applied",
            }
        response, fired_ns, realtime = run_at(
            at_ns,
            lambda: self.dispatch({"device": device, "op": op, "args": request.get("args")}),
            lock=getattr(target, "timed_lock", None),  # the lock the device's ops take (see run_at)
        )
        if self.truth is not None:  # the conditions the fault was fired under, next to the fault itself
            self.truth.record("trigger", fired_ns, host=device, op=op, at_ns=at_ns, realtime=realtime)
        return response

    def _proxy_op(self, device: Any, op: str, args: dict[str, Any]) -> dict[str, Any]:
        if not self.fault_proxy:
            return {"ok": False, "error": f"{op}: this twin has no fault proxy (start it with fault_proxy=True)"}
        if device is None:
            if op != "proxy.reset":
                return {"ok": False, "error": f"{op} needs a device (twin-wide proxy op: proxy.reset)"}
            for each in self.proxies.values():
                each.reset()
            return {"ok": True, "result": None}
        proxy = self.proxies.get(device)
        if proxy is None:
            if device in self.devices:
                return {"ok": False, "error": f"device {device!r} has no TCP endpoint behind a fault proxy"}
            return {"ok": False, "error": f"unknown device {device!r} (devices: {sorted(self.devices)})"}
        handler = _PROXY_OPS.get(op)
        if handler is None:
            return {"ok": False, "error": f"unknown proxy op {op!r} (proxy ops: {', '.join(_PROXY_OPS)})"}
        try:
            return {"ok": True, "result": handler(proxy, **args)}
        except Exception as exc:  # a bad toxic, an unknown name: the caller gets the message
            return {"ok": False, "error": f"{op} on {device!r} failed: {type(exc).__name__}: {exc}"}

    async def _control_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while line := await reader.readline():
                try:
                    request = json.loads(line)
                except ValueError as exc:
                    response = {"ok": False, "error": f"invalid JSON request: {exc}"}
                else:
                    if isinstance(request, dict) and request.get("at_ns") is not None:
                        # Waited for on a thread of its own: the loop's other work cannot make it late.
                        response = await loop.run_in_executor(None, self.dispatch_at, request)
                    else:
                        response = self.dispatch(request)
                writer.write((json.dumps(response, default=str) + "\n").encode())
                await writer.drain()
        except (ConnectionError, ValueError, asyncio.LimitOverrunError):
            pass  # client vanished, or sent an over-long line: drop the connection
        finally:
            writer.close()


def _off_the_loop(fn) -> None:
    """Run `fn` on a thread of its own and wait for it: pyroute2's synchronous API runs an event loop of its own,
    which it cannot on a thread whose loop is running (the twin's).
    """
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="netns", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def _attributes(attributes: Any) -> dict[str, Any]:
    if attributes is None:
        return {}
    if not isinstance(attributes, dict):
        raise ValueError(f"attributes must be an object, got {attributes!r}")
    return attributes


def _add_toxic(
    proxy: FaultProxy,
    name: str,
    type: str,
    stream: str = "downstream",
    toxicity: float = 1.0,
    attributes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return proxy.add_toxic_from(name, type, stream, toxicity, _attributes(attributes))


def _update_toxic(
    proxy: FaultProxy, name: str, toxicity: float | None = None, attributes: dict[str, Any] | None = None
) -> dict[str, Any]:
    return proxy.update_toxic_from(name, toxicity, _attributes(attributes))


_PROXY_OPS: dict[str, Callable[..., Any]] = {
    "proxy.add_toxic": _add_toxic,
    "proxy.update_toxic": _update_toxic,
    "proxy.remove_toxic": lambda proxy, name: proxy.remove_toxic(name),
    "proxy.set_enabled": lambda proxy, enabled: proxy.set_enabled(enabled),
    "proxy.reset": lambda proxy: proxy.reset(),
    "proxy.state": lambda proxy: proxy.state(),
    "proxy.connections": lambda proxy: proxy.connections(),
}


def serve(spec: TwinSpec, *, exit_on_stdin_eof: bool = False, out: IO[str] | None = None) -> int:
    """Run the twin in this process until SIGTERM/SIGINT (or stdin EOF); returns the exit code."""
    # Many threads share the GIL here (SSH channels, `tail -F` loops, job output copiers, the loop). At the
    # default switch interval a woken thread can wait that long behind a busy one, and the twin would deliver
    # a job's output later than a real host does (docs/tuning.md, "The twin's timing").
    sys.setswitchinterval(GIL_SWITCH_S)
    loop = precise_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(_serve(spec, exit_on_stdin_eof, out or sys.stdout))
    finally:
        loop.close()


async def _serve(spec: TwinSpec, exit_on_stdin_eof: bool, out: IO[str]) -> int:
    loop = asyncio.get_running_loop()
    server = TwinServer(spec)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    try:
        endpoints = await server.start()
    except BaseException:
        await server.close()  # what start made (namespaces, links, listening sockets) goes with it
        raise
    # Everything built so far (devices, keys, paramiko, the loop) lives as long as the twin: out of the
    # collector's sight, a full collection does not walk it, and stops every thread for far less
    # (docs/tuning.md, "The twin's timing").
    gc.freeze()
    out.write(json.dumps(endpoints.to_json()) + "\n")  # the one line the parent waits for
    out.flush()
    if exit_on_stdin_eof:
        # A thread, not add_reader: stdin may be a file or /dev/null, which selectors reject.
        threading.Thread(target=_wait_for_eof, args=(loop, stop), daemon=True).start()
    await stop.wait()
    await server.close()
    return 0


def _wait_for_eof(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    try:
        loop.call_soon_threadsafe(stop.set)
    except RuntimeError:  # the loop is already closed
        pass


START_TIMEOUT_S = 20.0
# With --netns each host's namespace, veths and ports are made first: a margin of a few times bench/RESULTS.md's
# "--netns: twin start-up" row, per device.
NETNS_START_S_PER_DEVICE = 0.2


class TwinStartError(RuntimeError):
    """The twin process died or stayed silent before announcing its endpoints."""


class TwinProcess:
    """Spawns and owns one twin process. Use as a context manager, or start()/stop()."""

    def __init__(self, spec: TwinSpec, *, start_timeout: float | None = None, stop_timeout: float = 5.0):
        self.spec = spec
        if start_timeout is None:  # with --netns every host's namespace, veths and ports come first
            start_timeout = START_TIMEOUT_S + (NETNS_START_S_PER_DEVICE * len(spec.devices) if spec.netns else 0.0)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.endpoints: Endpoints | None = None
        self._control: TwinControl | None = None
        self._stderr: IO[bytes] | None = None

    def start(self) -> Endpoints:
        if self.process is not None:
            raise RuntimeError("twin process already started")
        self._stderr = tempfile.TemporaryFile()  # a file, not a pipe: nobody has to drain it
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "emulators", "serve", "-", "--exit-on-stdin-eof"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=_PACKAGE_ROOT,  # `-m` looks in the cwd first: import this very package
            env=env,
            # Own process group: a terminal Ctrl-C reaches the caller only, which may still need the
            # twin to restore the fabric while it aborts. Stdin EOF still ends the twin with its parent.
            process_group=0,
        )
        assert self.process.stdin is not None
        try:
            # stdin stays open: the twin exits when it closes, so a crashed parent leaves no orphan.
            self.process.stdin.write(self.spec.to_json().encode() + b"\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            self._fail("exited while reading its spec")
        line = self._read_line()
        try:
            self.endpoints = Endpoints.from_json(json.loads(line))
        except (ValueError, KeyError, TypeError) as exc:
            self._fail(f"announced unreadable endpoints {line[:200]!r} ({exc})")
        return self.endpoints

    @property
    def control(self) -> TwinControl:
        if self.endpoints is None:
            raise RuntimeError("twin process not started")
        if self._control is None:
            self._control = TwinControl(self.endpoints.control)
        return self._control

    def stop(self) -> int | None:
        """Terminate the twin (kill after stop_timeout s); returns its exit code."""
        if self._control is not None:
            self._control.close()
            self._control = None
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdin, proc.stdout, self._stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        return proc.returncode

    def __enter__(self) -> TwinProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _read_line(self) -> str:
        assert self.process is not None and self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + self.start_timeout
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in buf:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._fail(f"did not announce its endpoints within {self.start_timeout} s")
                if sel.select(remaining):
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        self._fail("exited before announcing its endpoints")
                    buf += chunk
        return buf.partition(b"\n")[0].decode(errors="replace")

    def _fail(self, what: str) -> NoReturn:
        assert self.process is not None and self._stderr is not None
        if self.process.poll() is None:
            self.process.kill()
        code = self.process.wait()
        self._stderr.seek(0)
        stderr = self._stderr.read().decode(errors="replace")[-4000:]
        self.stop()
        self.process = None
        raise TwinStartError(f"twin process {what} (exit code {code}); its stderr:\n{stderr or '(empty)'}")
