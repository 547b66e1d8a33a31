"""The operator runs with nothing but its ServiceAccount's token and the shipped ClusterRole."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml

from choreo_dev import operator_testing as T
from choreo_dev.kube import ApiException, KubeClient
from choreo_dev.testing import LocalCluster

pytestmark = pytest.mark.e2e

GROUP = "/apis/choreo.dev/v1alpha1"


def _sa_kubeconfig(cluster: LocalCluster, path: Path) -> tuple[Path, str]:
    """A kubeconfig carrying a TokenRequest token of choreo-system/choreo-operator."""
    answer = cluster.client.create(
        "/api/v1/namespaces/choreo-system/serviceaccounts/choreo-operator/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": 3600}})
    token = answer["status"]["token"]
    admin = yaml.safe_load(cluster.info.kubeconfig.read_text())
    cluster_entry = admin["clusters"][0]
    doc = {"apiVersion": "v1", "kind": "Config",
           "clusters": [cluster_entry],
           "users": [{"name": "choreo-operator", "user": {"token": token}}],
           "contexts": [{"name": "sa", "context": {"cluster": cluster_entry["name"],
                                                   "user": "choreo-operator"}}],
           "current-context": "sa"}
    path.write_text(yaml.safe_dump(doc))
    return path, token


def test_operator_works_with_its_own_service_account(
        cluster: LocalCluster, tmp_path: Path) -> None:
    for crd in T.crd_documents():
        cluster.kubectl("apply", "-f", str(crd))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    cluster.kubectl("apply", "-f", str(T.MANIFESTS / "operator-rbac.yaml"))
    cluster.apply(T.webhook_manifest("choreo-operator"))
    kubeconfig, token = _sa_kubeconfig(cluster, tmp_path / "sa.kubeconfig")

    ca = base64.b64decode(yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"][
        "certificate-authority-data"])
    (tmp_path / "ca.crt").write_bytes(ca)
    as_sa = KubeClient.with_token(cluster.info.server, token, tmp_path / "ca.crt")
    for forbidden in ("/api/v1/secrets", f"{GROUP}/namespaces/default/collectivejobs/x"):
        with pytest.raises(ApiException) as err:
            as_sa.get(forbidden)
        assert err.value.status == 403

    nodes = cluster.add_nodes(2, gpus=8, prefix="rbac")
    ns = cluster.create_namespace("rbac")
    cluster.apply({"apiVersion": "choreo.dev/v1alpha1", "kind": "FabricTopology",
                   "metadata": {"name": "rbac"},
                   "spec": {"nodes": [{"name": n, "position": i} for i, n in enumerate(nodes)],
                            "interNode": {"type": "rail", "rails": 8}}})
    synth, port = T.start_synthesizer(tmp_path / "synth.log")
    operator = None
    try:
        operator, _ = T.start_operator(tmp_path / "operator.log", kubeconfig,
                                       f"127.0.0.1:{port}", tmp_path / "certs")
        job = {"apiVersion": "choreo.dev/v1alpha1", "kind": "CollectiveJob",
               "metadata": {"name": "rb"},
               "spec": {"selector": {"matchLabels": {"tenant": "rb"}},
                        "collectives": [{"name": "ag", "collective": "allgather",
                                         "minBytes": 1 << 20, "maxBytes": 1 << 24}]}}
        cluster.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(job))
        for rank, node in enumerate(nodes):
            cluster.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"rb-{rank}", "labels": {
                    "tenant": "rb", "batch.kubernetes.io/job-completion-index": str(rank)}},
                "spec": {"nodeName": node, "containers": [{
                    "name": "c", "image": "trainer", "resources": {
                        "limits": {"nvidia.com/gpu": "8"}}}]}}))

        def ready() -> dict[str, object] | None:
            status = cluster.client.get(f"{GROUP}/namespaces/{ns}/collectivejobs/rb").get(
                "status") or {}
            # the pods arrive one by one: a schedule for the first alone may come first
            return status if status.get("phase") == "Ready" and status.get("ranks") == 16 \
                else None

        try:
            status = cluster.wait_for(ready, "the job to be Ready on both pods", timeout=90)
        except Exception as err:
            raise AssertionError(f"{err}\n{T.tail(operator.log)}") from None
        assert status["ranks"] == 16
        assert cluster.client.exists(f"/api/v1/namespaces/{ns}/configmaps/{status['configMap']}")
        webhook = cluster.client.get("/apis/admissionregistration.k8s.io/v1/"
                                     "mutatingwebhookconfigurations/choreo-operator")
        assert webhook["webhooks"][0]["clientConfig"]["url"].startswith("https://127.0.0.1:")
        fabric = cluster.client.get(f"{GROUP}/fabrictopologies/rbac")
        assert fabric["status"]["gpus"] == 16
        log = operator.log.read_text()
        # a refused API call always says so ("... is forbidden", APIForbiddenError); a bare
        # "403" would also match timestamps such as 23:11:25,403
        assert "forbidden" not in log.lower(), T.tail(operator.log)
    finally:
        if operator is not None:
            operator.stop()
        synth.stop()
        for path in (f"{GROUP}/fabrictopologies/rbac",
                     "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                     "choreo-operator"):
            cluster.client.delete(path)
    assert operator is not None and not operator.alive() and not synth.alive()
