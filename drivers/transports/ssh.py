"""SSH transport (paramiko): one reused connection per host, exec channels, host keys always verified.

Host keys are checked against a known_hosts file with paramiko's RejectPolicy: an unknown or changed
key is an error naming the file and the command that fixes it, never accepted silently. Authentication
uses a key file, or the SSH agent when no key file is given. Every exec is audited (the command as
"tx", its output, stderr and exit status as "rx"). A connection that dropped is re-opened once, only
before the command was sent, so a command is never run twice.

`stream` runs a long-lived command (e.g. `tail -F`) on its own channel of the same connection and yields
its output as it arrives, each piece timestamped on receipt; channels are independent, so exec calls can
run while a stream is open.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import paramiko
from cryptography.exceptions import InvalidTag

from drivers.arrival import Arrivals, rx_stamped
from drivers.audit import AuditSink, record
from drivers.errors import DeviceCommandError, DeviceConnectionError, DeviceError, DeviceTimeout
from drivers.transports._common import no_delay
from drivers.transports.ssh_settings import SshSettings

RECONNECTS = "the host went down or sshd restarted; the next call reconnects"
# What a lost or garbled connection raises. InvalidTag: a packet whose AES-GCM tag does not verify (cut
# or corrupted on the way); paramiko passes it on as it is, where with the -ctr ciphers it says
# "Mismatched MAC" (an SSHException).
CONNECTION_LOST = (OSError, EOFError, paramiko.SSHException, InvalidTag)


@dataclass(frozen=True)
class ExecResult:
    command: str
    stdout: str
    stderr: str
    status: int


@dataclass(frozen=True)
class StreamChunk:
    """A piece of a streaming command's life: "out" / "err" bytes as received, "idle" (nothing arrived for
    the idle interval), or "exit" with the remote exit status (-1: killed by a signal, no status sent).
    mono_ns is time.monotonic_ns() taken when the piece was read (or the idle interval ended). For "out",
    `arrived` says when its bytes reached this machine: (end offset in data, monotonic ns) per SSH packet.
    """

    kind: str
    data: bytes
    mono_ns: int
    status: int | None = None
    arrived: tuple[tuple[int, int], ...] = ()

    def arrival_ns(self, offset: int) -> int:
        """When data[offset] arrived (mono_ns when not known)."""
        for end, ns in self.arrived:
            if offset < end:
                return ns
        return self.mono_ns


_known_hosts_files: dict[str, tuple[tuple[int, int, int], paramiko.HostKeys]] = {}
_known_hosts_lock = threading.Lock()


def _known_hosts(path: str) -> paramiko.HostKeys:
    """The known_hosts file `path`, parsed once per version of the file (inode, size, mtime) for every
    connection of this process. paramiko's load checks each line against every line before it (quadratic),
    and each SSHClient parsed the file anew and kept its copy: at the scale of the Opus twin's hosts, all
    connecting from one hub, that was CPU and memory the hub could not spare (docs/tuning.md, "SSH"). Raises
    what reading or parsing the file raises.
    """
    st = os.stat(path)
    version = (st.st_ino, st.st_size, st.st_mtime_ns)
    with _known_hosts_lock:  # held while parsing: connections started together wait for one parse
        cached = _known_hosts_files.get(path)
        if cached is None or cached[0] != version:
            cached = _known_hosts_files[path] = (version, paramiko.HostKeys(path))
        return cached[1]


# How many SSH handshakes one process runs at once. A handshake is CPU under the GIL (key exchange, host key
# check, authentication) between a few round trips; a device hub that connects its 64 hosts with all 64 in
# flight spends most of its time handing the GIL over, which the hub's short switch interval
# (testbed/engine/device_actor.py) multiplies, and every round trip waits behind the others. Hosts on the lab's
# network answer faster than a handshake computes, so four keep the core busy; hosts far away would want more
# (docs/tuning.md, "SSH", has the measurements).
HANDSHAKES_AT_ONCE = 4
_handshakes = threading.BoundedSemaphore(HANDSHAKES_AT_ONCE)


class _AeadFirstTransport(paramiko.Transport):
    """paramiko's client transport, offering AES-GCM first. An AEAD cipher's tag is checked by the
    cryptography library; with the -ctr ciphers paramiko compares every packet's MAC in a Python loop, a
    quarter of an exec's CPU on a control host driving 64 hosts at once. OpenSSH offers both by default,
    so any sshd has them; the others stay in the list, after them.
    """

    _preferred_ciphers = (
        "aes128-gcm@openssh.com",
        "aes256-gcm@openssh.com",
        # paramiko's own order (a private attribute its stubs do not declare)
        *(c for c in paramiko.Transport._preferred_ciphers if "-gcm@" not in c),  # type: ignore[attr-defined]
    )


class SshTransport:
    def __init__(self, settings: SshSettings, device: str, audit: AuditSink | None = None) -> None:
        self.settings = settings
        self.device = device
        self.audit = audit
        self.address = settings.address
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()

    # --- connection ----------------------------------------------------------------------------

    def _error(self, cls, message: str, *, sent: str | None = None, received=None, hint: str | None = None):
        return cls(message, device=self.device, address=self.address, sent=sent, received=received, hint=hint)

    def _timed_out(self, command: str, message: str, hint: str) -> DeviceError:
        record(self.audit, self.device, self.address, "rx", "(timeout)")
        return self._error(DeviceTimeout, message, sent=command, hint=hint)

    def _dropped(self, command: str, message: str, hint: str, why: object) -> DeviceError:
        """The connection is gone: audited, closed (the next call reconnects), and the error to raise."""
        record(self.audit, self.device, self.address, "rx", f"(connection lost: {why})")
        self.close()
        return self._error(DeviceConnectionError, message, sent=command, hint=hint)

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            client = self._client
            if client is not None:
                t = client.get_transport()
                if t is not None and t.is_active():
                    return t
                client.close()
                self._client = None
            self._client = self._connect()
            t = self._client.get_transport()
            assert t is not None
            return t

    def _connect(self) -> paramiko.SSHClient:
        s = self.settings
        kh = s.known_hosts_path
        client = paramiko.SSHClient()
        try:
            # Only this host's keys, from the file parsed once (_known_hosts): paramiko checks the server's key
            # against them, under the same name, exactly as if the client had loaded the whole file.
            for keytype, key in (_known_hosts(kh).lookup(s.host_key_name) or {}).items():
                client.get_host_keys().add(s.host_key_name, keytype, key)
        except FileNotFoundError:
            pass  # every key is then unknown: RejectPolicy says so below, naming the file
        except (OSError, paramiko.SSHException) as exc:
            raise self._error(
                DeviceConnectionError,
                f"cannot read the known_hosts file {kh}: {exc}",
                hint="set known_hosts in the inventory's ssh transport to a readable OpenSSH known_hosts file",
            ) from exc
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        keyscan = f"ssh-keyscan -p {s.port} -t ed25519,ecdsa,rsa {s.host} >> {kh}"
        try:
            # Our own socket, so that the kernel's receive stamps reach the stream's lines (drivers/arrival.py).
            sock = rx_stamped(socket.create_connection((s.host, s.port), timeout=s.timeout_s))
            # No Nagle: SSH writes small messages back to back (KEXINIT then the key exchange, a channel open then
            # its request), and Nagle holds the second until the first is acknowledged, which a server may
            # delay by tens of milliseconds. OpenSSH sets it for interactive sessions (docs/tuning.md, "SSH").
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with _handshakes:  # a host that does not answer has timed out above, holding no slot
                client.connect(
                    s.host,
                    port=s.port,
                    sock=sock,
                    username=s.user,
                    key_filename=s.key_file,
                    allow_agent=s.key_file is None,
                    look_for_keys=False,
                    timeout=s.timeout_s,
                    banner_timeout=s.timeout_s,
                    auth_timeout=s.timeout_s,
                    channel_timeout=s.timeout_s,
                    # a Transport takes gss_kex and gss_deleg_creds, as connect() passes them; its stubs leave them out
                    transport_factory=_AeadFirstTransport,  # type: ignore[arg-type]
                )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise self._error(
                DeviceConnectionError,
                f"the host key of {s.host_key_name} does not match the one in {kh} (got "
                f"{exc.key.get_name()} {exc.key.fingerprint}): the host was reinstalled, or someone is in "
                "between",
                hint=f"find out which; if the change is expected, remove the old key with "
                f"`ssh-keygen -f {kh} -R '{s.host_key_name}'`, then verify and add the new one ({keyscan})",
            ) from exc
        except paramiko.AuthenticationException as exc:
            client.close()
            how = f"the key {s.key_file}" if s.key_file else "the keys in the SSH agent (SSH_AUTH_SOCK)"
            raise self._error(
                DeviceConnectionError,
                f"authentication as {s.user!r} failed with {how}: {exc}",
                hint="check `user` and `key_file` in the inventory's ssh transport, that the public key is in "
                f"~{s.user}/.ssh/authorized_keys on the host, and that the key file is readable (mode 0600)",
            ) from exc
        except paramiko.SSHException as exc:
            client.close()
            if "not found in known_hosts" in str(exc):
                raise self._error(
                    DeviceConnectionError,
                    f"the host key of {s.host_key_name} is not in {kh}; refusing to connect to an unknown host",
                    hint=f"verify the host's key fingerprint out of band, then add it: `{keyscan}` (or set "
                    "known_hosts in the inventory's ssh transport); keys are never accepted automatically",
                ) from exc
            raise self._error(
                DeviceConnectionError,
                f"SSH handshake with {s.host}:{s.port} failed: {exc}",
                hint="check that an SSH server (not another service) listens on that port",
            ) from exc
        except FileNotFoundError as exc:
            client.close()
            raise self._error(
                DeviceConnectionError,
                f"the key file {s.key_file} does not exist",
                hint="set key_file in the inventory's ssh transport to a private key (or omit it to use the agent)",
            ) from exc
        except TimeoutError as exc:
            client.close()
            raise self._error(
                DeviceConnectionError,
                f"no answer from {s.host}:{s.port} within {s.timeout_s:g} s",
                hint="check that the host is powered on and reachable (BMC/IPMI power status, the network); "
                "raise timeout_ms in the inventory if the network is slow",
            ) from exc
        except (OSError, EOFError, InvalidTag) as exc:
            client.close()
            raise self._error(
                DeviceConnectionError,
                f"cannot connect to {s.host}:{s.port}: {exc!r}",
                hint="the host is off or rebooting, sshd is not running, or host/port in the inventory are wrong",
            ) from exc
        t = client.get_transport()
        if t is not None:
            t.set_keepalive(max(1, int(s.timeout_s)))
            # As OpenSSH does for interactive sessions: a command, a window adjustment and a streamed log
            # line are small segments, and with Nagle's algorithm each may wait for the ACK of the last.
            no_delay(t.sock)
        return client

    # --- exec ----------------------------------------------------------------------------------

    def exec(self, command: str, *, timeout_s: float | None = None, check: bool = True) -> ExecResult:
        """Run one command; raise DeviceCommandError on a non-zero exit status when check is true."""
        timeout = timeout_s if timeout_s is not None else self.settings.timeout_s
        channel = self._open_channel(command)
        record(self.audit, self.device, self.address, "tx", command)
        try:
            deadline = time.monotonic() + timeout
            channel.settimeout(timeout)
            _exec_request(channel, command, timeout)
            out = _read_all(channel.makefile("rb"), deadline)
            err = _read_all(channel.makefile_stderr("rb"), deadline)
            if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError
            if _connection_lost(channel):
                # The channel was closed by a dying connection, not by the command ending: paramiko then
                # reports exit status -1, which must not read as the command's failure.
                raise EOFError("the connection closed before the command's exit status arrived")
            status = channel.recv_exit_status()
        except TimeoutError as exc:
            _close_quietly(channel)
            raise self._timed_out(
                command,
                f"no complete answer within {timeout:g} s",
                hint="the host is overloaded or the command hangs; the command may still be running there",
            ) from exc
        except CONNECTION_LOST as exc:
            raise self._dropped(
                command,
                f"the connection dropped while running the command: {exc!r}",
                hint="the host went down or sshd restarted; the next call reconnects, but whether this command ran "
                "is unknown",
                why=exc,
            ) from exc
        finally:
            _close_quietly(channel)
        stdout = out.decode("utf-8", errors="backslashreplace")
        stderr = err.decode("utf-8", errors="backslashreplace")
        rx = stdout + (f"\n[stderr] {stderr}" if stderr else "") + f"\n[exit {status}]"
        record(self.audit, self.device, self.address, "rx", rx)
        result = ExecResult(command, stdout, stderr, status)
        if check and status != 0:
            raise self._error(
                DeviceCommandError,
                f"command failed with exit status {status}: {(stderr or stdout).strip()[:500]}",
                sent=command,
                received=(stderr or stdout)[-2000:],
                hint=_status_hint(status),
            )
        return result

    def stream(self, command: str, *, idle_s: float) -> Iterator[StreamChunk]:
        """Run `command` and yield its output as it arrives (select on the channel, idle_s as timeout).

        Ends with an "exit" chunk. Closing the generator closes the channel (the remote side sees its
        reader go away). A connection that drops raises DeviceConnectionError.
        """
        if not idle_s > 0:
            raise ValueError(f"idle_s must be > 0, got {idle_s!r}")
        channel = self._open_channel(command)
        arrivals = Arrivals(channel)
        record(self.audit, self.device, self.address, "tx", command)
        try:
            try:
                _exec_request(channel, command, self.settings.timeout_s)
                while True:
                    readable, _, _ = select.select([channel], [], [], idle_s)
                    if channel.recv_stderr_ready():
                        data = channel.recv_stderr(65536)
                        ns = record(self.audit, self.device, self.address, "rx", b"[stderr] " + data)
                        yield StreamChunk("err", data, ns)
                    if not readable and not channel.recv_ready():
                        yield StreamChunk("idle", b"", time.monotonic_ns())
                        continue
                    if not channel.recv_ready() and not (channel.eof_received or channel.closed):
                        continue  # stderr alone woke us: recv would block until stdout has something
                    data = channel.recv(65536)
                    if not data:
                        break  # EOF: the command ended (or the connection went)
                    ns = record(self.audit, self.device, self.address, "rx", data)
                    yield StreamChunk("out", data, ns, arrived=arrivals.take(len(data)))
                channel.status_event.wait(self.settings.timeout_s)
                while channel.recv_stderr_ready():
                    data = channel.recv_stderr(65536)
                    yield StreamChunk("err", data, record(self.audit, self.device, self.address, "rx", data))
            except TimeoutError as exc:  # only from the exec request: later silence is "idle"
                raise self._timed_out(
                    command,
                    f"the host did not answer the exec request within {self.settings.timeout_s:g} s",
                    hint="the host is overloaded or the connection stalled; the command may have started there",
                ) from exc
            except CONNECTION_LOST as exc:
                raise self._dropped(
                    command, f"the connection dropped while streaming: {exc!r}", hint=RECONNECTS, why=exc
                ) from exc
            if not channel.status_event.is_set() or _connection_lost(channel):
                raise self._dropped(
                    command,
                    "the connection dropped while streaming (the channel closed without an exit status)",
                    hint=RECONNECTS,
                    why="no exit status",
                )
            status = channel.exit_status
            yield StreamChunk(
                "exit", b"", record(self.audit, self.device, self.address, "rx", f"[exit {status}]"), status
            )
        finally:
            _close_quietly(channel)

    def _open_channel(self, command: str) -> paramiko.Channel:
        for attempt in (1, 2):
            transport = self._transport()
            try:
                return transport.open_session(timeout=self.settings.timeout_s)
            except CONNECTION_LOST as exc:
                self.close()  # a dead connection: reconnect once (nothing was sent yet)
                if attempt == 2:
                    raise self._error(
                        DeviceConnectionError,
                        f"cannot open a session channel: {exc!r}",
                        sent=command,
                        hint="the host refuses new sessions (MaxSessions in sshd_config?) or went down",
                    ) from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def _exec_request(channel: paramiko.Channel, command: str, timeout: float) -> None:
    """channel.exec_command, bounded by `timeout`: paramiko waits for the server's answer to the exec
    request without any timeout, so a connection that stalls right after the channel opened would hang
    the caller for ever. A watchdog closes the channel instead; that wakes paramiko, and TimeoutError is
    raised (the command may have started on the host: the caller reports an unknown outcome).
    """
    fired = threading.Event()

    def expire() -> None:
        fired.set()
        _close_quietly(channel)

    watchdog = threading.Timer(timeout, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        channel.exec_command(command)
    except CONNECTION_LOST:
        if fired.is_set():
            raise TimeoutError from None
        raise
    finally:
        watchdog.cancel()
    if fired.is_set():  # answered just as the watchdog closed the channel: the channel is unusable
        raise TimeoutError


def _connection_lost(channel: paramiko.Channel) -> bool:
    """Whether the channel ended with its connection (no exit status, transport gone)."""
    transport = channel.get_transport()
    return channel.exit_status == -1 and (transport is None or not transport.is_active())


def _close_quietly(channel: paramiko.Channel) -> None:
    # close() sends CHANNEL_CLOSE; on a connection that has just died paramiko raises EOFError/OSError
    # from it, which would replace the typed error being raised with a raw one.
    try:
        channel.close()
    except CONNECTION_LOST:
        pass


def _read_all(stream, deadline: float) -> bytes:
    chunks: list[bytes] = []
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError
        chunk = stream.read(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _status_hint(status: int) -> str:
    if status == 127:
        return "the program is not installed on the host, or not on the PATH of a non-interactive login"
    if status == 126:
        return "the program exists but cannot be executed (permissions, or not on the host's allowlist)"
    if status == 255:
        return "ssh or the remote side failed; check the host's sshd log"
    return "see the command's stderr above"
