"""The `choreo-dev` command starts a cluster, reports on it, and stops it without leftovers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from choreo.service.ports import is_free
from choreo_dev.cluster import Cluster
from choreo_dev.paths import PACKAGE_DIR
from choreo_dev.procs import is_alive

pytestmark = pytest.mark.e2e


def _cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "CHOREO_STATE_DIR": str(state),
        "PYTHONPATH": os.pathsep.join([str(PACKAGE_DIR.parent), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "choreo_dev", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_cli_up_status_down_wipe_leaves_no_process(
    tmp_path: Path, control_plane_binaries: dict[str, Path]
) -> None:
    state = tmp_path / "state"
    cluster = Cluster(state)
    try:
        up = _cli(state, "cluster", "up", "--no-build", "--nodes", "3")
        assert up.returncode == 0, up.stderr
        assert f"export KUBECONFIG={state.resolve()}/kubeconfig" in up.stdout

        records = list(cluster.records().values())
        assert len(records) == 5
        assert all(is_alive(r) for r in records)
        ports = json.loads((state / "cluster.json").read_text())["ports"]
        assert not any(is_free(p) for p in (ports["kube-apiserver"], ports["etcd-client"]))

        assert _cli(state, "cluster", "status").returncode == 0
        env = _cli(state, "cluster", "env")
        assert env.stdout.strip() == f"export KUBECONFIG={state.resolve()}/kubeconfig"
        listed = _cli(state, "kubectl", "get", "nodes", "--no-headers")
        assert listed.returncode == 0, listed.stderr
        assert [line.split()[1] for line in listed.stdout.splitlines()] == ["Ready"] * 3

        again = _cli(state, "cluster", "up", "--no-build")
        assert again.returncode == 0 and "already running" in again.stderr
        assert [r.pid for r in cluster.records().values()] == [r.pid for r in records]

        down = _cli(state, "cluster", "down")
        assert down.returncode == 0, down.stderr
        leftover = [f"{r.name} (pid {r.pid})" for r in records if is_alive(r)]
        assert leftover == []
        assert all(is_free(p) for p in ports.values())
        assert _cli(state, "cluster", "status").returncode == 1
        env_down = _cli(state, "cluster", "env")
        assert env_down.returncode == 1 and env_down.stderr.startswith("error: ")

        wipe = _cli(state, "cluster", "wipe")
        assert wipe.returncode == 0
        assert not state.exists()
    finally:
        cluster.down()
