"""Certificates a multi-host test creates for Dask's TLS: a CA, and one key + certificate
signed by it that every member of the cluster presents (Dask verifies the peer against the
CA and does not check host names)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path

    def dask_args(self) -> list[str]:
        """`dask scheduler` / `dask worker` options."""
        return [
            "--tls-ca-file",
            str(self.ca),
            "--tls-cert",
            str(self.cert),
            "--tls-key",
            str(self.key),
        ]

    def dask_env(self) -> dict[str, str]:
        """The same for a client (the driver), through Dask's config."""
        return {
            "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(self.ca),
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": str(self.cert),
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": str(self.key),
            "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
        }


def make_tls(out: Path, name: str = "flexmarl-test") -> TlsFiles:
    """A fresh CA and a certificate signed by it, written under `out` (PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name | None,
             signer: ec.EllipticCurvePrivateKey, ca: bool) -> x509.Certificate:  # fmt: skip
        sub = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        return (
            x509.CertificateBuilder()
            .subject_name(sub)
            .issuer_name(issuer or sub)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .sign(signer, hashes.SHA256())
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = cert(f"{name} CA", ca_key, None, ca_key, True)
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = cert(name, key, ca_cert.subject, ca_key, False)
    out.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(out / "ca.pem", out / "cert.pem", out / "key.pem")
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return files
