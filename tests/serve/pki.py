"""A lab's own CA and a server certificate it signs, made as docs/serve.md tells a lab to make them (the openssl
command), in a folder of the test's: no key or certificate is committed.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from peers import require_program


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA's certificate, which clients verify the server with (--ca)
    cert: Path  # the server's certificate, for 127.0.0.1 and localhost
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    openssl = require_program("openssl", "the test's CA and certificate are made with it (apt-get install openssl)")
    proc = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    """A CA's certificate and key, as docs/serve.md makes the lab's."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-keyout", "ca.key", "-out", "ca.pem",
        cwd=folder,
    )  # fmt: skip
    return folder / "ca.pem", folder / "ca.key"


def make_pki(folder: Path) -> Pki:
    """A CA and the server certificate it signs, for the names a test's client uses (127.0.0.1, localhost)."""
    ca, ca_key = make_ca(folder, "test lab CA")
    (folder / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=localhost",
        "-keyout", "server.key", "-out", "server.csr", cwd=folder,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-days", "2",
        "-extfile", "server.ext", "-out", "server.pem", cwd=folder,
    )  # fmt: skip
    return Pki(ca=ca, cert=folder / "server.pem", key=folder / "server.key")
