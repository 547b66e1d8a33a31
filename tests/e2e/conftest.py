"""A real local Kubernetes control plane for end-to-end tests, started once per session.

The ``cluster`` fixture runs etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok from the cached binaries in a throw-away state directory, and
stops every one of them by PID at the end, failing the session if any survives.

Without built binaries the e2e tests are skipped, unless ``CHOREO_E2E_REQUIRED`` is set
(as in CI), in which case they fail and say how to build.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from choreo_dev import testing
from choreo_dev.cluster import Cluster
from choreo_dev.testing import LocalCluster, leftover_processes


@pytest.fixture(scope="session")
def control_plane_binaries() -> dict[str, Path]:
    """The cached binaries; skip (or fail when e2e is required) if they are not built."""
    return testing.control_plane_binaries()


@pytest.fixture(scope="session")
def cluster(
    control_plane_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    """One running local cluster shared by every e2e test of the session."""
    control = Cluster(tmp_path_factory.mktemp("choreo-cluster"))
    try:
        info = control.up(control_plane_binaries)
        yield LocalCluster(
            control, info, control.client(), control_plane_binaries["kubectl"]
        )
    finally:
        records = list(control.records().values())
        control.down()
    alive = leftover_processes(records)
    if alive:
        pytest.fail(f"cluster teardown left processes running: {', '.join(alive)}")
