"""Which GPUs each CollectiveJob's pods hold, in rank order.

GPU assignment per pod, in this order of precedence:
1. the annotation ``choreo.dev/gpus: "0,1,2,3"`` (what a device plugin or the agent wrote);
2. a pod requesting as many GPUs as its node has gets all of them;
3. otherwise pods are packed onto the node's free GPUs in (namespace, job, rank) order.
Pods requesting no GPU (an MPIJob launcher, say) hold no rank, unless the job sets gpusPerPod.
Ranks: pods in order of their rank label (or annotation); a pod's GPUs take consecutive ranks
in GPU-index order. Problems (unknown nodes or GPUs, missing ranks, double-booked GPUs) are
returned as messages, never raised.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from choreo_api import CollectiveJob, CollectiveJobSpec
from choreo_operator.fabric import Fabric
from choreo_operator.model import PodInfo


@dataclass(frozen=True)
class RankSlot:
    pod: str
    node: str
    gpu: int
    npu: int  # fabric id


def pod_part_ends(slots: Sequence[RankSlot]) -> tuple[int, ...]:
    """Where each pod's run of ranks ends (exclusive): how a large file is cut per pod, so
    the synthesizer compresses each pod's ranks together."""
    return tuple(r + 1 for r, s in enumerate(slots)
                 if r + 1 == len(slots) or slots[r + 1].pod != s.pod)


@dataclass
class Placement:
    slots: list[RankSlot] = field(default_factory=list)
    pod_ranks: dict[str, tuple[int, int]] = field(default_factory=dict)  # pod -> first, last
    pod_index: dict[str, int] = field(default_factory=dict)  # pod -> its rank label value
    problems: list[str] = field(default_factory=list)
    pods: int = 0

    @functools.cached_property
    def nodes(self) -> list[str]:
        return sorted({s.node for s in self.slots})

    @functools.cached_property
    def npus(self) -> tuple[int, ...]:
        """The GPUs placed (fabric ids), failed or not; asked for every round, made once
        (placements do not change after ``place``)."""
        return tuple(s.npu for s in self.slots)


_Entry = tuple[PodInfo, dict[str, str]]  # a pod and its label map


class PodIndex:
    """Active pods by namespace and by label, so each job's selector looks only at the pods
    that carry one of its labels rather than at every pod of the cluster."""

    def __init__(self, pods: Iterable[PodInfo]) -> None:
        self.by_ns: dict[str, list[_Entry]] = {}
        self.by_label: dict[tuple[str, str, str], list[_Entry]] = {}
        for p in pods:
            if not p.active:
                continue
            entry = (p, p.label_map)
            self.by_ns.setdefault(p.namespace, []).append(entry)
            for key, value in p.labels:
                self.by_label.setdefault((p.namespace, key, value), []).append(entry)

    def selected(self, job: CollectiveJob) -> list[PodInfo]:
        ns, sel = job.namespace, job.spec.selector
        pool = min((self.by_label.get((ns, k, v), []) for k, v in sel.match_labels or ()), key=len,
                   default=self.by_ns.get(ns, []))
        return [p for p, labels in pool if sel.matches(labels)]


def _parse_gpus(text: str) -> list[int] | None:
    try:
        return sorted({int(x) for x in text.replace(" ", "").split(",") if x})
    except ValueError:
        return None


def place(jobs: Iterable[CollectiveJob], pods: Iterable[PodInfo], fabric: Fabric | None,
          ) -> dict[str, Placement]:
    """Placement of every job (keyed ``namespace/name``)."""
    index = PodIndex(pods)
    out: dict[str, Placement] = {}
    wanted: list[tuple[CollectiveJob, PodInfo, int, int]] = []  # job, pod, rank, gpus
    for job in jobs:
        pl = Placement()
        out[job.key] = pl
        mine = index.selected(job)
        pl.pods = len(mine)
        ranked = []
        for i, pod in enumerate(sorted(mine, key=lambda p: p.name)):
            r = pod.rank(job.spec.rank_label)
            if r is None:
                pl.problems.append(f"pod {pod.name} has no integer {job.spec.rank_label}; "
                                   "ordered by name")
                r = 1_000_000 + i
            ranked.append((r, pod))
        for r, pod in sorted(ranked, key=lambda x: (x[0], x[1].name)):
            if pod.node is None:
                pl.problems.append(f"pod {pod.name} is not scheduled yet")
                continue
            gpus = job.spec.gpus_per_pod or pod.gpus
            if gpus < 1:
                continue  # a launcher or sidecar pod: it holds no rank
            wanted.append((job, pod, r, gpus))
    if fabric is None:
        for pl in out.values():
            if pl.pods:
                pl.problems.append("no FabricTopology exists")
        return out
    taken: dict[tuple[str, int], str] = {}
    chosen: dict[str, list[int]] = {}
    deferred = []
    for job, pod, r, gpus in wanted:
        node = str(pod.node)
        pl = out[job.key]
        if node not in fabric.node_gpus:
            pl.problems.append(f"pod {pod.name} runs on node {node}, which is not in the "
                               "FabricTopology")
            continue
        local = _local_gpus(fabric, node)
        explicit = _parse_gpus(pod.gpu_annotation) if pod.gpu_annotation else None
        if pod.gpu_annotation and explicit is None:
            pl.problems.append(f"pod {pod.name}: annotation choreo.dev/gpus "
                               f"{pod.gpu_annotation!r} is not a list of GPU indices")
            continue
        if explicit is None and gpus >= len(local):
            explicit = local
        if explicit is None:
            deferred.append((job, pod, r, gpus))
            continue
        unknown = [g for g in explicit if g not in local]
        if unknown:
            pl.problems.append(f"pod {pod.name}: node {node} has no GPU "
                               f"{', '.join(map(str, unknown))}")
            continue
        _claim(pl, pod, node, explicit, taken, chosen)
    for job, pod, _r, gpus in sorted(deferred, key=lambda x: (x[0].key, x[2], x[1].name)):
        node = str(pod.node)
        free = [g for g in _local_gpus(fabric, node) if (node, g) not in taken]
        pl = out[job.key]
        if len(free) < gpus:
            pl.problems.append(f"pod {pod.name}: node {node} has {len(free)} unassigned GPUs, "
                               f"it needs {gpus}")
            continue
        _claim(pl, pod, node, free[:gpus], taken, chosen)
    for job, pod, r, _g in wanted:
        pl = out[job.key]
        pl.pod_index[pod.name] = r
        gs = chosen.get(f"{pod.namespace}/{pod.name}")
        if gs is None:
            continue
        first = len(pl.slots)
        for g in gs:
            npu = fabric.gpu(str(pod.node), g)
            assert npu is not None
            pl.slots.append(RankSlot(pod.name, str(pod.node), g, npu))
        pl.pod_ranks[pod.name] = (first, len(pl.slots) - 1)
    return out


class Placer:
    """``place``, returning its last placements while the jobs' specs, the pods and the
    fabric's structure are equal. A failure or a node going down changes no placement (failed
    GPUs are dropped from the ranks later, ``healthy_slots``), nor does a job's status (which
    every publication writes), and placing every job again was the largest part of a failure
    round at 4,000 nodes and 160 tenants. Placements are read, never changed, after
    ``place``: rounds share them."""

    def __init__(self) -> None:
        self._last: tuple[tuple[tuple[str, CollectiveJobSpec], ...], tuple[PodInfo, ...],
                          Fabric, dict[str, Placement]] | None = None

    def place(self, jobs: Iterable[CollectiveJob], pods: Iterable[PodInfo],
              fabric: Fabric | None) -> dict[str, Placement]:
        jobs = tuple(jobs)
        specs, pods = tuple((j.key, j.spec) for j in jobs), tuple(pods)
        last = self._last
        if (fabric is not None and last is not None
                and last[2].gpu_ids is fabric.gpu_ids and last[2].node_gpus is fabric.node_gpus
                and last[2].topology.names is fabric.topology.names
                and last[0] == specs and last[1] == pods):
            return last[3]
        out = place(jobs, pods, fabric)
        self._last = None if fabric is None else (specs, pods, fabric, out)
        return out


def _local_gpus(fabric: Fabric, node: str) -> list[int]:
    names = fabric.topology.names
    return [int(names[v].rsplit("/gpu", 1)[1]) for v in fabric.node_gpus.get(node, ())]


def _claim(pl: Placement, pod: PodInfo, node: str, gpus: list[int],
           taken: dict[tuple[str, int], str], chosen: dict[str, list[int]]) -> None:
    clash = [g for g in gpus if (node, g) in taken]
    if clash:
        pl.problems.append(f"pod {pod.name}: GPU {clash[0]} of node {node} is also claimed by "
                           f"{taken[(node, clash[0])]}")
        return
    for g in gpus:
        taken[(node, g)] = f"{pod.namespace}/{pod.name}"
    chosen[f"{pod.namespace}/{pod.name}"] = gpus


def healthy_slots(pl: Placement, fabric: Fabric) -> list[RankSlot]:
    """The slots whose GPU is alive: the ranks a resynthesis schedules (the placement's own
    list when none failed, which is most of them in a round)."""
    failed = fabric.topology.failed
    if failed.isdisjoint(pl.npus):
        return pl.slots
    return [s for s in pl.slots if s.npu not in failed]


def by_node(slots: Iterable[RankSlot]) -> Mapping[str, list[RankSlot]]:
    out: dict[str, list[RankSlot]] = {}
    for s in slots:
        out.setdefault(s.node, []).append(s)
    return out
