"""The twin's adapter for kind "gpu_host": one engine, one SSH server on 127.0.0.1:ephemeral (or, with --netns,
on the host's management address inside its own network namespace: `place`, docs/netns.md).
"""

from __future__ import annotations

import asyncio

from emulators.gpuhost.host import GpuHostEngine
from emulators.gpuhost.keys import keystore, new_ed25519
from emulators.gpuhost.server import SshServer
from emulators.gpuhost.shell import Shell, Stream
from emulators.gpuhost.spec import GpuHostSpec
from emulators.netns import entered


class GpuHostAdapter:
    kind = "gpu_host"
    control_ops = GpuHostEngine.control_ops
    timed_ops = GpuHostEngine.control_ops  # they take the engine's lock (SSH sessions call it from their threads)

    def __init__(self, spec: GpuHostSpec) -> None:
        self.name = spec.name
        self.spec = spec
        self.keys = keystore()
        self.engine = GpuHostEngine(spec, self.keys.host_dir(spec.name))
        self.shell = Shell(self.engine)
        self.host_key = new_ed25519()[0]
        self.server = SshServer(spec.name, self.host_key, spec.user, self.keys.client_key, self._run)
        self.engine.on_power = self._power
        self._closed = False
        self.netns: str | None = None  # the host's network namespace (--netns), None on loopback

    def place(self, netns: str, address: str, profile: dict[str, str] | None = None) -> None:
        """The host lives in network namespace `netns` at `address`: its SSH server listens there, and every
        process it starts (ranks, torchrun, agents) starts there, with `profile` in its environment (a job's
        own environment overrides it). Called before `start`.
        """
        self.netns = netns
        self.engine.netns = netns
        self.engine.profile = dict(profile or {})
        self.server.bind = address

    def _listen(self) -> None:
        # setns acts on this thread alone; the socket, and the accept thread started here, stay in the namespace.
        with entered(self.netns):
            self.server.listen()

    def __getattr__(self, op: str):
        if op in GpuHostEngine.control_ops:
            return getattr(self.engine, op)
        raise AttributeError(op)

    @property
    def timed_lock(self):
        """Held by a timed op from just before its moment (see TwinServer.dispatch_at)."""
        return self.engine.lock

    def attach_truth(self, truth) -> None:
        """Log this host's faults and its jobs' output lines in the twin's ground truth (emulators/truth.py)."""
        self.engine.truth = truth

    def _run(self, command: str, stream: Stream | None = None) -> tuple[str, str, int]:
        if not self.engine.powered:  # a channel that raced power_off
            return "", "", 255
        return self.shell.run(command, stream)

    def _power(self, on: bool) -> None:
        if on:
            self._listen()
        else:
            self.server.stop_listening()

    def endpoints(self) -> dict[str, str]:
        return {
            "ssh": self.server.address,
            "user": self.spec.user,
            "known_hosts": str(self.keys.known_hosts),
            "key_file": str(self.keys.key_file),
        }

    async def start(self, loop: asyncio.AbstractEventLoop | None = None) -> dict[str, str]:
        self.start_sync()
        return self.endpoints()

    def start_sync(self) -> dict[str, str]:
        """Start serving (outside an event loop, e.g. in tests)."""
        self._listen()
        self.keys.add_known_host(self.server.port, self.host_key, self.server.bind)
        return self.endpoints()

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close_sync)

    def close_sync(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.server.stop_listening()
        self.engine.close()
        self.keys.release()
