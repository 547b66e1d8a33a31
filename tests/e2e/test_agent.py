"""Node agents on fake nodes, against the real local API server, with the simulated backend.

kwok nodes run no containers, so each agent runs as a host process for its fake node; a
placeholder DaemonSet gives every node a real Pod for the NodeFabric's owner reference,
exactly as the downward API would in a real cluster.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from choreo_dev.kube import ApiException
from choreo_dev.testing import LocalCluster

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
GROUP = "choreo.dev/v1alpha1"
CRDS = ("nodefabrics.choreo.dev", "devicefailures.choreo.dev")


@dataclass
class AgentProcess:
    node: str
    proc: subprocess.Popen[bytes]
    log: Path
    started: float

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics_url(self) -> str:
        m = re.search(r"serving /metrics and /healthz on (http://\S+)", self.log_text())
        assert m, self.log_text()
        return m.group(1)


@pytest.fixture(scope="module")
def crds(cluster: LocalCluster) -> None:
    for name in CRDS:
        cluster.apply(ROOT / "crds" / f"choreo.dev_{name.split('.')[0]}.yaml")

    def established() -> bool:
        for name in CRDS:
            crd = cluster.client.get(
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            )
            conds = crd.get("status", {}).get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                return False
        return True

    cluster.wait_for(established, "the choreo CRDs to be Established")


def placeholder_pods(
    cluster: LocalCluster, ns: str, pool: str, nodes: list[str]
) -> dict[str, dict[str, Any]]:
    """A DaemonSet standing in for the agent's: one Running Pod per fake node."""
    cluster.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "choreo-agent", "namespace": ns},
            "spec": {
                "selector": {"matchLabels": {"app": "choreo-agent"}},
                "template": {
                    "metadata": {"labels": {"app": "choreo-agent"}},
                    "spec": {
                        "nodeSelector": {"choreo.dev/pool": pool},
                        "containers": [{"name": "agent", "image": "choreo:dev"}],
                    },
                },
            },
        }
    )

    def running() -> dict[str, dict[str, Any]] | None:
        pods = cluster.client.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3Dchoreo-agent")
        by_node = {
            p["spec"].get("nodeName"): p
            for p in pods["items"]
            if p["status"].get("phase") == "Running"
        }
        return by_node if set(nodes) <= set(by_node) else None

    result: dict[str, dict[str, Any]] = cluster.wait_for(running, "placeholder agent pods to run")
    return result


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[list[AgentProcess]]:
    """Started agent processes; each is stopped by PID at the end and must exit cleanly."""
    started: list[AgentProcess] = []
    yield started
    codes = {}
    for agent in started:
        if agent.proc.poll() is None:
            agent.proc.terminate()
        try:
            codes[agent.node] = agent.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            agent.proc.kill()
            codes[agent.node] = agent.proc.wait(timeout=5)
    assert all(code == 0 for code in codes.values()), {
        a.node: (codes[a.node], a.log_text()[-2000:]) for a in started
    }


def start_agent(
    cluster: LocalCluster, tmp_path: Path, node: str, ns: str, pod: dict[str, Any], *extra: str
) -> AgentProcess:
    log = tmp_path / f"agent-{node}.log"
    cmd = [
        sys.executable, "-m", "choreo_agents", "--backend", "sim", "--node", node,
        "--namespace", ns, "--pod-name", pod["metadata"]["name"], "--pod-namespace", ns,
        "--kubeconfig", str(cluster.info.kubeconfig), "--stagger", "0", "--poll", "0.25",
        "--recover-after", "1", "--metrics-port", "0", "--metrics-address", "127.0.0.1",
        "--duration", "240", *extra,
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    return AgentProcess(node, proc, log, time.monotonic())


def nodefabric(cluster: LocalCluster, ns: str, node: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = cluster.client.get(
            f"/apis/{GROUP}/namespaces/{ns}/nodefabrics/{node}"
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return obj


def failure(cluster: LocalCluster, name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = cluster.client.get(f"/apis/{GROUP}/devicefailures/{name}")
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return obj


def test_agents_publish_nodefabrics_and_report_a_link_failure_within_5s(
    cluster: LocalCluster, crds: None, agents: list[AgentProcess], tmp_path: Path
) -> None:
    pool = cluster.unique("agents")
    nodes = cluster.add_nodes(2, gpus=8, labels={"choreo.dev/pool": pool})
    ns = cluster.create_namespace("agent")
    pods = placeholder_pods(cluster, ns, pool, nodes)
    fault_at, heal_at = 8.0, 14.0
    script = tmp_path / "faults.yaml"
    script.write_text(
        f"events:\n  - {{at: {fault_at}s, link-down: [1, 4]}}\n"
        f"  - {{at: {heal_at}s, link-up: [1, 4]}}\n"
    )
    sick, healthy = nodes
    agents.append(start_agent(cluster, tmp_path, sick, ns, pods[sick], "--fabric", "dgx1",
                              "--script", str(script)))  # fmt: skip
    agents.append(start_agent(cluster, tmp_path, healthy, ns, pods[healthy],
                              "--fabric", "dgx-h100-2", "--fabric-node", "1"))  # fmt: skip

    def published() -> bool:
        objs = [nodefabric(cluster, ns, n) for n in nodes]
        return all(o and o.get("status", {}).get("lastProbeTime") for o in objs)

    cluster.wait_for(published, "both agents to publish measured NodeFabrics", timeout=30)
    for node in nodes:
        obj = nodefabric(cluster, ns, node)
        assert obj is not None
        pod = pods[node]["metadata"]
        assert obj["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": pod["name"], "uid": pod["uid"],
             "controller": True, "blockOwnerDeletion": False}
        ]  # fmt: skip
        assert obj["spec"]["nodeName"] == node and obj["spec"]["backend"] == "sim"
        assert len(obj["spec"]["gpus"]) == 8
        assert obj["status"]["healthyGPUs"] == 8
        assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
        assert all(link["fit"]["samples"] >= 40 for link in obj["spec"]["links"])
    h100 = nodefabric(cluster, ns, healthy)
    assert h100 is not None
    assert {ln.get("dstSwitch") for ln in h100["spec"]["links"]} >= {"sw-nvswitch"}
    assert len(h100["spec"]["nics"]) == 8

    name = f"{sick}-link-1-4"
    assert failure(cluster, name) is None
    fault_time = agents[0].started + fault_at
    opened = cluster.wait_for(lambda: failure(cluster, name), "the DeviceFailure", timeout=30)
    latency = time.monotonic() - fault_time
    assert latency <= 5.0, f"DeviceFailure appeared {latency:.1f} s after the fault"
    assert opened["spec"]["device"] == {"type": "link", "gpu": 1, "peerGPU": 4}
    assert opened["spec"]["source"] == "agent" and opened["spec"]["resolved"] is False
    obj = nodefabric(cluster, ns, sick)
    assert obj is not None
    down = [ln for ln in obj["spec"]["links"] if {ln["src"], ln.get("dstGPU")} == {1, 4}]
    assert down and not any(ln["healthy"] for ln in down)
    assert failure(cluster, f"{healthy}-link-1-4") is None

    def resolved() -> bool:
        df = failure(cluster, name)
        return bool(df and df["spec"]["resolved"])

    cluster.wait_for(resolved, "the DeviceFailure to be resolved", timeout=30)
    obj = nodefabric(cluster, ns, sick)
    assert obj is not None and all(ln["healthy"] for ln in obj["spec"]["links"])

    with urllib.request.urlopen(agents[0].metrics_url() + "/healthz", timeout=5) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(agents[0].metrics_url() + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert re.search(rf'choreo_link_healthy\{{[^}}]*node="{sick}"[^}}]*\}} 1\.0', text)
    assert "choreo_link_bandwidth_bytes_per_second" in text
    assert "choreo_probe_duration_seconds_count" in text


def test_probe_request_annotation_remeasures(
    cluster: LocalCluster, crds: None, agents: list[AgentProcess], tmp_path: Path
) -> None:
    pool = cluster.unique("probe")
    (node,) = cluster.add_nodes(1, gpus=8, labels={"choreo.dev/pool": pool})
    ns = cluster.create_namespace("probe")
    pods = placeholder_pods(cluster, ns, pool, [node])
    agents.append(start_agent(cluster, tmp_path, node, ns, pods[node], "--fabric", "dgx1",
                              "--interval", "3600"))  # fmt: skip

    def probed() -> str | None:
        obj = nodefabric(cluster, ns, node)
        return obj.get("status", {}).get("lastProbeTime") if obj else None

    first = cluster.wait_for(probed, "the first probe", timeout=30)
    time.sleep(1.1)  # lastProbeTime has one-second resolution
    cluster.client.merge_patch(
        f"/apis/{GROUP}/namespaces/{ns}/nodefabrics/{node}",
        {"metadata": {"annotations": {"choreo.dev/probe-requested": "e2e"}}},
    )

    def reprobed() -> bool:
        obj = nodefabric(cluster, ns, node)
        annotations = (obj or {}).get("metadata", {}).get("annotations") or {}
        return bool(probed() != first and "choreo.dev/probe-requested" not in annotations)

    cluster.wait_for(reprobed, "a re-measurement on request", timeout=30)
    assert "re-measurement requested" in agents[0].log_text()


def test_rejected_writes_are_logged_and_retried_without_exiting(
    cluster: LocalCluster, crds: None, agents: list[AgentProcess], tmp_path: Path
) -> None:
    ns = cluster.create_namespace("reject")
    node = cluster.unique("ghost")
    agents.append(start_agent(cluster, tmp_path, node, ns, {"metadata": {"name": "no-such-pod"}},
                              "--fabric", "dgx1"))  # fmt: skip

    def logged_twice() -> bool:
        return agents[0].log_text().count("NodeFabric write rejected") >= 2

    cluster.wait_for(logged_twice, "the agent to retry a rejected write", timeout=30)
    assert agents[0].proc.poll() is None
    assert "404" in agents[0].log_text()
