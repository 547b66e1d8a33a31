"""The demo's fabric, its two training tenants, their schedules, and faults on the agents.

Tenant A (``team-a/llm-pretrain``, AllReduce) runs on nodes 0-3 and tenant B
(``team-b/moe-finetune``, AllGather) on nodes 4-7, each as an Indexed batch/v1 Job of four
8-GPU pods: their inter-node traffic crosses the same eight rail switches. Faults go through
the simulated agents: the demo appends an event to a node's fault script, the agent reloads
it, notices the fault within two polls and opens a DeviceFailure, as on a real node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from choreo.generators import NDR_NIC_BANDWIDTH
from choreo_dev.config import KEEP_RUNNING_LABEL
from choreo_dev.demo_env import NAMESPACE, NODES, POOL_LABEL, DemoEnv
from choreo_dev.kube import ApiException, KubeClient
from choreo_dev.observe import GROUP, Expected
from choreo_operator.placement import healthy_slots

FABRIC_NAME = "h100-pod"
RAIL_BANDWIDTH = NDR_NIC_BANDWIDTH  # achievable on a 400 Gb/s NIC


@dataclass(frozen=True)
class Tenant:
    namespace: str
    name: str
    pool: str
    collective: str
    max_bytes: int

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def path(self) -> str:
        return f"{GROUP}/namespaces/{self.namespace}/collectivejobs/{self.name}"


TENANTS = (Tenant("team-a", "llm-pretrain", "a", "allreduce", 1 << 30),
           Tenant("team-b", "moe-finetune", "b", "allgather", 1 << 29))


def fabric_topology() -> dict[str, Any]:
    return {"apiVersion": "choreo.dev/v1alpha1", "kind": "FabricTopology",
            "metadata": {"name": FABRIC_NAME},
            "spec": {"nodes": [{"name": n, "position": i} for i, n in enumerate(NODES)],
                     "intraNode": {"preset": "dgx-h100"},
                     "interNode": {"type": "rail", "rails": 8,
                                   "bandwidthBytesPerSecond": RAIL_BANDWIDTH}}}


def collective_job(t: Tenant) -> dict[str, Any]:
    return {"apiVersion": "choreo.dev/v1alpha1", "kind": "CollectiveJob",
            "metadata": {"name": t.name, "namespace": t.namespace},
            "spec": {"selector": {"matchLabels": {"batch.kubernetes.io/job-name": t.name}},
                     "collectives": [{"name": "grads" if t.collective == "allreduce"
                                      else "params", "collective": t.collective,
                                      "minBytes": 1 << 20, "maxBytes": t.max_bytes}]}}


def batch_job(t: Tenant) -> dict[str, Any]:
    """Four pods of 8 GPUs each, one per node of the tenant's pool, running until deleted."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": t.name, "namespace": t.namespace},
            "spec": {"completionMode": "Indexed", "completions": 4, "parallelism": 4,
                     "backoffLimit": 0,
                     "template": {
                         "metadata": {"labels": {KEEP_RUNNING_LABEL: "true"}},
                         "spec": {"restartPolicy": "Never",
                                  "nodeSelector": {POOL_LABEL: t.pool},
                                  "containers": [{
                                      "name": "train", "image": "registry.local/trainer:demo",
                                      "command": ["torchrun", "train.py"],
                                      "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}}


def create_tenants(client: KubeClient) -> None:
    for t in TENANTS:
        client.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": t.namespace}})
        client.create(f"{GROUP}/namespaces/{t.namespace}/collectivejobs", collective_job(t))
        client.create(f"/apis/batch/v1/namespaces/{t.namespace}/jobs", batch_job(t))


def status(client: KubeClient, t: Tenant) -> dict[str, Any]:
    return dict(client.get(t.path).get("status") or {})


def phase_is(client: KubeClient, t: Tenant, phase: str) -> bool:
    return status(client, t).get("phase") == phase


def ready_on(client: KubeClient, t: Tenant, configmap: str) -> dict[str, Any] | None:
    """The status once the tenant is Ready on ``configmap``."""
    st = status(client, t)
    return st if st.get("phase") == "Ready" and st.get("configMap") == configmap else None


def pods(client: KubeClient, t: Tenant) -> list[dict[str, Any]]:
    path = (f"/api/v1/namespaces/{t.namespace}/pods?labelSelector="
            f"batch.kubernetes.io/job-name%3D{t.name}")
    return sorted(client.get(path)["items"], key=lambda p: p["metadata"]["name"])


@dataclass
class Summary:
    """One tenant's schedule at its largest size, against the bound and NCCL as it runs."""

    tenant: Tenant
    configmap: str
    ranks: int
    nodes: list[str]
    size: int
    busbw: float
    fraction: float
    time: float
    nccl_speedup: float | None
    nccl_choice: str
    nccl_ranges: int  # size ranges left to NCCL (no file there)


def summarize(client: KubeClient, t: Tenant) -> Summary:
    """The operator's prediction at the largest size range, against NCCL as it runs, from
    the CollectiveJob's status."""
    st = status(client, t)
    coll = st["collectives"][0]
    speedup = coll.get("speedupVsNccl")
    return Summary(t, st["configMap"], int(st["ranks"]), list(st.get("nodes") or []),
                   int(coll["sizeBytes"]), float(coll["predictedBusBandwidthBytesPerSecond"]),
                   float(coll["fractionOfBound"]), float(coll["predictedTimeSeconds"]),
                   float(speedup) if speedup is not None else None,
                   str(coll.get("ncclChoice", "")),
                   sum(r.get("runs") == "NCCL" for r in coll.get("sizes") or []))


def tenant_npus(exp: Expected, t: Tenant) -> tuple[int, ...]:
    """The fabric ids of the tenant's healthy GPUs, in rank order."""
    assert exp.fabric is not None
    return tuple(s.npu for s in healthy_slots(exp.placements[t.key], exp.fabric))


# ---- faults through the agents ---------------------------------------------------------------


def add_fault(env: DemoEnv, node: str, event: dict[str, Any]) -> None:
    """Append ``event`` (due at once) to the node's fault script; its agent reloads it."""
    path = env.script(node)
    doc = yaml.safe_load(path.read_text()) or {}
    events = list(doc.get("events") or [])
    events.append({"at": "0s", **event})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"events": events}, default_flow_style=None, sort_keys=False))
    tmp.replace(path)


def failure(client: KubeClient, name: str) -> dict[str, Any] | None:
    try:
        return dict(client.get(f"{GROUP}/devicefailures/{name}"))
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def resolved(client: KubeClient, name: str) -> bool:
    return bool((failure(client, name) or {}).get("spec", {}).get("resolved"))


def nodefabrics(client: KubeClient) -> list[dict[str, Any]]:
    return list(client.get(f"{GROUP}/namespaces/{NAMESPACE}/nodefabrics")["items"])
