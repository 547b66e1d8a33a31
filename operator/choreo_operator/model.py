"""Compact, immutable views of the Kubernetes objects the operator reads.

The kopf indexes store these instead of whole bodies: a 1000-node cluster's Nodes and Pods
would otherwise keep every managed field in memory, and frozen values make "did anything
that matters change?" a plain equality test. choreo's own kinds are the API models of
``choreo_api`` (``read``); Nodes, Pods, Kueue Topologies and Volcano HyperNodes get small
views of the fields used here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from choreo_api import (
    DEFAULT_RANK_LABEL,
    CollectiveJob,
    CollectiveJobStatus,
    DeviceFailure,
    FabricTopology,
    LabelSelector,
    NodeFabric,
    NodeFabricSpec,
    Object,
    ValidationError,
    problem,
)
from choreo_api import CollectiveSpec as CollectiveSpec  # the synthesizer client's import

GPU_RESOURCE = "nvidia.com/gpu"
GPUS_ANNOTATION = "choreo.dev/gpus"
SHIP_ANYWAY = "ShipSchedule"  # spec.whenNcclFaster: ship files NCCL is predicted to beat

Body = Mapping[str, Any]


@dataclass(frozen=True)
class Invalid:
    """An object of choreo's kinds that does not fit its model: reported in its status (or,
    for a NodeFabric, in the FabricTopology's) instead of being used."""

    kind: str
    name: str
    message: str
    namespace: str | None = None
    uid: str = ""
    generation: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


T = TypeVar("T", bound=Object)

_METADATA: dict[type[Object], tuple[str, ...]] = {
    FabricTopology: ("name", "generation"),
    NodeFabric: ("name", "namespace"),
    DeviceFailure: ("name",),
    CollectiveJob: ("name", "namespace", "uid", "generation", "deletionTimestamp"),
}


def read(kind: type[T], body: Body) -> T | Invalid:
    """``body`` as ``kind``, or Invalid naming the field that does not fit.

    Only the metadata the operator uses is kept, and no status (a CollectiveJob's is read
    by ``job``), so the operator's own status writes and new resource versions leave the
    value equal and wake nothing."""
    meta = body.get("metadata") or {}
    doc: dict[str, Any] = {"metadata": {k: meta[k] for k in _METADATA[kind] if k in meta}}
    if "spec" in body:
        doc["spec"] = body["spec"]
    try:
        return kind.model_validate(doc)
    except ValidationError as err:
        return Invalid(kind.__name__, str(meta.get("name", "")), problem(err),
                       meta.get("namespace"), str(meta.get("uid", "")),
                       int(meta.get("generation") or 0))


def fabric_topology(body: Body) -> FabricTopology | Invalid:
    """A FabricTopology with its nodes in fabric order (position, then name)."""
    ft = read(FabricTopology, body)
    if isinstance(ft, Invalid) or ft.spec.nodes is None:
        return ft
    nodes = tuple(sorted(ft.spec.nodes, key=lambda n: (n.position, n.name)))
    return ft.model_copy(update={"spec": ft.spec.model_copy(update={"nodes": nodes})})


def node_fabric(body: Body) -> NodeFabricSpec | Invalid:
    nf = read(NodeFabric, body)
    return nf if isinstance(nf, Invalid) else nf.spec


def device_failure(body: Body) -> DeviceFailure | Invalid:
    return read(DeviceFailure, body)


def job(body: Body) -> CollectiveJob | Invalid:
    """A CollectiveJob with the status it resumes from (a status that does not fit is
    dropped: the operator writes a new one)."""
    cj = read(CollectiveJob, body)
    if isinstance(cj, Invalid) or not body.get("status"):
        return cj
    try:
        status = CollectiveJobStatus.model_validate(body["status"])
    except ValidationError:
        return cj
    return cj.model_copy(update={"status": status})


def resumed(job: CollectiveJob) -> CollectiveJobStatus:
    """The status a job was read with: what the operator resumes from after a restart and
    what the webhook mounts."""
    return job.status or CollectiveJobStatus()


@dataclass(frozen=True)
class NodeInfo:
    """A Node: readiness, GPU capacity and its labels (sorted pairs; ``node_info`` shares
    one pair object between the nodes that carry it, so 1000 nodes with the same zone,
    GPU product or block label hold pointers, not copies)."""

    name: str
    ready: bool
    gpus: int
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)


@dataclass(frozen=True)
class KueueTopology:
    """A Kueue Topology (kueue.x-k8s.io): its level labels, highest level first."""

    name: str
    levels: tuple[str, ...]


@dataclass(frozen=True)
class HyperNodeMember:
    """One ``spec.members[]`` entry of a Volcano HyperNode; one of the three selectors."""

    type: str
    exact: str | None = None
    regex: str | None = None
    labels: LabelSelector | None = None


@dataclass(frozen=True)
class HyperNode:
    """A Volcano HyperNode (topology.volcano.sh): tier (1 = lowest; None if unreadable)."""

    name: str
    tier: int | None
    members: tuple[HyperNodeMember, ...]


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    labels: tuple[tuple[str, str], ...]
    node: str | None
    gpus: int
    gpu_annotation: str | None
    rank_values: tuple[tuple[str, str], ...]
    config_maps: tuple[str, ...]
    active: bool

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    def rank(self, rank_label: str) -> int | None:
        """The pod's rank from a label or annotation; None if absent or not an integer."""
        value = dict(self.rank_values).get(rank_label)
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None


_PAIRS: dict[tuple[str, str], tuple[str, str]] = {}
_MAX_PAIRS = 200_000  # distinct label pairs shared before the table starts over


def _shared(pair: tuple[str, str]) -> tuple[str, str]:
    """One object per distinct label pair across every NodeInfo."""
    found = _PAIRS.get(pair)
    if found is None:
        if len(_PAIRS) >= _MAX_PAIRS:
            _PAIRS.clear()
        found = _PAIRS[pair] = pair
    return found


def node_info(body: Body) -> NodeInfo:
    """Readiness, GPU capacity and every label: a FabricTopology source's nodeSelector, a
    Kueue level or a Volcano labelMatch may name any label, so none can be left out."""
    conditions = (body.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    capacity = (body.get("status") or {}).get("capacity") or {}
    try:
        gpus = int(capacity.get(GPU_RESOURCE, 0))
    except ValueError:
        gpus = 0
    labels = (body["metadata"].get("labels") or {}).items()
    return NodeInfo(body["metadata"]["name"], ready, gpus,
                    tuple(sorted(_shared((str(k), str(v))) for k, v in labels)))


def kueue_topology(body: Body) -> KueueTopology:
    levels = (body.get("spec") or {}).get("levels") or []
    return KueueTopology(str(body["metadata"]["name"]),
                         tuple(str(lv.get("nodeLabel", "")) for lv in levels))


def hyper_node(body: Body) -> HyperNode:
    spec = body.get("spec") or {}
    try:
        tier: int | None = int(spec.get("tier", ""))
    except (TypeError, ValueError):
        tier = None
    members = []
    for m in spec.get("members") or []:
        sel = m.get("selector") or {}
        exact, regex, labels = sel.get("exactMatch"), sel.get("regexMatch"), sel.get("labelMatch")
        members.append(HyperNodeMember(
            type=str(m.get("type", "")),
            exact=None if exact is None else str(exact.get("name", "")),
            regex=None if regex is None else str(regex.get("pattern", "")),
            labels=None if labels is None else _label_selector(labels)))
    return HyperNode(str(body["metadata"]["name"]), tier, tuple(members))


def _label_selector(doc: Any) -> LabelSelector | None:
    """A HyperNode's labelMatch; None (a member without a usable selector) if malformed."""
    try:
        return LabelSelector.model_validate(doc)
    except ValidationError:
        return None


def _gpu_request(container: Body) -> int:
    resources = container.get("resources") or {}
    for part in ("limits", "requests"):
        value = (resources.get(part) or {}).get(GPU_RESOURCE)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def pod_info(body: Body, rank_keys: frozenset[str] = frozenset({DEFAULT_RANK_LABEL})) -> PodInfo:
    meta = body["metadata"]
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    ranks = {k: v for k, v in {**annotations, **labels}.items()
             if k in rank_keys or "index" in k or "rank" in k}
    gpus = sum(_gpu_request(c) for c in spec.get("containers") or [])
    cms = tuple(sorted(v["configMap"]["name"] for v in spec.get("volumes") or []
                       if (v.get("configMap") or {}).get("name")))
    active = status.get("phase") not in ("Succeeded", "Failed") and not meta.get(
        "deletionTimestamp")
    return PodInfo(
        namespace=meta.get("namespace", ""), name=meta.get("name", ""), uid=meta.get("uid", ""),
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        node=spec.get("nodeName"), gpus=gpus, gpu_annotation=annotations.get(GPUS_ANNOTATION),
        rank_values=tuple(sorted((str(k), str(v)) for k, v in ranks.items())),
        config_maps=cms, active=bool(active))
