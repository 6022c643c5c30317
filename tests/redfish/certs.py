"""Certificates a lab's BMCs come with, made at test time (nothing committed): a CA and a leaf it issued for
127.0.0.1, or a leaf that signed itself (not a CA). Written as PEM files; keys 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    """A BMC's certificate (`cert`), its key, and the CA that issued it (`ca`; the leaf itself when self-signed)."""

    cert: Path
    key: Path
    ca: Path
    chain: Path  # the leaf followed by its CA, as a server sends a chain


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _key_usage(*, sign_certs: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=sign_certs,
        crl_sign=sign_certs,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _leaf_builder(subject: x509.Name, issuer: x509.Name, public_key, hosts: tuple[str, ...]) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(sign_certs=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def ca_issued(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"), prefix: str = "") -> Issued:
    """A lab CA and a BMC leaf it signed for `hosts` (the leaf is not a CA: it cannot anchor itself)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"{prefix}testbed test lab CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(sign_certs=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        _leaf_builder(_name(f"{prefix}bmc.lab.example"), ca_name, key.public_key(), hosts)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(
        cert=_write(directory / f"{prefix}bmc-cert.pem", _pem(leaf)),
        key=_write(directory / f"{prefix}bmc-key.pem", _key_pem(key), private=True),
        ca=_write(directory / f"{prefix}lab-ca.pem", _pem(ca_cert)),
        chain=_write(directory / f"{prefix}bmc-chain.pem", _pem(leaf) + _pem(ca_cert)),
    )


def self_signed_leaf(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"), prefix: str = "") -> Issued:
    """A BMC's factory certificate: signed by its own key, not a CA (as most BMCs ship theirs)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(f"{prefix}bmc factory certificate")
    leaf = (
        _leaf_builder(name, name, key.public_key(), hosts)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert = _write(directory / f"{prefix}bmc-self-cert.pem", _pem(leaf))
    return Issued(
        cert=cert,
        key=_write(directory / f"{prefix}bmc-self-key.pem", _key_pem(key), private=True),
        ca=cert,
        chain=cert,
    )
