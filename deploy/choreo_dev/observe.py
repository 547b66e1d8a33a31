"""What the operator should be doing right now, computed from a snapshot of the API server.

The demo and the scenarios read every object the operator reads, parse them with the
operator's own model and run its pure planning steps (fabric graph, placement, grouping,
inputs hash) in this process. A tenant has converged when the inputs hash in its status is
the one this snapshot gives: its schedule was synthesized for the fabric as it is now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from choreo_dev.kube import ApiException, KubeClient
from choreo_operator import model, sources
from choreo_operator.fabric import Fabric
from choreo_operator.placement import Placement, place
from choreo_operator.planning import Blocked, FabricCache, GroupPlan, Inputs, plan_groups
from choreo_operator.reconciler import Settings

GROUP = "/apis/choreo.dev/v1alpha1"


def items(client: KubeClient, path: str) -> list[dict[str, Any]]:
    return list(client.get(path).get("items") or [])


def served_items(client: KubeClient, group: str, plural: str) -> list[dict[str, Any]]:
    """The objects of ``plural`` in the version ``group`` prefers; none if it is not served."""
    try:
        version = client.get(f"/apis/{group}")["preferredVersion"]["groupVersion"]
        return items(client, f"/apis/{version}/{plural}")
    except (ApiException, KeyError, TypeError):
        return []


def read_inputs(client: KubeClient) -> Inputs:
    """Everything the operator indexes, parsed the way the operator parses it. FabricTopology
    sources are resolved without the operator's memory of earlier rounds: while a source is
    inconsistent this view leaves out the nodes the operator keeps where they were."""
    invalid: list[model.Invalid] = []

    def valid(values: list[Any]) -> list[Any]:
        invalid.extend(v for v in values if isinstance(v, model.Invalid))
        return [v for v in values if not isinstance(v, model.Invalid)]

    nfs = valid([model.node_fabric(b) for b in items(client, f"{GROUP}/nodefabrics")])
    nodes = {n.name: n for n in (model.node_info(b) for b in items(client, "/api/v1/nodes"))}
    fabrics = valid([model.fabric_topology(b) for b in items(client, f"{GROUP}/fabrictopologies")])
    resolved = sources.Resolver().resolve_all(
        fabrics, nodes,
        [model.kueue_topology(b) for b in served_items(client, "kueue.x-k8s.io", "topologies")]
        if any(f.spec.source is not None for f in fabrics) else [],
        [model.hyper_node(b) for b in served_items(client, "topology.volcano.sh", "hypernodes")]
        if any(f.spec.source is not None for f in fabrics) else [])
    return Inputs(
        fabrics=[ft for ft, _ in resolved],
        node_fabrics={nf.node_name: nf for nf in nfs},
        failures=valid([model.device_failure(b) for b in items(client, f"{GROUP}/devicefailures")]),
        nodes=nodes,
        jobs=valid([model.job(b) for b in items(client, f"{GROUP}/collectivejobs")]),
        pods=[model.pod_info(b) for b in items(client, "/api/v1/pods")],
        notes={ft.name: notes for ft, notes in resolved if notes},
        invalid=invalid,
    )


@dataclass
class Expected:
    """The operator's view of one snapshot."""

    inputs: Inputs
    fabric: Fabric | None
    placements: dict[str, Placement]
    plans: dict[str, GroupPlan]  # job key -> the plan of its group
    blocked: dict[str, Blocked]  # job key -> (phase, reason, message)


def expected(client: KubeClient, settings: Settings | None = None) -> Expected:
    """Plan a round from the current objects without touching anything."""
    inputs = read_inputs(client)
    settings = settings or Settings()
    fabric, _ = FabricCache().fabric(inputs)
    jobs = [j for j in inputs.jobs if j.metadata.deletion_timestamp is None]
    placements = place(jobs, inputs.pods, fabric)
    blocked: dict[str, Blocked] = {}
    plans: dict[str, GroupPlan] = {}
    if fabric is not None:
        groups, blocked = plan_groups(
            jobs, placements, fabric, max_buckets=settings.max_buckets,
            restarts=settings.restarts, timeout_seconds=settings.call_timeout_seconds)
        plans = {job.key: plan for plan in groups for job in plan.members}
    return Expected(inputs, fabric, dict(placements), plans, blocked)
