"""Agents, operator and synthesizer together: a scripted link failure on a node makes the
agent open a DeviceFailure, the operator resynthesizes the job around it, and recovery
(the agent resolving the failure) brings a schedule over the healed fabric back.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from choreo_dev import operator_testing as T
from choreo_dev.kube import ApiException
from choreo_dev.testing import LocalCluster

pytestmark = pytest.mark.e2e

GROUP = "/apis/choreo.dev/v1alpha1"
FAULT_AT, HEAL_AT = 20.0, 40.0
WEBHOOK = "choreo-operator-agent-e2e"


@pytest.fixture
def stack(cluster: LocalCluster, tmp_path: Path) -> Iterator[dict[str, Any]]:
    for crd in T.crd_documents():
        cluster.kubectl("apply", "-f", str(crd))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    nodes = cluster.add_nodes(2, gpus=8, prefix="agop")
    ns = cluster.create_namespace("agop")
    fabric = cluster.unique("agent-op")
    cluster.apply(T.webhook_manifest(WEBHOOK))
    cluster.apply({"apiVersion": "choreo.dev/v1alpha1", "kind": "FabricTopology",
                   "metadata": {"name": fabric},
                   "spec": {"nodes": [{"name": n, "position": i} for i, n in enumerate(nodes)],
                            "intraNode": {"preset": "dgx1"},
                            "interNode": {"type": "rail", "rails": 1}}})  # fmt: skip
    procs: list[T.Proc] = []
    try:
        synth, port = T.start_synthesizer(tmp_path / "synth.log")
        procs.append(synth)
        operator, _ = T.start_operator(
            tmp_path / "operator.log", cluster.info.kubeconfig, f"127.0.0.1:{port}",
            tmp_path / "certs", extra=["--webhook-config", WEBHOOK],
        )  # fmt: skip
        procs.append(operator)
        script = tmp_path / "faults.yaml"
        script.write_text(f"events:\n  - {{at: {FAULT_AT}s, link-down: [1, 4]}}\n"
                          f"  - {{at: {HEAL_AT}s, link-up: [1, 4]}}\n")  # fmt: skip
        started = time.monotonic()
        for i, node in enumerate(nodes):
            argv = [
                sys.executable, "-m", "choreo_agents", "--backend", "sim", "--fabric", "dgx1",
                "--node", node, "--namespace", ns, "--kubeconfig", str(cluster.info.kubeconfig),
                "--stagger", "0", "--poll", "0.25", "--recover-after", "1",
                "--metrics-port", "-1", "--duration", "300",
            ]  # fmt: skip
            if i == 0:
                argv += ["--script", str(script)]
            procs.append(T.spawn(f"agent-{node}", argv, tmp_path / f"agent-{node}.log"))
        yield {"nodes": nodes, "ns": ns, "started": started, "logs": tmp_path, "procs": procs}
    finally:
        for proc in reversed(procs):
            proc.stop()
        leftovers = (
            f"{GROUP}/fabrictopologies/{fabric}",
            f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{WEBHOOK}",
            *(f"{GROUP}/devicefailures/{n}-link-1-4" for n in nodes),
        )
        for path in leftovers:
            with contextlib.suppress(ApiException):
                cluster.client.delete(path)
    assert not any(p.alive() for p in procs)
    assert all(p.popen.returncode == 0 for p in procs if p.name.startswith("agent")), [
        T.tail(p.log) for p in procs
    ]


def test_agent_link_failure_resynthesizes_and_recovery_restores(
    cluster: LocalCluster, stack: dict[str, Any]
) -> None:
    nodes, ns = stack["nodes"], stack["ns"]
    client = cluster.client
    for node in nodes:
        path = f"{GROUP}/namespaces/{ns}/nodefabrics/{node}"
        cluster.wait_for(
            lambda p=path: client.get(p).get("status", {}).get("lastProbeTime"), path, 30
        )
    job = {"apiVersion": "choreo.dev/v1alpha1", "kind": "CollectiveJob",
           "metadata": {"name": "train"},
           "spec": {"selector": {"matchLabels": {"app": "train"}},
                    "collectives": [{"name": "grads", "collective": "allreduce",
                                     "minBytes": 1 << 20, "maxBytes": 1 << 26}]}}  # fmt: skip
    cluster.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(job))
    for rank, node in enumerate(nodes):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"train-{rank}", "labels": {
                   "app": "train", "batch.kubernetes.io/job-completion-index": str(rank)}},
               "spec": {"nodeName": node, "containers": [{
                   "name": "train", "image": "trainer:latest",
                   "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}  # fmt: skip
        cluster.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(pod))

    def status() -> dict[str, Any]:
        return dict(client.get(f"{GROUP}/namespaces/{ns}/collectivejobs/train").get("status") or {})

    def log_tail() -> str:
        return "\n".join(f"--- {p.name}\n{T.tail(p.log, 15)}" for p in stack["procs"])

    remaining = stack["started"] + FAULT_AT - time.monotonic()
    assert remaining > 3, f"setup too slow for the scripted fault ({remaining:.1f} s left)"
    ready = cluster.wait_for(lambda: (s := status()).get("phase") == "Ready" and s,
                             "the job's first schedule", timeout=remaining - 1)  # fmt: skip
    healthy_hash = ready["lastSynthesis"]["inputsHash"]
    assert ready["ranks"] == 16, log_tail()

    name = f"{nodes[0]}-link-1-4"
    opened = cluster.wait_for(lambda: client.get(f"{GROUP}/devicefailures/{name}"),
                              "the agent's DeviceFailure", timeout=60)  # fmt: skip
    assert time.monotonic() - (stack["started"] + FAULT_AT) <= 5.0 + 1.0
    assert opened["spec"]["source"] == "agent"
    failed = cluster.wait_for(
        lambda: (s := status()).get("lastSynthesis", {}).get("inputsHash")
        not in (None, healthy_hash)
        and s.get("phase") in ("Ready", "Degraded")
        and s,
        "a resynthesis around the failed link", timeout=60,
    )  # fmt: skip
    affected = cluster.wait_for(
        lambda: client.get(f"{GROUP}/devicefailures/{name}").get("status", {}).get("affected"),
        "the operator to record the affected job", timeout=30,
    )  # fmt: skip
    assert f"{ns}/train" in affected, log_tail()

    cluster.wait_for(lambda: client.get(f"{GROUP}/devicefailures/{name}")["spec"]["resolved"],
                     "the agent to resolve the failure", timeout=60)  # fmt: skip
    healed = cluster.wait_for(
        lambda: (s := status()).get("lastSynthesis", {}).get("inputsHash")
        != failed["lastSynthesis"]["inputsHash"] and s.get("phase") == "Ready" and s,
        "a schedule over the healed fabric", timeout=60,
    )  # fmt: skip
    assert healed["ranks"] == 16
    cluster.kubectl("delete", "-n", ns, "collectivejob", "train", "--wait=false")
