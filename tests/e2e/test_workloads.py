"""Fake GPU nodes from kwok run real Jobs and DaemonSets scheduled by kube-scheduler."""

from __future__ import annotations

import pytest

from choreo_dev.fabric import GPU_RESOURCE, POSITION_LABEL
from choreo_dev.testing import LocalCluster
from choreo_dev.workloads import gpu_job, wait_job

pytestmark = pytest.mark.e2e


def test_fabric_nodes_carry_gpus_and_positions(cluster: LocalCluster) -> None:
    names = cluster.add_fabric(
        {
            "gpusPerNode": 8,
            "labels": {"choreo.dev/fabric": "e2e-ring"},
            "nodes": [
                {"name": "ring-a", "position": [0]},
                {"name": "ring-b", "position": [1], "gpus": 4},
            ],
        }
    )
    a, b = (cluster.node(n) for n in names)
    assert a["status"]["allocatable"][GPU_RESOURCE] == "8"
    assert b["status"]["allocatable"][GPU_RESOURCE] == "4"
    assert b["metadata"]["labels"][POSITION_LABEL] == "1"
    assert b["metadata"]["labels"]["choreo.dev/fabric"] == "e2e-ring"


def test_gpu_job_completes_on_a_fake_gpu_node(cluster: LocalCluster) -> None:
    pool = cluster.unique("train")
    gpu_nodes = cluster.add_nodes(2, gpus=8, labels={"choreo.dev/pool": pool})
    ns = cluster.create_namespace("job")
    job = gpu_job("train", ns, gpus=4)
    job["spec"]["template"]["spec"]["nodeSelector"]["choreo.dev/pool"] = pool
    cluster.client.create(f"/apis/batch/v1/namespaces/{ns}/jobs", job)
    assert wait_job(cluster.client, "train", ns, timeout=90) == "Complete"
    pods = cluster.client.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=job-name=train")
    (pod,) = pods["items"]
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["spec"]["nodeName"] in gpu_nodes
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits[GPU_RESOURCE] == "4"


def test_job_asking_for_more_gpus_than_any_node_stays_pending(cluster: LocalCluster) -> None:
    cluster.add_nodes(1, gpus=8)
    ns = cluster.create_namespace("toobig")
    cluster.client.create(f"/apis/batch/v1/namespaces/{ns}/jobs", gpu_job("huge", ns, gpus=64))

    def unschedulable() -> bool:
        pods = cluster.client.get(f"/api/v1/namespaces/{ns}/pods")["items"]
        return any(
            c.get("reason") == "Unschedulable" and GPU_RESOURCE in c.get("message", "")
            for p in pods
            for c in p.get("status", {}).get("conditions") or []
        )

    cluster.wait_for(unschedulable, "the scheduler to report insufficient nvidia.com/gpu")


def test_daemonset_pods_reach_running_on_every_selected_node(cluster: LocalCluster) -> None:
    pool = cluster.unique("pool")
    names = cluster.add_nodes(3, gpus=8, labels={"choreo.dev/pool": pool})
    ns = cluster.create_namespace("ds")
    cluster.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": ns},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": {
                        "nodeSelector": {"choreo.dev/pool": pool},
                        "containers": [{"name": "agent", "image": "busybox:1.36"}],
                    },
                },
            },
        }
    )

    def running_nodes() -> set[str] | None:
        pods = cluster.client.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=app=agent")
        nodes = {
            p["spec"].get("nodeName")
            for p in pods["items"]
            if p.get("status", {}).get("phase") == "Running"
        }
        return nodes if nodes == set(names) else None

    assert cluster.wait_for(running_nodes, "DaemonSet pods Running on all 3 pool nodes")
