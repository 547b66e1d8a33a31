"""Helpers for tests that drive a running local cluster (used by the e2e fixtures).

Kept in the package, not in a conftest, so that any test suite of the project (the
operator's, the agents') can drive the same cluster the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from choreo_dev import fabric, nodes, procs
from choreo_dev.cluster import Cluster, ClusterInfo
from choreo_dev.kube import KubeClient, run_kubectl, wait_for


@dataclass
class LocalCluster:
    """A running cluster plus the helpers tests use to drive it."""

    cluster: Cluster
    info: ClusterInfo
    client: KubeClient
    kubectl_path: Path
    _names: Iterator[int] = field(default_factory=itertools.count)

    def unique(self, prefix: str) -> str:
        """A name no other test in this session uses."""
        return f"{prefix}-{next(self._names)}"

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        """Run the pinned kubectl against this cluster and return its stdout."""
        return run_kubectl(self.kubectl_path, self.info.kubeconfig, args, stdin=stdin)

    def apply(self, manifest: Path | dict[str, Any]) -> str:
        """``kubectl apply`` a file or an object."""
        if isinstance(manifest, Path):
            return self.kubectl("apply", "-f", str(manifest))
        return self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(manifest))

    def create_namespace(self, prefix: str = "e2e") -> str:
        """Create a fresh namespace and return its name."""
        name = self.unique(prefix)
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        self.client.create("/api/v1/namespaces", namespace)
        return name

    def add_nodes(
        self,
        count: int = 1,
        gpus: int = 8,
        labels: dict[str, str] | None = None,
        prefix: str = "gpu",
    ) -> list[str]:
        """Create fake GPU nodes with fresh names and wait until kwok reports them Ready."""
        specs = fabric.grid(self.unique(prefix), [count], gpus, labels or {})
        names = nodes.add(self.client, specs)
        nodes.wait_ready(self.client, names)
        return names

    def add_fabric(self, description: dict[str, Any]) -> list[str]:
        """Create the nodes of a fabric description and wait until they are Ready."""
        names = nodes.add(self.client, fabric.parse(description))
        nodes.wait_ready(self.client, names)
        return names

    def node(self, name: str) -> dict[str, Any]:
        return dict(self.client.get(f"/api/v1/nodes/{name}"))

    def mark_not_ready(self, name: str, wait: bool = True) -> None:
        """Fail a node as a dead kubelet would; by default wait until it reports Ready=False."""
        nodes.mark_not_ready(self.client, name)
        if wait:
            nodes.wait_ready_status(self.client, [name], "False")

    def mark_ready(self, name: str, wait: bool = True) -> None:
        """Recover a failed node; by default wait until it is Ready again."""
        nodes.mark_ready(self.client, name)
        if wait:
            nodes.wait_ready(self.client, [name])

    def wait_for(self, check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
        """Poll ``check`` until it returns something truthy."""
        return wait_for(check, timeout, what, interval=0.25)


def control_plane_binaries() -> dict[str, Path]:
    """The cached binaries for a test; skip when they are not built, or fail when
    ``CHOREO_E2E_REQUIRED`` is set (as in CI)."""
    import os

    import pytest

    from choreo_dev import build
    from choreo_dev.versions import CONTROL_PLANE

    needed = (*CONTROL_PLANE, "kubectl")
    absent = build.missing(needed)
    if absent:
        reason = (f"local control-plane binaries not built ({', '.join(absent)}); "
                  "run `choreo-dev build` once (about 10 minutes, cached afterwards)")
        if os.environ.get("CHOREO_E2E_REQUIRED"):
            pytest.fail(f"CHOREO_E2E_REQUIRED is set but {reason}", pytrace=False)
        pytest.skip(reason)
    return build.resolve(needed)


def leftover_processes(records: Sequence[procs.ProcRecord]) -> list[str]:
    """Which of the recorded processes still run."""
    return [f"{r.name} (pid {r.pid})" for r in records if procs.is_alive(r)]
