"""The local control plane is a real, healthy API server bound to loopback."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from choreo_dev.kube import ApiException, KubeClient
from choreo_dev.testing import LocalCluster

pytestmark = pytest.mark.e2e

TESTDATA = Path(__file__).parent / "testdata"


def _listening_inodes() -> dict[str, str]:
    """Socket inode -> local address of every listening TCP socket on the machine."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A":  # LISTEN
                found[cols[9]] = cols[1]
    return found


def _listen_addresses(pid: int) -> list[str]:
    listening = _listening_inodes()
    addresses = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inode = target[len("socket:[") : -1]
            if inode in listening:
                addresses.append(listening[inode])
    return addresses


def test_apiserver_is_ready_and_default_service_account_exists(cluster: LocalCluster) -> None:
    assert cluster.client.ready()
    sa = cluster.client.get("/api/v1/namespaces/default/serviceaccounts/default")
    assert sa["metadata"]["name"] == "default"
    assert cluster.client.get("/version")["gitVersion"] == "v1.34.4"


def test_every_component_listens_only_on_loopback(cluster: LocalCluster) -> None:
    loopback_hex = "0100007F"  # 127.0.0.1 in /proc/net/tcp byte order
    records = cluster.cluster.records()
    assert set(records) == {
        "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"
    }
    listened = 0
    for name, rec in records.items():
        for address in _listen_addresses(rec.pid):
            listened += 1
            assert address.split(":")[0] == loopback_hex, f"{name} listens on {address}"
    assert listened >= 5  # etcd client + peer, and the three Kubernetes secure ports


def test_unauthenticated_requests_are_rejected(cluster: LocalCluster) -> None:
    stranger = KubeClient.with_token(
        cluster.info.server, "not-a-token", cluster.cluster.layout.ca_cert)
    with pytest.raises(ApiException) as info:
        stranger.get("/api/v1/namespaces")
    assert info.value.status == 401


def test_crd_is_served_and_validated(cluster: LocalCluster) -> None:
    cluster.apply(TESTDATA / "crd.yaml")
    crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gpuprobes.e2e.choreo.dev"

    def established() -> bool:
        crd = cluster.client.get(crd_path)
        return any(
            c["type"] == "Established" and c["status"] == "True"
            for c in crd.get("status", {}).get("conditions") or []
        )

    cluster.wait_for(established, "the CRD to be Established")
    ns = cluster.create_namespace("crd")
    probe = {
        "apiVersion": "e2e.choreo.dev/v1",
        "kind": "GpuProbe",
        "metadata": {"name": "p1", "namespace": ns},
        "spec": {"gpus": 2},
    }
    cluster.apply(probe)
    got = cluster.client.get(f"/apis/e2e.choreo.dev/v1/namespaces/{ns}/gpuprobes/p1")
    assert got["spec"]["gpus"] == 2

    bad = {**probe, "metadata": {"name": "p2", "namespace": ns}, "spec": {"gpus": 0}}
    with pytest.raises(ApiException) as info:
        cluster.client.create(f"/apis/e2e.choreo.dev/v1/namespaces/{ns}/gpuprobes", bad)
    assert info.value.status == 422
    assert "spec.gpus" in info.value.body


def test_fake_nodes_register_every_label_a_kubelet_does(cluster: LocalCluster) -> None:
    """The controller-manager adds the legacy os/arch labels to a node that lacks them, one
    update per node; 1000 fake nodes lacking them kept the operator reconciling for minutes."""
    names = cluster.add_nodes(3, gpus=8, prefix="kubelet-labels")
    time.sleep(2.0)  # the node lifecycle controller labels a new node within a second
    for name in names:
        node = cluster.node(name)
        labels = node["metadata"]["labels"]
        assert labels["beta.kubernetes.io/os"] == labels["kubernetes.io/os"] == "linux"
        assert labels["beta.kubernetes.io/arch"] == labels["kubernetes.io/arch"] == "amd64"
        relabelled = [m["manager"] for m in node["metadata"].get("managedFields") or []
                      if m.get("manager") == "kube-controller-manager"
                      and "f:labels" in (m.get("fieldsV1") or {}).get("f:metadata", {})]
        assert not relabelled, f"{name}: labels changed by {relabelled}"
