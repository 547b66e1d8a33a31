"""What a round asks the synthesizer for: the live fabric, and one plan per tenant group.

Planning is a pure function of the round's inputs (no API server, no synthesizer, no
reconciler), so the operator and its offline observers (the demo, the scenarios) plan alike.
Each plan carries the hash of everything its schedule depends on (the group's sub-fabric,
members, ranks, collectives and options): a group is synthesized only if that hash differs
from the one its members' status records, so replays after a restart, duplicate events and the
operator's own status updates cost nothing.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from choreo.service.client import (
    CollectiveLike,
    CollectiveRequest,
    RequestOptions,
    TenantRequest,
)
from choreo_api import (
    CollectiveJob,
    CollectiveSpec,
    DeviceFailure,
    FabricTopology,
    NodeFabricSpec,
)
from choreo_operator.fabric import (
    BaseFabric,
    Fabric,
    Subfabrics,
    apply_failures,
    base_fabric,
    fabric_nodes,
)
from choreo_operator.grouping import Group, Member
from choreo_operator.model import SHIP_ANYWAY, Invalid, NodeInfo, PodInfo
from choreo_operator.placement import Placement, RankSlot, healthy_slots, pod_part_ends
from choreo_operator.results import Trim

# The request options a CollectiveJob's inputs hash covers (what the operator sets; the hashes
# recorded in job statuses stay valid across versions that add options).
HASHED_OPTIONS = ("dialect", "instances", "protocol", "restarts", "max_buckets",
                  "deadline_seconds", "ship_slower_than_nccl")

Blocked = tuple[str, str, str]  # why a job is not planned: condition, reason, message


@dataclass
class Inputs:
    """Everything a round reads, as compact values. ``notes`` are each FabricTopology's
    source problems; ``invalid`` the objects of choreo's kinds that do not fit the API."""

    fabrics: list[FabricTopology]
    node_fabrics: dict[str, NodeFabricSpec]
    failures: list[DeviceFailure]
    nodes: dict[str, NodeInfo]
    jobs: list[CollectiveJob]
    pods: list[PodInfo]
    notes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    invalid: list[Invalid] = field(default_factory=list)


@dataclass
class GroupPlan:
    group: Group
    members: list[CollectiveJob]
    placements: dict[str, Placement]
    slots: dict[str, list[RankSlot]]  # job key -> its live ranks, in rank order
    tenants: list[TenantRequest]
    request_fabric: Any
    inputs_hash: str
    fingerprint: str
    options: RequestOptions
    alone: str = ""  # why the group's tenants were synthesized one by one
    singles: list[tuple[Any, TenantRequest]] = field(default_factory=list)


def digest(doc: Any) -> str:
    return hashlib.sha256(encoded(doc).encode()).hexdigest()


def encoded(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, default=repr)


Ranks = tuple[tuple[str, tuple[tuple[str, str, int], ...]], ...]  # job key -> pod, node, GPU


def inputs_hash(fingerprint: str, tenants: tuple[TenantRequest, ...],
                options: tuple[tuple[str, Any], ...], ranks: Ranks) -> str:
    """The hash of a group's inputs (the document recorded hashes were made of)."""
    return digest({"fabric": fingerprint, "tenants": [t.__dict__ for t in tenants],
                   "options": dict(options), "ranks": {k: list(v) for k, v in ranks}})


class FabricCache:
    """The live fabric of a round, rebuilt only when its inputs change: a DeviceFailure or a
    node going down re-applies failures to the cached base fabric, and only a FabricTopology
    or NodeFabric change rebuilds that base (and drops the sub-fabrics cut from it)."""

    def __init__(self) -> None:
        self.subs = Subfabrics()
        self.fingerprint = ""
        self._key: Any = None
        self._fabric: Fabric | None = None
        self._base: tuple[Any, BaseFabric] | None = None
        self._encoded_base = ""  # the FabricTopology and NodeFabrics, as the fingerprint reads

    def fabric(self, inputs: Inputs) -> tuple[Fabric | None, list[str]]:
        """The fabric, and notes on the FabricTopologies that are ignored."""
        if not inputs.fabrics:
            return None, []
        fabrics = sorted(inputs.fabrics, key=lambda f: f.name)
        spec = fabrics[0]
        notes = [f"FabricTopology {f.name} is ignored: only {spec.name} is used"
                 for f in fabrics[1:]]
        names = {n.name for n in fabric_nodes(spec)}
        down = sorted(n for n in names if n not in inputs.nodes or not inputs.nodes[n].ready)
        failures = sorted((f for f in inputs.failures if not f.spec.resolved),
                          key=lambda f: f.name)
        nfs = tuple(sorted(((k, v) for k, v in inputs.node_fabrics.items() if k in names),
                           key=lambda kv: kv[0]))
        problems = (*inputs.notes.get(spec.name, ()),
                    *(f"NodeFabric {i.key} is ignored (the node keeps its preset): {i.message}"
                      for i in inputs.invalid if i.kind == "NodeFabric"))
        key = (spec, nfs, problems, tuple(failures), tuple(down))
        if key != self._key:
            if self._base is None or key[:3] != self._base[0]:
                self._base = (key[:3], base_fabric(spec, dict(nfs), problems))
                self.subs.clear()
                # Encoding a FabricTopology of thousands of nodes took a tenth of a failure
                # round at 4,000 nodes: once per base.
                self._encoded_base = f"{encoded(spec)}, {encoded(nfs)}"
            self._fabric = apply_failures(self._base[1], failures, down)
            self._key = key
            # problems describe the inputs, not the fabric: they leave its fingerprint alone.
            # The digest of (spec, nfs, failures, down), with the first two encoded already.
            whole = f"[{self._encoded_base}, {encoded(key[3])}, {encoded(key[4])}]"
            self.fingerprint = hashlib.sha256(whole.encode()).hexdigest()[:16]
        return self._fabric, notes


def plan_groups(jobs: Sequence[CollectiveJob], placements: Mapping[str, Placement],
                fabric: Fabric, *, max_buckets: int, restarts: int, timeout_seconds: float,
                trims: Mapping[str, Mapping[str, Trim]] | None = None,
                subs: Subfabrics | None = None, packed: bool = False,
                ) -> tuple[list[GroupPlan], dict[str, Blocked]]:
    """The plan of every group of placed, connected tenants, and why each other job waits.

    ``trims``: per job and collective, the sizes still asked for (learned when smaller sizes'
    files did not fit a pod's ConfigMap); ``subs``: sub-fabrics cached from earlier rounds;
    ``packed``: schedules are published compressed, which the inputs hash covers, so a switch
    republishes every job in the new form (a plain hash is the same as before packing)."""
    subs = subs if subs is not None else Subfabrics()
    trims = trims or {}
    topo = fabric.topology
    blocked: dict[str, Blocked] = {}
    members: list[Member] = []
    ready: dict[str, CollectiveJob] = {}
    live: dict[str, list[RankSlot]] = {}
    for job in jobs:
        pl = placements[job.key]
        hard = [p for p in pl.problems if "not scheduled" not in p and "ordered by" not in p]
        if pl.pods == 0:
            blocked[job.key] = ("Pending", "NoPods", "no running pod matches the selector")
            continue
        if hard:
            blocked[job.key] = ("Pending", problem_reason(hard[0]), "; ".join(hard[:5]))
            continue
        slots = healthy_slots(pl, fabric)
        if len(slots) < 2:
            blocked[job.key] = ("Pending", "TooFewRanks",
                                f"{len(slots)} healthy GPU(s) placed; a collective needs 2")
            continue
        why = subs.disconnected(topo, pl.npus)
        if why:
            blocked[job.key] = ("Infeasible", "TenantDisconnected", why)
            continue
        ready[job.key] = job
        live[job.key] = slots
        spec = job.spec
        # Grouped by the GPUs placed, failed or not: the footprint of a failed GPU's tenant
        # holds it still (a superset, so no sharing is missed), and a failure regroups nobody.
        members.append(Member(job.key, pl.npus, spec.isolation == "Joint",
                              (spec.dialect, spec.instances, spec.protocol)))
    plans = []
    for group in subs.groups(topo, members):
        group_jobs = [ready[k] for k in group.members]
        # The cut keeps the members' failed GPUs too, as failed: a GPU's place among its
        # host's GPUs is its rail, which the hierarchical plan aligns hosts by.
        sub, ids = subs.get(topo, [s.npu for j in group_jobs for s in placements[j.key].slots],
                            name=f"{topo.name}-{group.scope}")
        tenants = [TenantRequest(j.key, tuple(ids[s.npu] for s in live[j.key]),
                                 j.spec.collectives, j.spec.weight, pod_part_ends(live[j.key]))
                   for j in group_jobs]
        first = group_jobs[0].spec
        # The portfolio where any member asks for it (they are solved jointly), within the
        # smallest budget asked.
        auto = [j.spec.engine_seconds for j in group_jobs if j.spec.engine == "Auto"]
        options = RequestOptions(first.dialect, first.instances, first.protocol, restarts,
                                 max_buckets, min(auto) if auto else timeout_seconds,
                                 any(j.spec.when_nccl_faster == SHIP_ANYWAY for j in group_jobs),
                                 engine="auto" if auto else "", codec="zstd")
        fingerprint = sub.fingerprint()
        ranks = tuple((j.key, tuple((s.pod, s.node, s.gpu) for s in live[j.key]))
                      for j in group_jobs)
        # Every round asks every group's hash; encoding hundreds of ranks (and the
        # collectives' reprs) for each was a third of a round at 4,000 nodes, 160 tenants.
        key = (fingerprint, tuple(tenants),
               tuple((f, getattr(options, f)) for f in HASHED_OPTIONS)
               + ((("packed", True),) if packed else ())
               + ((("engine", "auto"),) if auto else ()), ranks)
        hashed = subs.hashed(key, functools.partial(inputs_hash, *key))
        # Trims follow from the files of these inputs: the hash leaves them out, so learning
        # one does not make the schedule just published look out of date.
        tenants = [replace(t, collectives=_asked(j.spec.collectives, trims.get(j.key, {})))
                   for t, j in zip(tenants, group_jobs, strict=True)]
        plan = GroupPlan(group, group_jobs, {k: placements[k] for k in group.members},
                         {k: live[k] for k in group.members}, tenants, sub, hashed,
                         fingerprint, options)
        if len(group_jobs) > 1:
            # What each tenant gets alone, should the synthesizer refuse the joint request.
            for j, t in zip(group_jobs, tenants, strict=True):
                placed = [s.npu for s in placements[j.key].slots]
                alone, own_ids = subs.get(topo, placed, name=f"{topo.name}-{group.scope}-1")
                plan.singles.append((alone, TenantRequest(
                    t.name, tuple(own_ids[s.npu] for s in live[j.key]), t.collectives,
                    t.weight)))
        plans.append(plan)
    return plans, blocked


def _asked(specs: Sequence[CollectiveSpec], trims: Mapping[str, Trim],
          ) -> tuple[CollectiveLike, ...]:
    """The collectives as asked: of each one whose smaller sizes' files did not fit a pod's
    ConfigMap, only the sizes kept, in as many size buckets as were kept (until its spec
    changes)."""
    asked: list[CollectiveLike] = []
    for c in specs:
        trim = trims.get(c.name)
        asked.append(c if trim is None or trim.spec != c else CollectiveRequest(
            c.collective, trim.floor, c.max_bytes, c.root, c.chunks, trim.buckets))
    return tuple(asked)


def problem_reason(problem: str) -> str:
    if "not in the FabricTopology" in problem:
        return "UnknownNode"
    if "has no GPU" in problem:
        return "UnknownGPU"
    if "no FabricTopology" in problem:
        return "NoFabric"
    if "also claimed" in problem:
        return "GPUConflict"
    return "PlacementProblem"
