"""The Helm chart rendered by the pinned helm: lint, the schema, what the objects say.

Rendering goes through ``helm template`` (the real template engine and JSON-schema check),
so these tests need the helm binary from ``choreo-dev build``; without it they are skipped.
The container arguments are parsed by the real ``choreo`` command-line parser, so a flag
renamed in a component breaks this test rather than a pod in a cluster.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from choreo.service.server import ServerConfig
from choreo.settings import from_arguments
from choreo_dev import build
from choreo_dev.versions import binary
from choreo_operator.config import Config

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts/choreo"
KUBE_VERSION = "1.34.4"


@pytest.fixture(scope="module")
def helm() -> Path:
    if build.missing(["helm"]):
        reason = "helm is not built; run `choreo-dev build --only helm`"
        if os.environ.get("CHOREO_E2E_REQUIRED"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return build.binary_path(binary("helm"))


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=60,
                          check=False)


def render(helm: Path, *sets: str, namespace: str = "choreo-system") -> list[dict[str, Any]]:
    args = ["template", "rel", str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION,
            "--include-crds"]
    for s in sets:
        args += ["--set", s]
    out = run_helm(helm, *args)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_lint_strict(helm: Path) -> None:
    out = run_helm(helm, "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize(
    ("value", "message"),
    [("agent.bogus=1", "at '/agent': additional properties 'bogus' not allowed"),
     ("synthesizer.replicas=0", "at '/synthesizer/replicas'"),
     ("synthesizer.service.type=Headless", "at '/synthesizer/service/type'"),
     ("webhook.failurePolicy=Sometimes", "at '/webhook/failurePolicy'"),
     ("monitoring.podMonitor.interval=soon", "at '/monitoring/podMonitor/interval'"),
     ("operator.resources.requests.gpu=1", "at '/operator/resources/requests'"),
     ("nonsense=true", "additional properties 'nonsense' not allowed")],
)
def test_schema_rejects_bad_values_by_name(helm: Path, value: str, message: str) -> None:
    out = run_helm(helm, "template", "rel", str(CHART), "--kube-version", KUBE_VERSION,
                   "--set", value)
    assert out.returncode != 0
    assert message in out.stderr


def test_default_objects(helm: Path) -> None:
    docs = render(helm)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("CustomResourceDefinition") == 4
    for kind in ("DaemonSet", "MutatingWebhookConfiguration", "Secret", "ConfigMap"):
        assert kind in kinds
    assert kinds.count("Deployment") == 2
    assert kinds.count("ValidatingAdmissionPolicy") == 2
    assert kinds.count("ValidatingAdmissionPolicyBinding") == 2
    assert "ServiceMonitor" not in kinds and "PodMonitor" not in kinds
    for d in docs:
        if d["kind"] != "CustomResourceDefinition" and d["metadata"].get("namespace"):
            assert d["metadata"]["namespace"] == "choreo-system", d["metadata"]["name"]


def test_chart_crds_are_the_top_level_crds(helm: Path) -> None:
    chart_crds = sorted((CHART / "crds").iterdir())
    assert [p.name for p in chart_crds] == sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    for p in chart_crds:
        assert p.is_symlink(), f"{p.name}: must link to crds/, the one source of truth"
        assert p.resolve() == (ROOT / "crds" / p.name).resolve()
    rendered = {d["metadata"]["name"]: d for d in render(helm)
                if d["kind"] == "CustomResourceDefinition"}
    for p in chart_crds:
        crd = yaml.safe_load(p.read_text())
        assert rendered[crd["metadata"]["name"]] == crd


# The keys a structural schema node may have (apiextensions JSONSchemaProps).
SCHEMA_KEYS = {
    "type", "description", "properties", "items", "required", "enum", "default", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
    "minItems", "maxItems", "pattern", "nullable", "additionalProperties", "anyOf", "allOf",
    "oneOf", "not", "x-kubernetes-validations", "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys", "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string", "x-kubernetes-embedded-resource", "x-kubernetes-map-type",
    "minProperties", "maxProperties", "uniqueItems", "multipleOf", "title", "example",
}


def schema_nodes(node: dict[str, Any], where: str) -> Any:
    yield where, node
    for key, child in (node.get("properties") or {}).items():
        yield from schema_nodes(child, f"{where}.{key}")
    if isinstance(node.get("items"), dict):
        yield from schema_nodes(node["items"], f"{where}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_nodes(node["additionalProperties"], f"{where}{{}}")


def test_chart_crds_are_well_formed_schemas() -> None:
    """A YAML slip (an unquoted ', ' in a flow-style description) turns text into keys,
    which the API server rejects on `kubectl apply` of an existing CRD."""
    for path in sorted((CHART / "crds").iterdir()):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            root = version["schema"]["openAPIV3Schema"]
            for where, node in schema_nodes(root, path.name):
                assert isinstance(node, dict), where
                unknown = set(node) - SCHEMA_KEYS
                assert not unknown, f"{where}: not schema keywords: {sorted(unknown)}"


def test_operator_rbac_matches_the_operator_manifest(helm: Path) -> None:
    manifest = [d for d in yaml.safe_load_all(
        (ROOT / "deploy/manifests/operator-rbac.yaml").read_text()) if d]
    expected = next(d for d in manifest if d["kind"] == "ClusterRole")["rules"]
    # The chart registers the webhook itself, so the operator needs no grant on it.
    expected = [r for r in expected if "mutatingwebhookconfigurations" not in r["resources"]]
    chart = by_kind(render(helm), "ClusterRole")["rel-choreo-operator"]["rules"]

    def norm(rules: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted((tuple(r["apiGroups"]), tuple(sorted(r["resources"])),
                       tuple(sorted(r["verbs"])), tuple(r.get("resourceNames", ())))
                      for r in rules)

    assert norm(chart) == norm(expected)


def test_operator_two_replicas_electing_one_leader(helm: Path) -> None:
    docs = render(helm)
    op = by_kind(docs, "Deployment")["rel-choreo-operator"]
    assert op["spec"]["replicas"] == 2 and "strategy" not in op["spec"]  # rolling, not Recreate
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
           for e in op["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env == {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}
    rules = by_kind(docs, "ClusterRole")["rel-choreo-operator"]["rules"]
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "verbs": ["get", "create", "update"]} in rules


def test_synthesizer_headless_service_for_client_side_balancing(helm: Path) -> None:
    services = by_kind(render(helm), "Service")
    headless = services["rel-choreo-synthesizer-headless"]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == services["rel-choreo-synthesizer"]["spec"]["selector"]


def test_synthesizer_replicas_and_grpc_probes(helm: Path) -> None:
    docs = render(helm, "synthesizer.replicas=5", "synthesizer.port=6000")
    synth = by_kind(docs, "Deployment")["rel-choreo-synthesizer"]
    assert synth["spec"]["replicas"] == 5
    container = synth["spec"]["template"]["spec"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": 6000}
    assert synth["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    svc = by_kind(docs, "Service")["rel-choreo-synthesizer"]
    assert {"name": "grpc", "port": 6000, "targetPort": "grpc", "protocol": "TCP",
            "appProtocol": "grpc"} in svc["spec"]["ports"]


def test_agent_daemonset_gated_by_node_label(helm: Path) -> None:
    docs = render(helm, "agent.nodeSelector.pool=gpu-a")
    ds = by_kind(docs, "DaemonSet")["rel-choreo-agent"]
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {
        "choreo.dev/agent": "true", "pool": "gpu-a"}
    assert not any(d["kind"] in ("DaemonSet", "ValidatingAdmissionPolicy")
                   for d in render(helm, "agent.enabled=false"))


def parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """The command lines the image offers, keyed by the container ``command``."""
    from choreo.cli import _parser
    from choreo.service.cli import register

    service = argparse.ArgumentParser(prog="python -m choreo.service")
    register(service.add_subparsers(metavar="COMMAND", required=True))
    return {(): _parser(), ("python", "-m", "choreo.service"): service}


def test_container_args_parse_with_the_real_command_lines(helm: Path) -> None:
    known = parsers()
    docs = render(helm)
    workloads = {**by_kind(docs, "Deployment"), **by_kind(docs, "DaemonSet")}
    seen = {}
    for name, w in workloads.items():
        container = w["spec"]["template"]["spec"]["containers"][0]
        command = tuple(container.get("command", ()))
        assert command in known, f"{name}: unknown entry point {command}"
        try:
            args = known[command].parse_args(container["args"])
        except SystemExit:
            pytest.fail(f"{name}: `{' '.join(command or ('choreo',))} "
                        f"{' '.join(container['args'])}` does not parse")
        seen[container["args"][0]] = args
    assert set(seen) == {"operator", "serve", "agent"}
    operator = from_arguments(Config, seen["operator"])
    assert operator.synthesizer == "dns:///rel-choreo-synthesizer-headless.choreo-system.svc:50051"
    assert operator.leader_election
    assert operator.webhook_config == ""
    assert operator.metrics_addr == "0.0.0.0"
    # packed schedules: the sidecar the webhook adds runs the operator's own image
    image = workloads["rel-choreo-operator"]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert operator.unpack_image == image and image.startswith("ghcr.io/choreo-dev/choreo:")
    off = by_kind(render(helm, "webhook.packedSchedules=false"), "Deployment")
    args = off["rel-choreo-operator"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--unpack-image")]
    assert from_arguments(ServerConfig, seen["serve"]).metrics_port == 9090
    assert seen["agent"].metrics_port == 9464
    assert seen["agent"].backend == "auto"


def test_probes_and_ports_match_args(helm: Path) -> None:
    deploys = by_kind(render(helm), "Deployment")
    op = deploys["rel-choreo-operator"]["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in op["ports"]}
    assert f"--liveness=http://0.0.0.0:{ports['health']}/healthz" in op["args"]
    assert f"--metrics-port={ports['metrics']}" in op["args"]
    assert f"--webhook-port={ports['webhook']}" in op["args"]
    assert op["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_webhook_certificate_and_ca_agree(helm: Path) -> None:
    from cryptography import x509

    docs = render(helm)
    secret = by_kind(docs, "Secret")["rel-choreo-webhook-cert"]
    hook = by_kind(docs, "MutatingWebhookConfiguration")["rel-choreo-operator"]["webhooks"][0]
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    assert hook["clientConfig"]["service"] == {
        "name": "rel-choreo-operator", "namespace": "choreo-system", "path": "/inject",
        "port": 443}
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    assert cert.issuer == ca.subject
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "rel-choreo-operator.choreo-system.svc" in names.get_values_for_type(x509.DNSName)


def test_existing_webhook_secret_is_used(helm: Path) -> None:
    docs = render(helm, "webhook.certificate.existingSecret=my-tls",
                  "webhook.certificate.caBundle=Q0E=")
    assert "Secret" not in {d["kind"] for d in docs}
    op = by_kind(docs, "Deployment")["rel-choreo-operator"]["spec"]["template"]["spec"]
    assert {"name": "webhook-cert", "secret": {"secretName": "my-tls"}} in op["volumes"]
    hook = by_kind(docs, "MutatingWebhookConfiguration")["rel-choreo-operator"]["webhooks"][0]
    assert hook["clientConfig"]["caBundle"] == "Q0E="


def test_monitors_behind_values(helm: Path) -> None:
    docs = render(helm, "monitoring.serviceMonitor.enabled=true",
                  "monitoring.podMonitor.enabled=true",
                  "monitoring.serviceMonitor.labels.release=kps")
    sm = by_kind(docs, "ServiceMonitor")["rel-choreo"]
    assert sm["metadata"]["labels"]["release"] == "kps"
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True
    pm = by_kind(docs, "PodMonitor")["rel-choreo-agent"]
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_dashboard_configmap(helm: Path) -> None:
    docs = render(helm, "dashboard.namespace=monitoring", "dashboard.labels.team=ml")
    cm = by_kind(docs, "ConfigMap")["rel-choreo-dashboard"]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["labels"]["team"] == "ml"
    shipped = json.loads((CHART / "dashboards/choreo.json").read_text())
    assert json.loads(cm["data"]["choreo.json"]) == shipped


def test_node_scope_policy_compares_token_node_with_object(helm: Path) -> None:
    policies = by_kind(render(helm), "ValidatingAdmissionPolicy")
    for resource, field in (("nodefabrics", "nodeName"), ("devicefailures", "node")):
        spec = policies[f"rel-choreo-agent-{resource}"]["spec"]
        assert spec["matchConditions"][0]["expression"] == (
            "request.userInfo.username == 'system:serviceaccount:choreo-system:rel-choreo-agent'")
        variables = {v["name"]: v["expression"] for v in spec["variables"]}
        assert "request.userInfo.extra['authentication.kubernetes.io/node-name']" in (
            variables["node"])
        assert f"object.spec.{field}" in variables["newNode"]
        assert f"oldObject.spec.{field}" in variables["oldNode"]
