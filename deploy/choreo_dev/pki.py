"""Certificates, the service-account key pair and the admin token, made with openssl.

The serving certificate is signed by a local CA so that clients verify TLS for real
(kubeconfig carries the CA), and it names 127.0.0.1, so the port may change between
starts without re-issuing anything. Existing material is kept: a restart must not
invalidate tokens that service accounts already hold.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from pathlib import Path

from choreo_dev.errors import DevClusterError
from choreo_dev.layout import Layout

SERVICE_IP = "10.0.0.1"
SERVING_SANS: tuple[str, ...] = (
    "IP:127.0.0.1",
    f"IP:{SERVICE_IP}",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)
ADMIN_USER = "choreo-admin"
ADMIN_GROUP = "system:masters"


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise DevClusterError(
            "openssl was not found on PATH; it is needed once to create the cluster's "
            "certificates (Debian: apt-get install openssl)"
        )
    result = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise DevClusterError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def serving_extensions() -> str:
    """The x509 v3 extensions of the apiserver's serving certificate."""
    return (
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        f"subjectAltName={','.join(SERVING_SANS)}\n"
    )


def token_file_line(token: str) -> str:
    """One line of ``--token-auth-file``: token, user, uid, groups."""
    return f'{token},{ADMIN_USER},{ADMIN_USER},"{ADMIN_GROUP}"\n'


def ensure(layout: Layout) -> str:
    """Create whatever PKI material is missing and return the admin token."""
    pki = layout.pki
    pki.mkdir(parents=True, exist_ok=True)
    pki.chmod(0o700)
    if not (layout.ca_cert.is_file() and layout.ca_key.is_file()):
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
            "-subj", "/CN=choreo-local-ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout", str(layout.ca_key), "-out", str(layout.ca_cert),
            cwd=pki,
        )
        layout.serving_cert.unlink(missing_ok=True)
    if not (layout.serving_cert.is_file() and layout.serving_key.is_file()):
        csr = pki / "apiserver.csr"
        ext = pki / "apiserver.ext"
        ext.write_text(serving_extensions())
        _openssl(
            "req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
            "-keyout", str(layout.serving_key), "-out", str(csr),
            cwd=pki,
        )
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(layout.ca_cert),
            "-CAkey", str(layout.ca_key), "-CAcreateserial", "-days", "3650",
            "-extfile", str(ext), "-out", str(layout.serving_cert),
            cwd=pki,
        )
        csr.unlink(missing_ok=True)
    if not (layout.sa_key.is_file() and layout.sa_pub.is_file()):
        _openssl("genrsa", "-out", str(layout.sa_key), "2048", cwd=pki)
        _openssl("rsa", "-in", str(layout.sa_key), "-pubout", "-out", str(layout.sa_pub), cwd=pki)
    if not layout.token.is_file():
        layout.token.write_text(secrets.token_hex(24))
    token = layout.token.read_text().strip()
    layout.token_file.write_text(token_file_line(token))
    for path in pki.iterdir():
        if path.is_file():
            path.chmod(0o600)
    return token
