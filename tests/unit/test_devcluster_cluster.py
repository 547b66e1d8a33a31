"""`cluster up` failure paths, exercised with stand-in binaries (no real control plane)."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from choreo_dev.cluster import Cluster
from choreo_dev.errors import DevClusterError
from choreo_dev.versions import CONTROL_PLANE, KWOK_STAGE_FILES

STAGE = """apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {{name: {name}}}
spec:
  resourceRef: {{apiGroup: v1, kind: {kind}}}
  selector: {{matchExpressions: []}}
  next: {{}}
"""


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def fake_binaries(tmp_path: Path) -> dict[str, Path]:
    """Stand-ins: etcd dies at once, the rest would sleep; kwok has its stage files."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    binaries = {name: _script(bin_dir / name, "exec sleep 30\n") for name in CONTROL_PLANE}
    binaries["etcd"] = _script(
        bin_dir / "etcd", "echo 'etcdmain: open data dir: permission denied' >&2\nexit 3\n"
    )
    for rel in KWOK_STAGE_FILES:
        target = bin_dir / "stages" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        kind = "Node" if rel.startswith("node/") else "Pod"
        target.write_text(STAGE.format(name=Path(rel).stem, kind=kind))
    return binaries


def test_component_that_exits_early_is_reported_with_its_log(
    tmp_path: Path, fake_binaries: dict[str, Path]
) -> None:
    cluster = Cluster(tmp_path / "state")
    with pytest.raises(DevClusterError) as info:
        cluster.up(fake_binaries)
    message = str(info.value)
    assert "etcd exited early (exit code 3)" in message
    assert "permission denied" in message
    assert not any(cluster.status().values())
    assert not list((tmp_path / "state" / "run").glob("*.json"))
    # The state was prepared before the failure: certificates and kubeconfig exist.
    assert (tmp_path / "state" / "pki" / "apiserver.crt").is_file()
    assert "127.0.0.1" in (tmp_path / "state" / "kubeconfig").read_text()


def test_port_in_use_fails_before_anything_starts(
    tmp_path: Path, fake_binaries: dict[str, Path]
) -> None:
    cluster = Cluster(tmp_path / "state")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(DevClusterError, match=f"port {port} .* already in use"):
            cluster.up(fake_binaries, {"kube-apiserver": port})
    assert not (tmp_path / "state" / "logs" / "etcd.log").exists()
    assert not any(cluster.status().values())
