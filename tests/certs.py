"""A throwaway self-signed certificate for TLS tests, made with the openssl command line (tests
that use it skip when openssl is not installed)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def self_signed_cert(folder: Path, ip: str = "127.0.0.1") -> tuple[Path, Path]:
    """(cert, key) PEM files in ``folder``: RSA 2048, valid one day, for ``ip`` and localhost.
    The certificate is its own CA (a client trusts it with ``cafile=cert``)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-days", "1",
         "-addext", f"subjectAltName=IP:{ip},DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key
