"""Test certificates, made with ``cryptography``: a CA, server and client certificates it signs,
written as PEM files the way ``http_options.ssl_*`` and a cert-manager Secret hold them."""

from __future__ import annotations

import base64
import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Pair:
    """A certificate and its key on disk."""

    cert: Path
    key: Path


class Authority:
    """A self-signed CA that signs leaf certificates into ``directory``."""

    def __init__(self, directory: Path, name: str = "kubeserve test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.path = directory / f"{name.replace(' ', '-')}.crt"
        self.path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        name: str,
        *,
        client: bool = False,
        password: bytes | None = None,
        days: float = 10,
        expired: bool = False,
        hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
        curve: ec.EllipticCurve | None = None,
    ) -> Pair:
        """A leaf certificate for ``hosts`` (or a client one), valid ``days`` (or expired), its
        key on ``curve`` (P-256 by default)."""
        key = ec.generate_private_key(curve or ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        start, end = (now - 3 * _DAY, now - _DAY) if expired else (now - _DAY, now + days * _DAY)
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(password)
            if password
            else serialization.NoEncryption()
        )
        pair = Pair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
            )
        )
        return pair


def tls_secret(
    namespace: str,
    name: str,
    files: dict[str, Path],
    secret_type: str = "kubernetes.io/tls",
) -> dict[str, object]:
    """A Secret as cert-manager writes one (``tls.crt``, ``tls.key``, ``ca.crt``), holding
    ``files`` (Secret key -> PEM file)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": secret_type,
        "metadata": {"name": name, "namespace": namespace},
        "data": {key: base64.b64encode(path.read_bytes()).decode() for key, path in files.items()},
    }


def cert_manager_files(authority: Authority, pair: Pair) -> dict[str, Path]:
    """The three keys of a cert-manager Secret for ``pair``, issued by ``authority``."""
    return {"tls.crt": pair.cert, "tls.key": pair.key, "ca.crt": authority.path}
