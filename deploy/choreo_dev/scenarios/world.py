"""A throw-away cluster with choreo on the host, shared by every scenario and the soak.

One ``World`` is one state directory: its own control plane, CRDs, the synthesizer, the
operator and optionally simulated agents, all stopped by PID when the ``with`` block ends,
whatever happened inside it.
"""

from __future__ import annotations

import contextlib
import json
import signal
import tempfile
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from choreo.service.ports import listen_port
from choreo_dev import build, fabric, nodes
from choreo_dev import operator_testing as op_testing
from choreo_dev.cluster import Cluster, ClusterInfo
from choreo_dev.kube import ApiException, KubeClient, run_kubectl, wait_for
from choreo_dev.observe import GROUP
from choreo_dev.stack import (
    HOST,
    AgentOptions,
    HostStack,
    agent_argv,
    operator_argv,
    synthesizer_argv,
)
from choreo_dev.versions import CONTROL_PLANE

NEEDED = (*CONTROL_PLANE, "kubectl")


@dataclass
class World:
    root: Path
    cluster: Cluster
    info: ClusterInfo
    client: KubeClient
    kubectl_path: Path
    stack: HostStack
    ports: dict[str, int] = field(default_factory=dict)
    operator_flags: list[str] = field(default_factory=list)
    agents: dict[str, int] = field(default_factory=dict)  # node -> fabric position

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return run_kubectl(self.kubectl_path, self.info.kubeconfig, args, stdin=stdin)

    # ---- choreo on the host ------------------------------------------------------------------
    def start_synthesizer(self, workers: int = 2) -> None:
        self.ports.setdefault("grpc", listen_port())
        self.ports.setdefault("synthesizer", listen_port())
        self.stack.start("synthesizer", synthesizer_argv(self.ports["grpc"],
                                                         self.ports["synthesizer"], workers))
        self.stack.wait_port("synthesizer", self.ports["grpc"])

    def start_operator(self, flags: Sequence[str] = ()) -> None:
        """The operator without its webhook (no pods are admitted through it here)."""
        self.operator_flags = list(flags) or self.operator_flags
        self.ports.setdefault("operator", listen_port())
        self.stack.start("operator", operator_argv(
            self.info.kubeconfig, f"{HOST}:{self.ports['grpc']}", self.ports["operator"], 0,
            self.root / "certs", ["--webhook-config", "", *self.operator_flags]))
        self.stack.wait_port("operator", self.ports["operator"])

    def start_agent(self, node: str, position: int, options: AgentOptions,
                    script: Path) -> None:
        self.agents[node] = position
        self.stack.start(f"agent-{node}", agent_argv(node, position, self.info.kubeconfig,
                                                     options, -1, script))

    def kill(self, name: str) -> None:
        """SIGKILL, as a crash or an OOM kill would."""
        self.stack.stop(name, signal.SIGKILL)

    def operator_metrics(self) -> str:
        url = f"http://{HOST}:{self.ports['operator']}/metrics"
        with urllib.request.urlopen(url, timeout=3) as resp:
            return str(resp.read().decode())

    # ---- objects -----------------------------------------------------------------------------
    def add_nodes(self, prefix: str, count: int, gpus: int = 8) -> list[str]:
        names = nodes.add(self.client, fabric.grid(prefix, [count], gpus, {}))
        nodes.wait_ready(self.client, names, timeout=120)
        return names

    def fabric_topology(self, name: str, node_names: Sequence[str], rails: int = 8) -> None:
        self.client.create(f"{GROUP}/fabrictopologies", {
            "apiVersion": "choreo.dev/v1alpha1", "kind": "FabricTopology",
            "metadata": {"name": name},
            "spec": {"nodes": [{"name": n, "position": i} for i, n in enumerate(node_names)],
                     "intraNode": {"preset": "dgx-h100"},
                     "interNode": {"type": "rail", "rails": rails}}})

    def namespace(self, name: str) -> str:
        with contextlib.suppress(ApiException):
            self.client.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": name}})
        return name

    def tenant(self, namespace: str, name: str, node_names: Sequence[str],
               collective: str = "allreduce", max_bytes: int = 1 << 28,
               gpus_per_pod: int = 8) -> None:
        """A CollectiveJob and one running pod per node (bound by nodeName, as a scheduler
        would), ranked by the Indexed Job label."""
        self.client.create(f"{GROUP}/namespaces/{namespace}/collectivejobs", {
            "apiVersion": "choreo.dev/v1alpha1", "kind": "CollectiveJob",
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"tenant": name}},
                     "collectives": [{"name": "grads", "collective": collective,
                                      "minBytes": 1 << 20, "maxBytes": max_bytes}]}})
        for rank, node in enumerate(node_names):
            self.client.create(f"/api/v1/namespaces/{namespace}/pods", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{name}-{rank}", "labels": {
                    "tenant": name, "batch.kubernetes.io/job-completion-index": str(rank)}},
                "spec": {"nodeName": node, "containers": [{
                    "name": "train", "image": "trainer:scenario",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus_per_pod)}}}]}})

    def jobs(self) -> list[dict[str, Any]]:
        return list(self.client.get(f"{GROUP}/collectivejobs")["items"])


def install_crds(world: World) -> None:
    for crd in op_testing.crd_documents():
        world.kubectl("apply", "-f", str(crd))
    world.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")


@contextlib.contextmanager
def world(root: Path | None = None) -> Iterator[World]:
    """A fresh cluster with the CRDs installed; everything started is stopped by PID."""
    missing = build.missing(NEEDED)
    if missing:
        raise RuntimeError(f"control-plane binaries not built ({', '.join(missing)}); "
                           "run `choreo-dev build`")
    bins = build.resolve(NEEDED)
    base = root or Path(tempfile.mkdtemp(prefix="choreo-scenario-"))
    cluster = Cluster(base / "cluster")
    stack = HostStack(base / "host")
    try:
        info = cluster.up(bins)
        w = World(base, cluster, info, cluster.client(), bins["kubectl"], stack)
        install_crds(w)
        yield w
    finally:
        stack.stop_all()
        cluster.down()


def wait(check: Any, timeout: float, what: str, w: World, interval: float = 0.5) -> Any:
    """Bounded poll that fails early, quoting the log, if a host process died."""
    return wait_for(check, timeout, what, interval=interval, watchdog=w.stack.check)


def status_of(job: dict[str, Any]) -> dict[str, Any]:
    return dict(job.get("status") or {})


def dumps(doc: Any) -> str:
    return json.dumps(doc, indent=1, sort_keys=True)[:2000]
