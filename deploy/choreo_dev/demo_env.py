"""The demo's world: a control plane, eight fake H100 nodes, the chart, and choreo on the host.

Everything lives under one state directory (``.state/demo`` by default): the cluster in
``cluster/``, the host processes' logs and PID records in ``host/``, Helm's own files in
``helm/``. Stopping is by recorded PID only, so a kept demo can be stopped by a later
``choreo-dev demo stop``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from choreo.service.ports import listen_port
from choreo_dev import build, fabric, nodes, paths
from choreo_dev.cluster import Cluster, ClusterInfo
from choreo_dev.errors import DevClusterError
from choreo_dev.kube import KubeClient
from choreo_dev.stack import (
    HOST,
    AgentOptions,
    HostStack,
    agent_argv,
    operator_argv,
    prometheus_argv,
    prometheus_config,
    synthesizer_argv,
)
from choreo_dev.versions import CONTROL_PLANE, binary

RELEASE, NAMESPACE = "choreo", "choreo-system"
CHART = paths.REPO_ROOT / "charts" / "choreo"
NODES = [f"h100-{i}" for i in range(8)]
POOL_LABEL = "choreo.dev/demo-pool"
AGENT_LABEL = "choreo.dev/agent"
FABRIC = "dgx-h100-8"  # the synthesizer's model: 8 nodes, NVSwitch inside, 8 IB rails
HELM_TIMEOUT = 180


def default_root() -> Path:
    return paths.REPO_ROOT / ".state" / "demo"


@dataclass
class DemoEnv:
    """Handles on everything the demo started."""

    root: Path
    cluster: Cluster
    info: ClusterInfo
    client: KubeClient
    stack: HostStack
    ports: dict[str, int] = field(default_factory=dict)
    helm_output: str = ""

    @property
    def scripts(self) -> Path:
        return self.stack.root / "faults"

    def script(self, node: str) -> Path:
        return self.scripts / f"{node}.yaml"

    @property
    def prometheus_url(self) -> str:
        return f"http://{HOST}:{self.ports['prometheus']}"


def stop(root: Path) -> list[str]:
    """Stop a demo's host processes and its control plane by recorded PID."""
    stopped = [f"{r.name} (pid {r.pid})" for r in HostStack(root / "host").stop_all()]
    stopped += [f"{r.name} (pid {r.pid})" for r in Cluster(root / "cluster").down()]
    return stopped


def binaries() -> dict[str, Path]:
    """Cached control-plane binaries plus kubectl and helm (built if missing)."""
    return build.ensure([*CONTROL_PLANE, "kubectl", "helm"], lambda m: None)


def start_cluster(root: Path, bins: dict[str, Path]) -> tuple[Cluster, ClusterInfo]:
    """A fresh control plane in ``root/cluster`` (a previous demo's state is wiped)."""
    stop(root)
    shutil.rmtree(root, ignore_errors=True)
    cluster = Cluster(root / "cluster")
    return cluster, cluster.up(bins)


def add_nodes(client: KubeClient) -> list[str]:
    """Eight fake 8-GPU nodes in two pools of four, labelled for the agent DaemonSet."""
    doc = {"gpusPerNode": 8, "labels": {AGENT_LABEL: "true"},
           "nodes": [{"name": n, "position": [i], "labels": {POOL_LABEL: "ab"[i // 4]}}
                     for i, n in enumerate(NODES)]}
    names = nodes.add(client, fabric.parse(doc))
    nodes.wait_ready(client, names)
    return names


def helm_install(root: Path, info: ClusterInfo, helm: Path) -> str:
    """``helm install --wait``: CRDs, RBAC, webhook, and the workloads Ready on kwok nodes."""
    home = root / "helm"
    env = {**os.environ, "KUBECONFIG": str(info.kubeconfig),
           "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data")}
    argv = [str(helm), "install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
            "--wait", "--timeout", f"{HELM_TIMEOUT}s", "--set", "synthesizer.replicas=1",
            "--set", "agent.backend=sim"]
    try:
        out = subprocess.run(argv, env=env, capture_output=True, text=True,
                             timeout=HELM_TIMEOUT + 30, check=False)
    except subprocess.TimeoutExpired:
        raise DevClusterError(f"helm install did not finish within {HELM_TIMEOUT + 30} s") from None
    if out.returncode != 0:
        raise DevClusterError(f"helm install failed:\n{out.stdout}\n{out.stderr}".strip())
    return out.stdout


def chart_pods(client: KubeClient) -> list[dict[str, Any]]:
    return list(client.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"])


def agent_pods(client: KubeClient) -> dict[str, str]:
    """node -> name of the chart's agent pod there (the owner of its NodeFabric)."""
    return {p["spec"]["nodeName"]: p["metadata"]["name"] for p in chart_pods(client)
            if p["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "agent"
            and p["spec"].get("nodeName")}


def start_choreo(env: DemoEnv, agent_pods: dict[str, str]) -> None:
    """``choreo serve``, ``choreo operator`` and one sim agent per node, on loopback."""
    stack, ports = env.stack, env.ports
    ports.update({"grpc": listen_port(), "synthesizer": listen_port(), "operator": listen_port(),
                  "webhook": listen_port()})
    stack.start("synthesizer", synthesizer_argv(ports["grpc"], ports["synthesizer"], workers=2))
    stack.start("operator", operator_argv(
        env.info.kubeconfig, f"{HOST}:{ports['grpc']}", ports["operator"], ports["webhook"],
        stack.root / "certs", ["--webhook-config", f"{RELEASE}-operator",
                               "--unpack-image", chart_image()]))
    env.scripts.mkdir(parents=True, exist_ok=True)
    options = AgentOptions(fabric=FABRIC, namespace=NAMESPACE, poll=0.25, recover_after=2.0)
    for i, node in enumerate(NODES):
        ports[f"agent-{node}"] = listen_port()
        env.script(node).write_text("events: []\n")
        pod = (NAMESPACE, agent_pods[node]) if node in agent_pods else None
        stack.start(f"agent-{node}", agent_argv(node, i, env.info.kubeconfig, options,
                                                ports[f"agent-{node}"], env.script(node), pod))
    stack.wait_port("synthesizer", ports["grpc"])
    stack.wait_port("operator", ports["operator"])
    stack.wait_port("operator", ports["webhook"])


def chart_image() -> str:
    """The chart's default image, which its operator also names for the unpacking sidecar
    (``webhook.packedSchedules``): the demo's operator delivers schedules as the chart's does."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return f"{values['operator']['image']['repository']}:{chart['appVersion']}"


def start_prometheus(env: DemoEnv) -> None:
    """Debian's Prometheus scraping every choreo process once a second."""
    binary_path = shutil.which("prometheus")
    if binary_path is None:
        raise DevClusterError("the prometheus server is not installed; run `make system-deps` "
                              "(Debian package prometheus)")
    ports = env.ports
    targets = {"choreo-synthesizer": [f"{HOST}:{ports['synthesizer']}"],
               "choreo-operator": [f"{HOST}:{ports['operator']}"],
               "choreo-agent": [f"{HOST}:{ports[f'agent-{n}']}" for n in NODES]}
    ports["prometheus"] = listen_port()
    config = env.stack.root / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(targets)))
    env.stack.start("prometheus", prometheus_argv(binary_path, config, env.stack.root / "tsdb",
                                                  ports["prometheus"]))


def prometheus_targets_up(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/api/v1/targets", timeout=3) as resp:
        active = json.loads(resp.read())["data"]["activeTargets"]
    return bool(active) and all(t["health"] == "up" for t in active)


def helm_binary() -> Path:
    return build.binary_path(binary("helm"))
