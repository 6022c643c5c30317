"""The server's remote listener (off unless `testbed serve --remote` is given): the same API as the Unix socket
(testbed.serve.api), over TLS 1.2+, where each request carries `Authorization: Bearer TOKEN`.

A TCP connection has no kernel-given account, so the token says who the client is: the tokens file maps each
user to the SHA-256 digest of their token (`testbed token new USER` makes one). The tokens are 256 random bits,
not passwords a person picks, so a fast digest is enough: nobody can guess one from its digest. The file is the
server's secret: refused unless its account owns it and nobody else may read or write it; it is read again when it
changes (or on SIGHUP), so a token is added or revoked without a restart. A request without a token the file
lists gets 401 and nothing more.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pwd
import re
import secrets
import ssl
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.contracts.errors import UserError
from testbed.events import safe_files
from testbed.events.safe_files import UnsafeFile
from testbed.serve.identity import Peer, user_name

DIGEST_PREFIX = "sha256:"
MAX_TOKENS_BYTES = 1 << 20  # a tokens file is a line a user: more is not one (and is not read whole)
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # an account's name, or a uid


@dataclass(frozen=True)
class RemoteAddress:
    host: str
    port: int


def parse_address(text: str, option: str) -> RemoteAddress:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise UserError(f"{option} {text}: give HOST:PORT, e.g. 0.0.0.0:8443 (port 0: any free port)")
    return RemoteAddress(host.strip("[]"), int(port))


# -- tokens ---------------------------------------------------------------------------------------------------------


def digest(token: str) -> str:
    return DIGEST_PREFIX + hashlib.sha256(token.encode()).hexdigest()


def read_private(path: Path, what: str) -> str:
    """The text of a tokens file, or UserError when it is not a plain file of this account's that only it may read
    and write (testbed.events.safe_files.read_private says why each is refused).
    """
    try:
        data = safe_files.read_private(path, MAX_TOKENS_BYTES)
    except FileNotFoundError:
        raise UserError(f"{what} {path}: no such file") from None
    except UnsafeFile as exc:
        raise UserError(f"{what} {exc}") from None
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot read it: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} {path}: not UTF-8 text ({exc})") from None


def read_tokens(path: Path) -> dict[str, str]:
    """user -> token digest, from a tokens file (`USER: sha256:HEX` a line; # starts a comment); UserError saying
    which line is wrong, never quoting a digest.
    """
    text = read_private(path, "--tokens")
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        user, sep, value = (part.strip() for part in line.partition(":"))
        if not sep or not _USER.fullmatch(user) or not re.fullmatch(r"sha256:[0-9a-f]{64}", value):
            raise UserError(f"--tokens {path}, line {number}: give `USER: sha256:HEX` (testbed token new makes it)")
        if user in found:
            raise UserError(f"--tokens {path}, line {number}: {user} has a token already (one a user)")
        account(user, f"--tokens {path}, line {number}")
        found[user] = value
    return found


def account(user: str, where: str) -> tuple[int, int]:
    """The (uid, gid) of a token's user: an account of this machine, or a uid (an account with no passwd entry)."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        if user.isdigit():
            return int(user), -1
        raise UserError(f"{where}: {user} is no account of this machine (nor a uid)") from None
    return entry.pw_uid, entry.pw_gid


class Tokens:
    """The tokens file as the server reads it: again whenever it changed since the last request, or after SIGHUP.
    A file that becomes unreadable or unsafe admits nobody until it is fixed (said on the server's output once).
    """

    def __init__(self, path: Path, say=print) -> None:
        self.path, self.say = path, say
        self._lock = threading.Lock()
        self._digests = read_tokens(path)  # a bad file at the start: the server does not start
        self._seen = self._version()
        self._reread = False

    def _version(self) -> tuple | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode, st.st_uid)

    def reread(self) -> None:
        """Read the file again at the next request (SIGHUP)."""
        self._reread = True

    def user_of(self, token: str) -> str | None:
        """The user whose token this is, or None. Every digest is compared, each in constant time, so the time taken
        says nothing of which user or how much of a digest matched.
        """
        with self._lock:
            version = self._version()
            if self._reread or version != self._seen:
                self._reread, self._seen = False, version
                try:
                    self._digests = read_tokens(self.path)
                except UserError as exc:
                    self._digests = {}
                    self.say(f"the tokens file is refused, no remote client is admitted until it is fixed: {exc}")
                else:
                    self.say(f"read {self.path} again: {len(self._digests)} token(s)")
            digests = self._digests
        given = digest(token).encode()
        found = None
        for user, known in digests.items():
            if hmac.compare_digest(given, known.encode()):
                found = user
        return found

    def peer(self, token: str) -> Peer | None:
        user = self.user_of(token)
        if user is None:
            return None
        try:
            uid, gid = account(user, "token")
        except UserError:  # the account was removed since the file was read: its token admits nobody
            return None
        return Peer(uid=uid, gid=gid, pid=0, user=user_name(uid), remote=True)


def new_token(path: Path, user: str) -> str:
    """A fresh random token for `user`, its digest stored in the tokens file (made 0600 if it is not there; the user's
    old token, if any, replaced) -> the token, which is stored nowhere.
    """
    if not _USER.fullmatch(user):
        raise UserError(f"{user}: give an account's name or a uid")
    account(user, "testbed token new")
    lines = _lines_without(path, user) if path.exists() else []
    token = secrets.token_urlsafe(32)
    _write_private(path, lines + [f"{user}: {digest(token)}"])
    return token


def remove_token(path: Path, user: str) -> None:
    lines = _lines_without(path, user)
    if len(lines) == len(path.read_text(encoding="utf-8").splitlines()):
        raise UserError(f"--tokens {path}: {user} has no token there")
    _write_private(path, lines)


def _lines_without(path: Path, user: str) -> list[str]:
    read_tokens(path)  # refused as the server would refuse it, before it is rewritten
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.partition(":")[0].strip() != user]


def _write_private(path: Path, lines: list[str]) -> None:
    """Write the file whole: a 0600 temporary beside it, synced, renamed over it (the server never reads half)."""
    folder = path.absolute().parent
    try:
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.")  # mkstemp: 0600, this account's
    except OSError as exc:
        raise UserError(f"--tokens {path}: cannot write in {folder}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write("".join(line + "\n" for line in lines))
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


# -- the listener ---------------------------------------------------------------------------------------------------


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """TLS 1.2 and newer alone, with the lab's certificate; UserError naming the file that would not load."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except FileNotFoundError as exc:
        raise UserError(f"--tls-cert/--tls-key: {exc.filename}: no such file") from None
    except (ssl.SSLError, OSError) as exc:
        raise UserError(f"--tls-cert {cert} --tls-key {key}: not a certificate and its key: {exc}") from None
    return context


@dataclass
class Remote:
    """What `testbed serve --remote` listens with: its address, TLS context and tokens (each checked at the start)."""

    address: RemoteAddress
    context: ssl.SSLContext
    tokens: Tokens


def authenticate(tokens: Tokens):
    """The aiohttp middleware of the remote listener: a request's Peer from its bearer token, or 401, saying no more
    (not whether the token was known, nor whose it was).
    """
    from aiohttp import web

    from testbed.serve.api import PEER_KEY

    @web.middleware
    async def middleware(request: web.Request, handler):
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        peer = tokens.peer(token.strip()) if scheme.lower() == "bearer" and token.strip() else None
        if peer is None:
            refused = '{"error": "unauthorized"}'
            raise web.HTTPUnauthorized(
                text=refused, content_type="application/json", headers={"WWW-Authenticate": "Bearer"}
            )
        request[PEER_KEY] = peer
        return await handler(request)

    return middleware


async def start_listener(service: Any, remote: Remote):
    """The API on the remote address, over TLS -> (aiohttp's runner, the port it listens on)."""
    from aiohttp import web

    from testbed.serve.api import make_app

    runner = web.AppRunner(make_app(service, authenticate=authenticate(remote.tokens)), handle_signals=False,
                           access_log=None)  # fmt: skip
    await runner.setup()
    site = web.TCPSite(runner, remote.address.host, remote.address.port, ssl_context=remote.context,
                       shutdown_timeout=1.0)  # fmt: skip
    await site.start()
    return runner, runner.addresses[0][1]
