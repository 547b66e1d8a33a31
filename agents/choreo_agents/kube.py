"""A small Kubernetes REST client: in-cluster service account or a kubeconfig file.

The agent makes a handful of calls (get, create, merge-patch, list, one watch) at a low
rate, so plain HTTPS over the standard library keeps the DaemonSet image and its memory
small instead of pulling in a full client.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"


class KubeConfigError(RuntimeError):
    """No usable API server credentials."""


@dataclass(eq=False)
class ApiError(Exception):
    """A non-2xx answer from the API server."""

    status: int
    body: str
    method: str
    path: str

    def __str__(self) -> str:
        message = self.body
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(self.body).get("message", self.body)
        return f"{self.method} {self.path}: HTTP {self.status}: {str(message)[:300]}"


class KubeApi:
    def __init__(self, server: str, ssl_context: ssl.SSLContext, token: str | None = None) -> None:
        self.server = server.rstrip("/")
        self._ctx = ssl_context
        self._token = token

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None) -> KubeApi:
        """``--kubeconfig``, then ``$KUBECONFIG``, then the in-cluster service account."""
        path = kubeconfig or os.environ.get("KUBECONFIG")
        if path:
            return cls.from_kubeconfig(Path(path.split(os.pathsep)[0]))
        host, port = (
            os.environ.get("KUBERNETES_SERVICE_HOST"),
            os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
        )
        if host and (SERVICE_ACCOUNT / "token").exists():
            ctx = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
            token = (SERVICE_ACCOUNT / "token").read_text().strip()
            return cls(f"https://{host}:{port}", ctx, token)
        raise KubeConfigError("no kubeconfig (--kubeconfig, $KUBECONFIG) and not in a cluster")

    @classmethod
    def from_kubeconfig(cls, path: Path) -> KubeApi:
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise KubeConfigError(f"{path}: {exc}") from exc
        try:
            current = doc.get("current-context") or doc["contexts"][0]["name"]
            context = _named(doc["contexts"], current)["context"]
            cluster = _named(doc["clusters"], context["cluster"])["cluster"]
            user = _named(doc.get("users") or [], context.get("user", ""), {}).get("user", {})
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise KubeConfigError(f"{path}: incomplete kubeconfig ({exc})") from exc
        base = path.parent
        ctx = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        ca = _material(cluster, "certificate-authority", base)
        if ca:
            ctx.load_verify_locations(cadata=ca.decode())
        cert, key = _material(user, "client-certificate", base), _material(user, "client-key", base)
        if cert and key:
            _load_client_cert(ctx, cert, key)
        token = user.get("token")
        if not token and user.get("tokenFile"):
            token = Path(base, user["tokenFile"]).read_text().strip()
        return cls(cluster["server"], ctx, token)

    # ---- requests -----------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 10.0,
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = self._request(method, path, data, content_type)
        try:
            with urllib.request.urlopen(req, context=self._ctx, timeout=timeout) as resp:
                raw = resp.read().decode()
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, exc.read().decode(errors="replace"), method, path) from exc
        return json.loads(raw) if raw else None

    def _request(
        self, method: str, path: str, data: bytes | None, content_type: str
    ) -> urllib.request.Request:
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if self._token:
            req.add_header("Authorization", f"Bearer {self._token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        return req

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def create(self, path: str, obj: dict[str, Any]) -> Any:
        return self.request("POST", path, obj)

    def merge_patch(self, path: str, patch: dict[str, Any]) -> Any:
        return self.request("PATCH", path, patch, content_type=MERGE_PATCH)

    def watch(
        self, path: str, params: dict[str, str], timeout_seconds: int = 60
    ) -> Iterator[dict[str, Any]]:
        """Stream watch events until the server ends the watch (after ``timeout_seconds``)."""
        query = urllib.parse.urlencode({**params, "watch": "1", "timeoutSeconds": timeout_seconds})
        req = self._request("GET", f"{path}?{query}", None, "")
        try:
            resp = urllib.request.urlopen(req, context=self._ctx, timeout=timeout_seconds + 5)
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, exc.read().decode(errors="replace"), "WATCH", path) from exc
        with resp:
            for line in resp:
                if line.strip():
                    yield json.loads(line)


def _named(items: list[dict[str, Any]], name: str, default: Any = None) -> Any:
    for item in items:
        if item.get("name") == name:
            return item
    if default is not None:
        return default
    raise KeyError(name)


def _material(section: dict[str, Any], key: str, base: Path) -> bytes | None:
    if section.get(f"{key}-data"):
        return base64.b64decode(section[f"{key}-data"])
    if section.get(key):
        return Path(base, section[key]).read_bytes()
    return None


def _load_client_cert(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl wants files; write them privately, load, delete."""
    with tempfile.TemporaryDirectory() as tmp:
        cert_path, key_path = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
        cert_path.write_bytes(cert)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        ctx.load_cert_chain(str(cert_path), str(key_path))
