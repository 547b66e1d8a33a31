"""A small Kubernetes REST client over urllib, and a runner for the pinned kubectl.

The tooling only needs a handful of calls (health, nodes, namespaces, status checks);
talking to the API directly keeps them fast and free of a heavy client dependency.
Anything generic, such as applying arbitrary manifests, goes through kubectl.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from choreo_dev.errors import DevClusterError

T = TypeVar("T")

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(eq=False)
class ApiError(Exception):
    """A non-2xx answer from the API server."""

    status: int
    body: str
    method: str
    path: str

    def __str__(self) -> str:
        return f"{self.method} {self.path} -> HTTP {self.status}: {self.body[:300]}"


class KubeClient:
    """Bearer-token client for one API server, verifying TLS against the local CA."""

    def __init__(self, server: str, token: str, ca_file: Path) -> None:
        self.server = server.rstrip("/")
        self._token = token
        self._ctx = ssl.create_default_context(cafile=str(ca_file))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = JSON,
        timeout: float = 10.0,
    ) -> Any:
        """Send one request and decode the JSON answer (raw text for non-JSON answers)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self._token}")
        req.add_header("Accept", JSON)
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ctx, timeout=timeout) as resp:
                raw = resp.read().decode()
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, exc.read().decode(errors="replace"), method, path) from exc
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def create(self, path: str, obj: dict[str, Any]) -> Any:
        return self.request("POST", path, obj)

    def merge_patch(self, path: str, patch: dict[str, Any]) -> Any:
        return self.request("PATCH", path, patch, content_type=MERGE_PATCH)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def exists(self, path: str) -> bool:
        """Whether GET ``path`` succeeds; 404 means no, other errors propagate."""
        try:
            self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def ready(self) -> bool:
        """Whether /readyz answers ok; connection errors mean not yet."""
        try:
            return self.request("GET", "/readyz", timeout=2.0) == "ok"
        except (ApiError, OSError):
            return False


def wait_for(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.2,
    watchdog: Callable[[], None] | None = None,
) -> T:
    """Poll ``check`` until it returns something truthy; ``watchdog`` may raise early.

    Transient API and connection errors count as "not yet" so callers need not care
    whether the server is still starting.
    """
    deadline = time.monotonic() + timeout
    while True:
        if watchdog is not None:
            watchdog()
        try:
            result = check()
        except (ApiError, OSError):
            result = None
        if result:
            return result
        if time.monotonic() >= deadline:
            raise DevClusterError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def run_kubectl(
    kubectl: Path, kubeconfig: Path, args: Sequence[str], stdin: str | None = None
) -> str:
    """Run the pinned kubectl against the local cluster; its stderr becomes the error."""
    result = subprocess.run(
        [str(kubectl), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise DevClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout
