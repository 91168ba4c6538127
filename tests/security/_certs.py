"""Certificates made for one test session: two unrelated CAs and the leaves the TLS tests need.

:func:`make` writes, under a directory, PEM files for

* ``ca`` — the CA the servers and clients trust;
* ``server`` — a server certificate for ``127.0.0.1`` and ``localhost`` (subject alternative
  names), signed by ``ca``, also good as a client's (Redis cluster nodes use it both ways);
* ``wrong_host`` — a server certificate for ``wrong.example`` only, also signed by ``ca``;
* ``client`` — a client certificate signed by ``ca``, for mutual TLS; its common name,
  ``agentlease_client``, is also the PostgreSQL role it logs in as (``clientcert=verify-full``);
* ``other_ca`` — a second CA that signed none of them (a client trusting it cannot verify);
* ``stranger`` — a client certificate like ``client`` but signed by ``other_ca`` (a server
  that trusts ``ca`` refuses it).

Keys are EC P-256 (fast to make) and unencrypted, written 0600.
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

__all__ = ["Certs", "Pair", "make"]

_Key = ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class Pair:
    """A certificate file and its key file."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Certs:
    """Every file :func:`make` wrote."""

    ca: Pair
    other_ca: Pair
    server: Pair
    wrong_host: Pair
    client: Pair
    stranger: Pair


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write(directory: Path, stem: str, cert: x509.Certificate, key: _Key) -> Pair:
    cert_path = directory / f"{stem}.crt"
    key_path = directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    os.chmod(key_path, 0o600)
    return Pair(cert_path, key_path)


def _builder(
    subject: str, issuer: x509.Name, public: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
    )


def _ca(directory: Path, stem: str, common: str) -> tuple[Pair, x509.Certificate, _Key]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(common, _name(common), key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _write(directory, stem, cert, key), cert, key


def _leaf(
    directory: Path,
    stem: str,
    common: str,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    *,
    names: list[x509.GeneralName] | None,
    usage: list[x509.ObjectIdentifier],
) -> Pair:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(common, ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return _write(directory, stem, builder.sign(ca_key, hashes.SHA256()), key)


def make(directory: Path) -> Certs:
    """Write a fresh set of certificates and keys under ``directory`` (created if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_cert, ca_key = _ca(directory, "ca", "agentlease test CA")
    other_ca, other_cert, other_key = _ca(directory, "other-ca", "an unrelated CA")
    server_names: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
    ]
    server = _leaf(
        directory,
        "server",
        "localhost",
        ca_cert,
        ca_key,
        names=server_names,
        # Also a client's: Redis nodes present it to each other on a TLS cluster bus.
        usage=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    wrong_host = _leaf(
        directory,
        "wrong-host",
        "wrong.example",
        ca_cert,
        ca_key,
        names=[x509.DNSName("wrong.example")],
        usage=[ExtendedKeyUsageOID.SERVER_AUTH],
    )
    client = _leaf(
        directory,
        "client",
        "agentlease_client",
        ca_cert,
        ca_key,
        names=None,
        usage=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    stranger = _leaf(
        directory,
        "stranger",
        "agentlease_client",
        other_cert,
        other_key,
        names=None,
        usage=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    return Certs(
        ca=ca,
        other_ca=other_ca,
        server=server,
        wrong_host=wrong_host,
        client=client,
        stranger=stranger,
    )
