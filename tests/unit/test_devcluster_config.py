"""Rendering of component flags, kubeconfig and kwok stages for the local cluster."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from choreo_dev.config import (
    KEEP_RUNNING_LABEL,
    NOT_READY_LABEL,
    component_args,
    render_kubeconfig,
    render_kwok_stages,
    server_url,
)
from choreo_dev.layout import Layout
from choreo_dev.versions import CONTROL_PLANE

PORTS = {
    "etcd-client": 23790,
    "etcd-peer": 23800,
    "kube-apiserver": 16443,
    "kube-controller-manager": 20257,
    "kube-scheduler": 20259,
}


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(tmp_path / "state")


def _flags(args: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in args)


def test_every_listener_is_on_loopback(layout: Layout) -> None:
    etcd = _flags(component_args("etcd", layout, PORTS))
    assert etcd["listen-client-urls"] == "http://127.0.0.1:23790"
    assert etcd["listen-peer-urls"] == "http://127.0.0.1:23800"
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        flags = _flags(component_args(name, layout, PORTS))
        assert flags["bind-address"] == "127.0.0.1", name
        assert flags["secure-port"] == str(PORTS[name]), name


def test_apiserver_uses_state_dir_material(layout: Layout) -> None:
    flags = _flags(component_args("kube-apiserver", layout, PORTS))
    assert flags["etcd-servers"] == "http://127.0.0.1:23790"
    assert flags["token-auth-file"] == str(layout.token_file)
    assert flags["service-account-signing-key-file"] == str(layout.sa_key)
    assert flags["service-account-key-file"] == str(layout.sa_pub)
    assert flags["tls-cert-file"] == str(layout.serving_cert)
    assert flags["endpoint-reconciler-type"] == "none"


def test_controller_manager_can_sign_tokens_and_skips_ipam(layout: Layout) -> None:
    flags = _flags(component_args("kube-controller-manager", layout, PORTS))
    assert flags["service-account-private-key-file"] == str(layout.sa_key)
    assert flags["controllers"] == "*,-nodeipam"
    assert flags["kubeconfig"] == str(layout.kubeconfig)


def test_every_control_plane_component_has_flags(layout: Layout) -> None:
    for name in CONTROL_PLANE:
        assert component_args(name, layout, PORTS)
    with pytest.raises(KeyError):
        component_args("kubelet", layout, PORTS)


def test_kubeconfig_points_at_the_apiserver_with_ca_and_token() -> None:
    doc = yaml.safe_load(render_kubeconfig(server_url(PORTS), b"PEM", "tok"))
    cluster = doc["clusters"][0]["cluster"]
    assert cluster["server"] == "https://127.0.0.1:16443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == b"PEM"
    assert doc["users"][0]["user"]["token"] == "tok"
    assert doc["current-context"] == doc["contexts"][0]["name"]


NODE_INIT = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: node-initialize}
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - {key: '.status.phase', operator: NotIn, values: [Running]}
  next:
    statusTemplate: |
      phase: Running
"""
NOT_READY = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: node-not-ready}
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - key: '.metadata.labels["node-not-ready.stage.kwok.x-k8s.io"]'
      operator: In
      values: ['true']
  next: {}
"""
POD_READY = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-ready}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
  next: {}
"""


def test_kwok_stages_let_a_label_fail_a_node() -> None:
    text = render_kwok_stages([NODE_INIT, NOT_READY + "---\n", POD_READY])
    rendered = list(yaml.safe_load_all(text))
    by_name = {s["metadata"]["name"]: s for s in rendered}
    assert set(by_name) == {"node-initialize", "node-not-ready", "pod-ready"}

    init = by_name["node-initialize"]["spec"]["selector"]["matchExpressions"]
    assert {"key": f'.metadata.labels["{NOT_READY_LABEL}"]', "operator": "DoesNotExist"} in init

    chaos = by_name["node-not-ready"]["spec"]["selector"]["matchExpressions"]
    assert any(e["operator"] == "NotIn" and e.get("values") == ["False"] for e in chaos)

    pod = by_name["pod-ready"]["spec"]["selector"]["matchExpressions"]
    assert len(pod) == 1


POD_COMPLETE = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-complete}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.ownerReferences.[].kind', operator: In, values: [Job]}
  next: {}
"""


def test_kwok_keeps_labelled_job_pods_running() -> None:
    rendered = list(yaml.safe_load_all(render_kwok_stages([POD_READY, POD_COMPLETE])))
    by_name = {s["metadata"]["name"]: s["spec"]["selector"]["matchExpressions"]
               for s in rendered}
    assert {"key": f'.metadata.labels["{KEEP_RUNNING_LABEL}"]',
            "operator": "DoesNotExist"} in by_name["pod-complete"]
    assert len(by_name["pod-ready"]) == 1


def test_kwok_status_templates_stay_block_literals() -> None:
    text = render_kwok_stages([NODE_INIT])
    assert "statusTemplate: |" in text


def test_node_lease_duration_reaches_kwok_and_the_node_lifecycle_grace() -> None:
    layout = Layout(Path("/state"))
    assert "--node-lease-duration-seconds=40" in component_args("kwok", layout, PORTS)
    assert "--node-monitor-grace-period=50s" in component_args(
        "kube-controller-manager", layout, PORTS)
    assert "--node-lease-duration-seconds=200" in component_args("kwok", layout, PORTS, 200)
    # a node is not marked unready between two renewals of a longer Lease
    assert "--node-monitor-grace-period=210s" in component_args(
        "kube-controller-manager", layout, PORTS, 200)
