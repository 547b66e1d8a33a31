"""A fake node can be failed and recovered, and Kubernetes reacts as to a real failure."""

from __future__ import annotations

import pytest

from choreo_dev.nodes import ready_status
from choreo_dev.testing import LocalCluster

pytestmark = pytest.mark.e2e

NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def _taints(cluster: LocalCluster, name: str) -> set[str]:
    return {t["key"] for t in cluster.node(name).get("spec", {}).get("taints") or []}


def test_node_marked_not_ready_is_reflected_and_recovers(cluster: LocalCluster) -> None:
    victim, bystander = cluster.add_nodes(2, gpus=8, prefix="fail")
    assert ready_status(cluster.node(victim)) == "True"

    cluster.mark_not_ready(victim)
    node = cluster.node(victim)
    assert ready_status(node) == "False"
    assert ready_status(cluster.node(bystander)) == "True"
    # The node lifecycle controller treats it like a real dead node and taints it.
    cluster.wait_for(lambda: NOT_READY_TAINT in _taints(cluster, victim), "the not-ready taint")
    text = cluster.kubectl("get", "node", victim, "--no-headers")
    assert "NotReady" in text.split()

    cluster.mark_ready(victim)
    assert ready_status(cluster.node(victim)) == "True"
    cluster.wait_for(lambda: NOT_READY_TAINT not in _taints(cluster, victim), "taint removal")


def test_pods_do_not_land_on_a_not_ready_node(cluster: LocalCluster) -> None:
    pool = cluster.unique("lonely")
    (only,) = cluster.add_nodes(1, gpus=8, labels={"choreo.dev/pool": pool})
    cluster.mark_not_ready(only)
    cluster.wait_for(lambda: NOT_READY_TAINT in _taints(cluster, only), "the not-ready taint")
    ns = cluster.create_namespace("avoid")
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": ns},
            "spec": {
                "nodeSelector": {"choreo.dev/pool": pool},
                "containers": [{"name": "c", "image": "busybox:1.36"}],
            },
        }
    )

    def unschedulable() -> bool:
        pod = cluster.client.get(f"/api/v1/namespaces/{ns}/pods/p")
        conditions = pod.get("status", {}).get("conditions") or []
        return any(c.get("reason") == "Unschedulable" for c in conditions)

    cluster.wait_for(unschedulable, "the pod to be unschedulable")
    assert not cluster.client.get(f"/api/v1/namespaces/{ns}/pods/p")["spec"].get("nodeName")
