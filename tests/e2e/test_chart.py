"""The Helm chart installed, enforced, upgraded and uninstalled on the local control plane.

kwok marks the chart's pods Running and Ready on fake GPU nodes without running the
images, so this checks what Kubernetes itself does with the chart: scheduling (the agent
DaemonSet lands only on labelled nodes), readiness of every workload, RBAC and the
node-scoped admission policy (exercised with real pod-bound service-account tokens), the
webhook certificate surviving an upgrade, and the CRDs surviving an uninstall.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from choreo_dev import build
from choreo_dev.kube import ApiException, KubeClient
from choreo_dev.testing import LocalCluster
from choreo_dev.versions import binary

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts/choreo"
RELEASE = "chart-e2e"
PREFIX = f"{RELEASE}-choreo"
AGENT_LABEL = "choreo.dev/agent"
GROUP = "/apis/choreo.dev/v1alpha1"


@dataclass
class Installed:
    cluster: LocalCluster
    namespace: str
    helm: Path
    env: dict[str, str]
    agent_nodes: list[str]
    other_node: str
    install_output: str

    def helm_run(self, *args: str, timeout: float = 180) -> str:
        out = subprocess.run([str(self.helm), *args, "-n", self.namespace], env=self.env,
                             capture_output=True, text=True, timeout=timeout, check=False)
        assert out.returncode == 0, f"helm {' '.join(args)}:\n{out.stdout}\n{out.stderr}"
        return out.stdout

    def get(self, path: str) -> Any:
        return self.cluster.client.get(path)

    def exists(self, path: str) -> bool:
        return self.cluster.client.exists(path)


@pytest.fixture(scope="module")
def installed(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[Installed]:
    if build.missing(["helm"]):
        pytest.fail("helm is not built; run `choreo-dev build --only helm`", pytrace=False)
    helm = build.binary_path(binary("helm"))
    home = tmp_path_factory.mktemp("helm-home")
    env = {**os.environ, "KUBECONFIG": str(cluster.info.kubeconfig),
           "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data")}
    agent_nodes = cluster.add_nodes(2, labels={AGENT_LABEL: "true"}, prefix="agent")
    other_node = cluster.add_nodes(1, prefix="noagent")[0]
    namespace = cluster.create_namespace("choreo-chart")
    inst = Installed(cluster, namespace, helm, env, agent_nodes, other_node, "")
    inst.install_output = inst.helm_run(
        "install", RELEASE, str(CHART), "--wait", "--timeout", "120s",
        "--set", "synthesizer.replicas=2")
    try:
        yield inst
    finally:
        subprocess.run([str(helm), "uninstall", RELEASE, "-n", namespace, "--wait",
                        "--timeout", "60s"], env=env, capture_output=True, timeout=90,
                       check=False)
        # Leave no fabric or failure behind for the operator tests sharing this cluster.
        for node in agent_nodes:
            for path in (f"{GROUP}/devicefailures/{node}-gpu0-e2e",
                         f"{GROUP}/namespaces/{namespace}/nodefabrics/{node}"):
                if cluster.client.exists(path):
                    cluster.client.delete(path)
        cluster.client.delete(f"/api/v1/namespaces/{namespace}")


def ready_counts(inst: Installed) -> dict[str, tuple[int, int]]:
    """name -> (ready, desired) of every Deployment and DaemonSet of the release."""
    out = {}
    ns = inst.namespace
    for d in inst.get(f"/apis/apps/v1/namespaces/{ns}/deployments")["items"]:
        out[d["metadata"]["name"]] = (d["status"].get("readyReplicas", 0), d["spec"]["replicas"])
    for d in inst.get(f"/apis/apps/v1/namespaces/{ns}/daemonsets")["items"]:
        s = d["status"]
        out[d["metadata"]["name"]] = (s.get("numberReady", 0), s["desiredNumberScheduled"])
    return out


def labelled_nodes(inst: Installed) -> set[str]:
    items = inst.get(f"/api/v1/nodes?labelSelector={AGENT_LABEL}%3Dtrue")["items"]
    return {n["metadata"]["name"] for n in items}


def test_every_workload_ready(installed: Installed) -> None:
    counts = ready_counts(installed)
    assert counts == {f"{PREFIX}-operator": (2, 2), f"{PREFIX}-synthesizer": (2, 2),
                      f"{PREFIX}-agent": (len(labelled_nodes(installed)),) * 2}


def test_agents_only_on_labelled_nodes(installed: Installed) -> None:
    pods = installed.get(f"/api/v1/namespaces/{installed.namespace}/pods?labelSelector="
                         "app.kubernetes.io/component%3Dagent")["items"]
    on = {p["spec"]["nodeName"] for p in pods}
    assert set(installed.agent_nodes) <= on
    assert installed.other_node not in on
    assert on <= labelled_nodes(installed)


def test_crds_installed_and_notes_printed(installed: Installed) -> None:
    for plural in ("fabrictopologies", "nodefabrics", "collectivejobs", "devicefailures"):
        crd = installed.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                            f"{plural}.choreo.dev")
        established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert established["Established"] == "True"
    assert f"kubectl label node <gpu-node> {AGENT_LABEL}=true" in installed.install_output


# ---- node-scoped writes ---------------------------------------------------------------------


def agent_client(inst: Installed, bound: bool = True) -> tuple[KubeClient, str]:
    """A client holding an agent's token, bound to one agent pod (as the kubelet's is)."""
    pods = inst.get(f"/api/v1/namespaces/{inst.namespace}/pods?labelSelector="
                    "app.kubernetes.io/component%3Dagent")["items"]
    pod = next(p for p in pods if p["spec"]["nodeName"] in inst.agent_nodes)
    args = ["create", "token", f"{PREFIX}-agent", "-n", inst.namespace, "--duration", "10m"]
    if bound:
        args += ["--bound-object-kind", "Pod", "--bound-object-name", pod["metadata"]["name"]]
    token = inst.cluster.kubectl(*args).strip()
    ca = inst.cluster.info.state_dir / "pki" / "ca.crt"
    return KubeClient.with_token(inst.cluster.info.server, token, ca), pod["spec"]["nodeName"]


def node_fabric(namespace: str, name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "choreo.dev/v1alpha1", "kind": "NodeFabric",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node, "backend": "sim", "gpus": [{"index": 0}], "links": []}}


def device_failure(name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "choreo.dev/v1alpha1", "kind": "DeviceFailure",
            "metadata": {"name": name},
            "spec": {"node": node, "device": {"type": "gpu", "gpu": 0}, "source": "agent"}}


def denied(call: Any) -> ApiException:
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == 403, info.value
    return info.value


def test_agent_writes_its_own_node_only(installed: Installed) -> None:
    client, node = agent_client(installed)
    other = next(n for n in installed.agent_nodes if n != node)
    fabrics = f"{GROUP}/namespaces/{installed.namespace}/nodefabrics"
    # A new policy is enforced once the API server has compiled it: wait for the first denial.
    stranger = node_fabric(installed.namespace, other, other)

    def refused() -> bool:
        try:
            client.create(fabrics, stranger)
        except ApiException as err:
            return err.status == 403 and "may not write nodefabrics" in err.body
        client.delete(f"{fabrics}/{other}")
        return False

    installed.cluster.wait_for(refused, "the node-scope policy to be enforced", timeout=30)
    err = denied(lambda: client.create(fabrics, stranger))
    assert f"agent on node {node} may not write nodefabrics of node {other}" in err.body

    client.create(fabrics, node_fabric(installed.namespace, node, node))
    mine = f"{fabrics}/{node}"
    client.merge_patch(mine, {"spec": {"backend": "nvml"}})
    client.merge_patch(f"{mine}/status", {"status": {"healthyGPUs": 1}})
    err = denied(lambda: client.merge_patch(mine, {"spec": {"nodeName": other}}))
    assert f"of node {other}" in err.body

    # Another node's object, written by an administrator, stays out of reach.
    installed.cluster.client.create(fabrics, node_fabric(installed.namespace, "adm", other))
    err = denied(lambda: client.merge_patch(f"{fabrics}/adm", {"spec": {"backend": "sim"}}))
    assert "may not" in err.body

    failures = f"{GROUP}/devicefailures"
    client.create(failures, device_failure(f"{node}-gpu0-e2e", node))
    err = denied(lambda: client.create(failures, device_failure(f"{other}-gpu0-e2e", other)))
    assert "may not write devicefailures" in err.body


def test_agent_token_without_node_claim_is_refused(installed: Installed) -> None:
    client, node = agent_client(installed, bound=False)
    fabrics = f"{GROUP}/namespaces/{installed.namespace}/nodefabrics"
    err = denied(lambda: client.create(fabrics, node_fabric(installed.namespace, "x", node)))
    assert "carries no node claim" in err.body


def test_agent_rbac_is_narrow(installed: Installed) -> None:
    client, node = agent_client(installed)
    ns = installed.namespace
    # Deleting, other namespaces, and other kinds are not granted at all.
    for call in (
        lambda: client.delete(f"{GROUP}/namespaces/{ns}/nodefabrics/{node}"),
        lambda: client.create(f"{GROUP}/namespaces/default/nodefabrics",
                              node_fabric("default", node, node)),
        lambda: client.get(f"{GROUP}/namespaces/{ns}/collectivejobs"),
        lambda: client.get(f"/api/v1/namespaces/{ns}/secrets"),
    ):
        err = denied(call)
        assert "cannot" in err.body, err.body


# ---- upgrade and uninstall ------------------------------------------------------------------


def test_upgrade_keeps_certificate_and_scales(installed: Installed) -> None:
    ns = installed.namespace
    secret_path = f"/api/v1/namespaces/{ns}/secrets/{PREFIX}-webhook-cert"
    hook_path = ("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                 f"{PREFIX}-operator")
    before = installed.get(secret_path)["data"]
    installed.helm_run("upgrade", RELEASE, str(CHART), "--reuse-values", "--wait",
                       "--timeout", "120s", "--set", "synthesizer.replicas=3",
                       "--set", "synthesizer.queue=32")
    assert installed.get(secret_path)["data"] == before
    assert installed.get(hook_path)["webhooks"][0]["clientConfig"]["caBundle"] == (
        before["ca.crt"])
    counts = ready_counts(installed)
    assert counts[f"{PREFIX}-synthesizer"] == (3, 3)
    synth = installed.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{PREFIX}-synthesizer")
    assert "--queue=32" in synth["spec"]["template"]["spec"]["containers"][0]["args"]
    history = installed.helm_run("history", RELEASE, "-o", "json")
    assert '"revision":2' in history and '"status":"deployed"' in history


def test_uninstall_removes_everything_but_crds(installed: Installed) -> None:
    ns = installed.namespace
    kept = node_fabric(ns, "kept", installed.other_node)
    installed.cluster.client.create(f"{GROUP}/namespaces/{ns}/nodefabrics", kept)
    installed.helm_run("uninstall", RELEASE, "--wait", "--timeout", "60s")
    gone = [
        f"/apis/apps/v1/namespaces/{ns}/deployments/{PREFIX}-operator",
        f"/apis/apps/v1/namespaces/{ns}/deployments/{PREFIX}-synthesizer",
        f"/apis/apps/v1/namespaces/{ns}/daemonsets/{PREFIX}-agent",
        f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{PREFIX}-operator",
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/"
        f"{PREFIX}-agent-nodefabrics",
        f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{PREFIX}-operator",
    ]
    for path in gone:
        assert not installed.exists(path), path
    for plural in ("fabrictopologies", "nodefabrics", "collectivejobs", "devicefailures"):
        assert installed.exists("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                f"{plural}.choreo.dev")
    # Custom resources outlive the release too.
    assert installed.exists(f"{GROUP}/namespaces/{ns}/nodefabrics/kept")
