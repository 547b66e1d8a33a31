"""The tooling's Kubernetes client (the official one, through ``choreo_api.kube``) and a
runner for the pinned kubectl.

Calls the tooling makes itself (health, nodes, namespaces, status checks) go through the
client; anything generic, such as applying arbitrary manifests, goes through kubectl.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from choreo_api.kube import CALL_ERRORS, ApiException, Kube
from choreo_dev.errors import DevClusterError

__all__ = ["ApiException", "KubeClient", "run_kubectl", "wait_for"]

T = TypeVar("T")


class KubeClient(Kube):
    """The official client with the checks the tooling polls for."""

    def exists(self, path: str) -> bool:
        """Whether GET ``path`` succeeds; 404 means no, other errors propagate."""
        try:
            self.get(path)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def ready(self) -> bool:
        """Whether /readyz answers ok; connection errors mean not yet."""
        try:
            return bool(self.request("GET", "/readyz", timeout=2.0) == "ok")
        except CALL_ERRORS:
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
        except CALL_ERRORS:
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
