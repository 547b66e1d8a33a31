"""Command lines and configuration files of the control plane, rendered as pure functions.

Nothing here touches the disk or starts anything, so every flag can be unit-tested and
read in one place. Every listener is bound to 127.0.0.1.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from choreo_dev.layout import Layout
from choreo_dev.pki import SERVICE_IP
from choreo_dev.ports import HOST

SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.244.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
CONTEXT = "choreo-local"
# The label kwok's chaos stage watches; setting it to "true" makes the node NotReady.
NOT_READY_LABEL = "node-not-ready.stage.kwok.x-k8s.io"
# A Job's pod with this label stays Running until deleted, as a training job's would; kwok
# otherwise completes Job pods at once.
KEEP_RUNNING_LABEL = "choreo.dev/keep-running"


def server_url(ports: Mapping[str, int]) -> str:
    """The HTTPS address of the API server."""
    return f"https://{HOST}:{ports['kube-apiserver']}"


def render_kubeconfig(server: str, ca_pem: bytes, token: str) -> str:
    """An admin kubeconfig that verifies the server against the local CA."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CONTEXT,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": CONTEXT, "user": {"token": token}}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT}}],
        "current-context": CONTEXT,
        "preferences": {},
    }
    return yaml.safe_dump(doc, sort_keys=False)


NODE_LEASE_SECONDS = 40  # the kubelet's default; kwok renews each node's Lease within it


def etcd_args(layout: Layout, ports: Mapping[str, int]) -> list[str]:
    """etcd as a single member; fsync is off because this data is disposable and speed wins."""
    client = f"http://{HOST}:{ports['etcd-client']}"
    peer = f"http://{HOST}:{ports['etcd-peer']}"
    return [
        "--name=choreo",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=choreo={peer}",
        "--unsafe-no-fsync=true",
        "--quota-backend-bytes=8589934592",  # etcd's suggested maximum: 200 tenants' schedules
        "--log-level=warn",
    ]


def apiserver_args(layout: Layout, ports: Mapping[str, int]) -> list[str]:
    """kube-apiserver with token auth, RBAC, and service-account tokens signed by our key."""
    return [
        f"--etcd-servers=http://{HOST}:{ports['etcd-client']}",
        f"--bind-address={HOST}",
        f"--secure-port={ports['kube-apiserver']}",
        f"--tls-cert-file={layout.serving_cert}",
        f"--tls-private-key-file={layout.serving_key}",
        f"--cert-dir={layout.pki}",
        f"--token-auth-file={layout.token_file}",
        # Also publishes extension-apiserver-authentication, which the controller-manager
        # and scheduler read at start (they log errors every second without it).
        f"--client-ca-file={layout.ca_cert}",
        "--authorization-mode=RBAC",
        f"--service-account-issuer={SA_ISSUER}",
        f"--service-account-key-file={layout.sa_pub}",
        f"--service-account-signing-key-file={layout.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # The advertised address only has to be non-loopback; with no endpoint reconciler
        # nothing ever dials it.
        f"--advertise-address={SERVICE_IP}",
        "--endpoint-reconciler-type=none",
        "--allow-privileged=true",
        "--profiling=false",
    ]


def _client_flags(layout: Layout) -> list[str]:
    kubeconfig = str(layout.kubeconfig)
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={HOST}",
        "--leader-elect=false",
        "--profiling=false",
    ]


def controller_manager_args(layout: Layout, ports: Mapping[str, int],
                            node_lease_seconds: int = NODE_LEASE_SECONDS) -> list[str]:
    """kube-controller-manager without node IPAM (kwok assigns pod IPs itself); a node
    whose Lease is not renewed for its duration and 10 s more is not ready."""
    return [
        f"--node-monitor-grace-period={max(50, node_lease_seconds + 10)}s",
        *_client_flags(layout),
        f"--secure-port={ports['kube-controller-manager']}",
        f"--service-account-private-key-file={layout.sa_key}",
        f"--root-ca-file={layout.ca_cert}",
        "--controllers=*,-nodeipam",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--cert-dir={layout.pki / 'kube-controller-manager'}",
    ]


def scheduler_args(layout: Layout, ports: Mapping[str, int]) -> list[str]:
    """kube-scheduler with the default profile."""
    return [
        *_client_flags(layout),
        f"--secure-port={ports['kube-scheduler']}",
        f"--cert-dir={layout.pki / 'kube-scheduler'}",
    ]


def kwok_args(layout: Layout, node_lease_seconds: int = NODE_LEASE_SECONDS) -> list[str]:
    """kwok managing every node; it serves nothing, it only talks to the API server."""
    return [
        f"--kubeconfig={layout.kubeconfig}",
        f"--config={layout.kwok_config}",
        "--manage-all-nodes=true",
        f"--node-lease-duration-seconds={node_lease_seconds}",
        f"--cidr={POD_CIDR}",
        f"--node-ip={SERVICE_IP}",
    ]


def component_args(name: str, layout: Layout, ports: Mapping[str, int],
                   node_lease_seconds: int = NODE_LEASE_SECONDS) -> list[str]:
    """The flags of one control-plane component; ``node_lease_seconds`` is the fake nodes'
    Lease duration (kwok renews within it)."""
    if name == "etcd":
        return etcd_args(layout, ports)
    if name == "kube-apiserver":
        return apiserver_args(layout, ports)
    if name == "kube-controller-manager":
        return controller_manager_args(layout, ports, node_lease_seconds)
    if name == "kube-scheduler":
        return scheduler_args(layout, ports)
    if name == "kwok":
        return kwok_args(layout, node_lease_seconds)
    raise KeyError(f"unknown component {name!r}")


class _LiteralDumper(yaml.SafeDumper):
    """Dump multi-line strings (kwok's status templates) as readable block literals."""


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_LiteralDumper.add_representer(str, _str_presenter)

_NOT_KEPT_RUNNING = {"key": f'.metadata.labels["{KEEP_RUNNING_LABEL}"]',
                     "operator": "DoesNotExist"}
_HEALTHY_ONLY = {"key": f'.metadata.labels["{NOT_READY_LABEL}"]', "operator": "DoesNotExist"}
_NOT_YET_FAILED = {
    "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
    "operator": "NotIn",
    "values": ["False"],
}


def render_kwok_stages(documents: Sequence[str]) -> str:
    """Join kwok's stage files into one config, wired so a label fails a node quietly.

    As shipped, the chaos stage re-posts a failed node's status about once a second and
    the initialise and heartbeat stages still match it, racing the failure by weight.
    Here the chaos stage fires once per failure and the other node stages only touch
    nodes without the failure label, so a failed node is as silent as a dead one. Job pods
    labelled ``KEEP_RUNNING_LABEL`` are never completed, so a training Job can stay up.
    """
    stages: list[dict[str, Any]] = []
    for text in documents:
        stages.extend(doc for doc in yaml.safe_load_all(text) if doc)
    for stage in stages:
        spec = stage["spec"]
        if stage["metadata"]["name"] == "pod-complete":
            spec.setdefault("selector", {}).setdefault("matchExpressions", []).append(
                dict(_NOT_KEPT_RUNNING))
        if spec["resourceRef"]["kind"] != "Node":
            continue
        expressions = spec.setdefault("selector", {}).setdefault("matchExpressions", [])
        if stage["metadata"]["name"] == "node-not-ready":
            expressions.append(dict(_NOT_YET_FAILED))
        else:
            expressions.append(dict(_HEALTHY_ONLY))
    return yaml.dump_all(stages, Dumper=_LiteralDumper, sort_keys=False)


def read_stage_files(stage_dir: Path, names: Sequence[str]) -> list[str]:
    """The texts of kwok stage files, in order."""
    return [(stage_dir / name).read_text() for name in names]
