"""The HTTP under the BMC driver, held to what a hostile or broken BMC must not be able to do to it.

DMTF's client (`redfish`) sends its requests through a `requests` session, into which it mounts the transport
adapter it is given (`https_adapter`). This one:

- follows no redirect to another origin or to plain HTTP: `requests` keeps the session's `X-Auth-Token` header
  across a redirect (it strips only `Authorization`), so a BMC, or whoever answers at its address, could send the
  token anywhere. A redirect within the BMC's own https origin goes on as usual;
- bounds each request by one deadline, from the connection to the body's last byte: `requests`' timeout bounds
  each socket read, so a BMC trickling a byte a second would hold a call for as long as it likes. A watchdog shuts
  the request's socket when the deadline passes;
- reads at most `max_body` bytes of a body: a 300 MB answer is refused, not read whole into memory;
- verifies the BMC's certificate with a TLS context of its own (`verifying_context`): standard X.509 path
  validation and the hostname, against the CA file it is given, where every certificate in that file is a trust
  anchor. That is what lets a lab pin the BMC's own certificate even when a CA issued it: OpenSSL otherwise
  accepts only a self-signed certificate as the end of a chain (urllib3's default context, on Python before
  3.13, does not set VERIFY_X509_PARTIAL_CHAIN), so a pinned CA-issued leaf failed with "self-signed certificate
  in certificate chain" or "unable to get local issuer certificate".

Each is raised as its own exception (below); the driver turns them into device errors that say what happened.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from urllib.parse import urljoin, urlsplit

from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.util.ssl_ import create_urllib3_context

MAX_BODY = 16 * 1024 * 1024  # a Redfish resource is kilobytes; a BMC's largest (a log) well under this
CHUNK = 64 * 1024


class RedirectRefused(Exception):
    """The BMC redirected to another origin or to plain HTTP; nothing was sent there."""

    def __init__(self, target: str) -> None:
        super().__init__(f"redirected to {target}")
        self.target = target


class DeadlineExceeded(Exception):
    """No whole answer within the request's deadline (the connection was shut)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no whole answer within {seconds:g} s")
        self.seconds = seconds


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the answer's body is larger than {limit} bytes")
        self.limit = limit


def verifying_context(ca_file: str) -> ssl.SSLContext:
    """The TLS context a BMC's certificate is checked with: certificate required, hostname checked (an IP
    address against the certificate's IP SANs), TLS 1.2 or later, trusting what `ca_file` holds.

    VERIFY_X509_PARTIAL_CHAIN makes each certificate in `ca_file` a trust anchor, whether or not it signed
    itself: a CA's certificate anchors the chains it issued (the standard case, unchanged), and a BMC's own
    certificate, pinned, anchors itself whoever issued it. Python 3.13's default context sets the same flag.
    Nothing else is relaxed: the pinned certificate must still be valid now, be for a server, and name the
    host in bmc.address.
    """
    context = create_urllib3_context(cert_reqs=ssl.CERT_REQUIRED, verify_flags=ssl.VERIFY_X509_PARTIAL_CHAIN)
    context.check_hostname = True
    context.load_verify_locations(cafile=ca_file)
    return context


class GuardedAdapter(HTTPAdapter):
    """A transport adapter for one BMC origin (`https://host[:port]`), with a deadline per request, a cap on
    the body, and the BMC's certificate verified against `ca_file` (`verifying_context`).
    """

    def __init__(self, origin: str, deadline_s: float, ca_file: str, max_body: int = MAX_BODY) -> None:
        self.origin = _origin(origin)
        self.deadline_s = deadline_s
        self.max_body = max_body
        self.ssl_context = verifying_context(ca_file)  # before super().__init__, which makes the pool manager
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args, **kwargs) -> None:
        kwargs["ssl_context"] = self.ssl_context
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _WatchedPool, "https": _WatchedHttpsPool}

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
        target = _origin(request.url)
        if target != self.origin:
            raise RedirectRefused(request.url)
        watch = _Watchdog(self.deadline_s)
        try:
            with watch:
                response = super().send(
                    request, stream=True, timeout=timeout, verify=verify, cert=cert, proxies=proxies
                )
                if response.is_redirect:
                    location = urljoin(request.url, response.headers.get("location", ""))
                    if _origin(location) != self.origin:
                        response.close()
                        raise RedirectRefused(location)
                response._content = self._body(response)  # read here, under the deadline and the cap
        except Exception:
            if watch.fired:
                raise DeadlineExceeded(self.deadline_s) from None
            raise
        return response

    def _body(self, response) -> bytes:
        size, chunks = 0, []
        for chunk in response.raw.stream(CHUNK, decode_content=True):
            size += len(chunk)
            if size > self.max_body:
                response.close()
                raise BodyTooLarge(self.max_body)
            chunks.append(chunk)
        return b"".join(chunks)


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower().rstrip("."), parts.port or (443 if scheme == "https" else 80)


# --- the watchdog: the socket of the request under way, shut when its deadline passes ----------------------------

_current = threading.local()  # the watchdog of the request this thread is making


class _Watchdog:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.fired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> _Watchdog:
        _current.watchdog = self
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()
        _current.watchdog = None

    def watch(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            fired = self.fired
        if fired:
            _shut(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)  # the blocked read returns at once; the pool drops the connection


def _watched(connection_class):
    class Watched(connection_class):
        """A connection whose socket the request's watchdog may shut (registered at each request it sends)."""

        def request(self, *args, **kwargs):
            watchdog = getattr(_current, "watchdog", None)
            if watchdog is not None:
                if self.sock is None:
                    self.connect()
                watchdog.watch(self.sock)
            return super().request(*args, **kwargs)

    Watched.__name__ = f"Watched{connection_class.__name__}"
    return Watched


class _WatchedPool(HTTPConnectionPool):
    ConnectionCls = _watched(HTTPConnection)


class _WatchedHttpsPool(HTTPSConnectionPool):
    ConnectionCls = _watched(HTTPSConnection)


def deadline_left(started: float, seconds: float) -> float:
    return max(0.0, seconds - (time.monotonic() - started))
