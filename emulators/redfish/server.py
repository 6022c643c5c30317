"""The twin's BMCs on the wire: HTTPS on 127.0.0.1, one port per emulated host, all served by one thread.

A twin emulates up to a few hundred hosts, so a BMC costs a listening socket and a RedfishService, not a
thread: one accept thread waits on every BMC's listening socket at once (an epoll selector), and each
accepted connection is served on a short-lived thread of its own (TLS handshake, then HTTP/1.1 keep-alive
requests until the client closes or stays idle for IDLE_S). The port a connection came in on says which
BMC it reached, as each real BMC has an address of its own.

TLS: one self-signed certificate for 127.0.0.1 (ECDSA P-256, generated with `cryptography` when the server
is made), written with its key into a private temporary directory; `cert_file` is handed out with every
endpoint (`redfish_ca`) so that clients verify the BMC instead of turning verification off.

HTTP parsing is the standard library's (http.server): request line, headers and their limits; this module
adds the body (Content-Length only, at most MAX_BODY bytes) and turns every error into a Redfish error body.
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import os
import selectors
import shutil
import socket
import ssl
import tempfile
import threading
from pathlib import Path
from typing import cast

from emulators.redfish.service import PowerTarget, RedfishService, Response, error

IDLE_S = 15.0  # a kept-alive connection that sends nothing for this long is closed (and its thread ends)
HANDSHAKE_S = 10.0
MAX_BODY = 64 * 1024  # a Reset or a login is a few dozen bytes; anything much larger is not for this BMC
ACCEPT_BACKLOG = 16


def self_signed_certificate(directory: Path, addresses: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 / localhost (and `addresses`: the BMCs' own, with --netns) and its private key,
    as PEM files (0600) in `directory`.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "testbed twin BMC")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    *(x509.IPAddress(ipaddress.ip_address(a)) for a in dict.fromkeys(("127.0.0.1", *addresses))),
                    x509.DNSName("localhost"),
                ]
            ),
            critical=False,
        )
        # Its own issuer: the file a client is given is the trust anchor, so it must be allowed to sign itself.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "bmc-cert.pem", directory / "bmc-key.pem"
    _write_private(cert_file, cert.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    _write_private(key_file, pem)
    return cert_file, key_file


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


class RedfishServer:
    """Every BMC of one twin. `add` each host's BMC, then `start`; `close` stops them all.

    `certificate` (a PEM chain, leaf first, and its key) serves a certificate of the caller's instead of the
    twin's own, as a lab's BMC with a CA-issued certificate; `ca_file` is then what clients are told to verify
    it with (`redfish_ca`), the chain's file if not given.
    """

    def __init__(
        self,
        certificate: tuple[Path, Path] | None = None,
        ca_file: Path | None = None,
        addresses: tuple[str, ...] = (),
    ) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="testbed-bmc-"))  # 0700
        chain, key_file = certificate or self_signed_certificate(self.directory, addresses)
        self.cert_file = Path(ca_file or chain)
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._context.load_cert_chain(chain, key_file)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._listeners: list[socket.socket] = []
        self.services: dict[str, RedfishService] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(
        self,
        name: str,
        target: PowerTarget,
        user: str,
        password: str,
        address: str = "127.0.0.1",
        netns: str | None = None,
    ) -> dict[str, str]:
        """Open the BMC of host `name` on a port of its own (on `address`, in network namespace `netns` if given:
        the socket stays in the namespace it was made in); returns its endpoints.
        """
        from emulators.netns import entered

        if self._thread is not None:
            raise RuntimeError("add every BMC before start(): the accept thread owns the selector")
        service = RedfishService(name, target, user, password)
        with entered(netns):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, 0))
        sock.listen(ACCEPT_BACKLOG)
        sock.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ, service)
        self._listeners.append(sock)
        self.services[name] = service
        return {
            "redfish": f"https://{address}:{sock.getsockname()[1]}",
            "redfish_ca": str(self.cert_file),
            "redfish_user": user,
        }

    def start(self) -> None:
        self._thread = threading.Thread(target=self._accept_loop, name="redfish-bmcs", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(5)
        for sock in self._listeners:
            sock.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _accept_loop(self) -> None:
        while True:
            for key, _ in self._selector.select():
                if key.data is None:  # woken by close()
                    return
                try:
                    conn, _ = cast(socket.socket, key.fileobj).accept()  # the listeners: sockets
                except (BlockingIOError, InterruptedError):
                    continue  # another wake-up took it
                except OSError:
                    continue  # out of file descriptors, say: this connection is lost, the BMC is not
                threading.Thread(
                    target=self._serve, args=(conn, key.data), name=f"redfish-{key.data.name}", daemon=True
                ).start()

    def _serve(self, conn: socket.socket, service: RedfishService) -> None:
        conn.setblocking(True)
        conn.settimeout(HANDSHAKE_S)
        try:
            tls = self._context.wrap_socket(conn, server_side=True)
        except (OSError, ssl.SSLError):
            conn.close()  # not TLS, a client that refused our certificate, or one that hung up
            return
        try:
            # the connection is served here, not by a socketserver: the handler reads only its server's .service
            _Handler(tls, ("127.0.0.1", 0), _Owner(service))  # type: ignore[arg-type]
        except (OSError, ssl.SSLError):
            pass  # the client went away mid-request
        finally:
            try:
                tls.close()
            except OSError:
                pass


class _Owner:
    """What a handler knows of its server: the one BMC its connection reached."""

    def __init__(self, service: RedfishService) -> None:
        self.service = service


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a Redfish client's session reuses its connection
    server_version = "testbed-twin-bmc"
    sys_version = ""
    timeout = IDLE_S
    server: _Owner  # type: ignore[assignment]  # what _serve passes (see there)

    def do_GET(self) -> None:
        self._answer("GET")

    def do_HEAD(self) -> None:
        self._answer("HEAD")

    def do_POST(self) -> None:
        self._answer("POST")

    def do_PATCH(self) -> None:
        self._answer("PATCH")

    def do_PUT(self) -> None:
        self._answer("PUT")

    def do_DELETE(self) -> None:
        self._answer("DELETE")

    def _answer(self, method: str) -> None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            self._send(error(411, "GeneralError", "send the request body with a Content-Length"), method)
            return
        length = self.headers.get("Content-Length", "0").strip() or "0"
        if not (length.isascii() and length.isdigit()) or len(length) > 12:
            self.close_connection = True  # where the body ends is unknown: the connection cannot go on
            self._send(error(400, "GeneralError", f"invalid Content-Length {length[:40]!r}"), method)
            return
        if int(length) > MAX_BODY:
            self.close_connection = True
            self._send(error(413, "GeneralError", f"request body of {length} bytes; at most {MAX_BODY}"), method)
            return
        body = self.rfile.read(int(length))
        if len(body) < int(length):
            self.close_connection = True
            return  # the client hung up inside its body
        headers = {k.lower(): v for k, v in self.headers.items()}
        self._send(self.server.service.handle(method, self.path, headers, body), method)

    def _send(self, response: Response, method: str) -> None:
        self.send_response(response.status)
        for key, value in response.headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(response.body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if method != "HEAD" and response.body:
            self.wfile.write(response.body)

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if self.request_version == "HTTP/0.9":  # a request line without a version (or without a path)
            self.send_error(400, "the request line needs a method, a path and HTTP/1.1")
            return False
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """A request the HTTP parser refused (bad request line, too many headers, unknown method): a Redfish
        error body instead of the standard library's HTML page.
        """
        self.close_connection = True
        if getattr(self, "request_version", None) in (None, "", "HTTP/0.9"):
            self.request_version = "HTTP/1.0"  # answered with a status line and headers all the same
        what = message or explain or http.server.BaseHTTPRequestHandler.responses.get(code, ("error",))[0]
        self._send(error(code, "GeneralError", what), getattr(self, "command", None) or "GET")

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the standard library's name)
        pass  # the twin's stderr is for its own failures, not for every request
