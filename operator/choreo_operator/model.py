"""Compact, immutable views of the Kubernetes objects the operator reads.

The kopf indexes store these instead of whole bodies: a 1000-node cluster's Nodes and Pods
would otherwise keep every managed field in memory, and frozen values make "did anything
that matters change?" a plain equality test.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from choreo.generators import NDR_NIC_BANDWIDTH

GROUP = "choreo.dev"
VERSION = "v1alpha1"
GPU_RESOURCE = "nvidia.com/gpu"
GPUS_ANNOTATION = "choreo.dev/gpus"
DEFAULT_RANK_LABEL = "batch.kubernetes.io/job-completion-index"

Body = Mapping[str, Any]


@dataclass(frozen=True)
class FabricSource:
    """``spec.source`` of a FabricTopology: where its nodes and blocks come from.

    ``kind`` is ``topograph``, ``kueue`` or ``volcano``; ``topology`` names the Kueue
    Topology; ``block_label`` is the Topograph label that names a node's leaf switch.
    """

    kind: str
    topology: str = ""
    node_selector: Selector | None = None
    block_label: str = ""


@dataclass(frozen=True, repr=False)
class FabricSpec:
    """A FabricTopology: node positions, the node model and the inter-node fabric.

    ``blocks`` maps nodes to their block (leaf switch group), sorted by node; nodes not
    listed are in no block. A spec with a ``source`` lists no nodes until
    ``sources.resolve`` fills them in; ``notes`` are that resolution's problems.
    """

    name: str
    generation: int
    nodes: tuple[tuple[str, int], ...]
    preset: str = "dgx-h100"
    gpus: int = 8
    intra_bandwidth: float | None = None
    intra_alpha: float | None = None
    inter_type: str = "none"
    rails: int | None = None
    dims: tuple[int, ...] = ()
    inter_bandwidth: float = NDR_NIC_BANDWIDTH
    inter_alpha: float = 1.7e-6
    blocks: tuple[tuple[str, str], ...] = ()
    spine_oversubscription: float = 1.0
    source: FabricSource | None = None
    notes: tuple[str, ...] = ()

    def __repr__(self) -> str:
        # The fields after inter_alpha appear only when set, so a spec without blocks or a
        # source prints (and so hashes into the operator's status fingerprint) as before.
        # Notes never do: they describe the input, the fabric is the same with or without.
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "notes" or (f.name in _LATER_FIELDS and value == f.default):
                continue
            parts.append(f"{f.name}={value!r}")
        return f"FabricSpec({', '.join(parts)})"


_LATER_FIELDS = frozenset({"blocks", "spine_oversubscription", "source", "notes"})


@dataclass(frozen=True)
class GpuInfo:
    index: int
    healthy: bool = True


@dataclass(frozen=True)
class LinkInfo:
    src: int
    dst_gpu: int | None
    dst_switch: str | None
    dst_nic: str | None
    kind: str
    count: int
    alpha: float
    bandwidth: float
    healthy: bool = True


@dataclass(frozen=True)
class NicInfo:
    name: str
    rail: int | None
    bandwidth: float | None
    nearest_gpu: int | None
    healthy: bool = True


@dataclass(frozen=True)
class NodeFabricSpec:
    """One node's measured fabric, as its agent wrote it."""

    node: str
    gpus: tuple[GpuInfo, ...]
    links: tuple[LinkInfo, ...] = ()
    nics: tuple[NicInfo, ...] = ()


@dataclass(frozen=True)
class DeviceFailureSpec:
    name: str
    node: str
    type: str
    gpu: int | None = None
    peer_gpu: int | None = None
    nic: str | None = None
    switch: str | None = None  # a link from ``gpu`` to this switch of the node
    resolved: bool = False
    reason: str = ""


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
    labels: Selector | None = None


@dataclass(frozen=True)
class HyperNode:
    """A Volcano HyperNode (topology.volcano.sh): tier (1 = lowest; None if unreadable)."""

    name: str
    tier: int | None
    members: tuple[HyperNodeMember, ...]


@dataclass(frozen=True)
class CollectiveSpec:
    name: str
    collective: str
    min_bytes: int
    max_bytes: int
    chunks: int | None = None
    root: int = 0


@dataclass(frozen=True)
class Selector:
    """A label selector; ``expressions`` are (key, operator, values)."""

    labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if not self.labels and not self.expressions:
            return False  # an empty selector would claim every pod of the namespace
        for key, value in self.labels:
            if labels.get(key) != value:
                return False
        for key, op, values in self.expressions:
            present = key in labels
            if op == "In" and not (present and labels[key] in values):
                return False
            if op == "NotIn" and present and labels[key] in values:
                return False
            if op == "Exists" and not present:
                return False
            if op == "DoesNotExist" and present:
                return False
        return True


SHIP_ANYWAY = "ShipSchedule"  # spec.whenNcclFaster: ship files NCCL is predicted to beat


@dataclass(frozen=True)
class JobSpec:
    """A CollectiveJob's spec plus the status fields the operator resumes from."""

    namespace: str
    name: str
    uid: str
    generation: int
    selector: Selector
    collectives: tuple[CollectiveSpec, ...]
    rank_label: str = DEFAULT_RANK_LABEL
    gpus_per_pod: int | None = None
    weight: float = 1.0
    isolation: str = "Joint"
    dialect: str = "executor"
    instances: int = 1
    protocol: str = "Simple"
    when_nccl_faster: str = "RunNccl"  # or ShipSchedule
    config_map: str | None = None
    parts: tuple[tuple[str, int, int, int], ...] = ()  # name, first, last rank, pod rank
    files: tuple[str, ...] = ()
    inputs_hash: str | None = None
    deleting: bool = False
    conditions: tuple[tuple[tuple[str, str], ...], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def condition_list(self) -> list[dict[str, Any]]:
        out = []
        for c in self.conditions:
            d: dict[str, Any] = dict(c)
            if "observedGeneration" in d:
                d["observedGeneration"] = int(d["observedGeneration"])
            out.append(d)
        return out


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


# ---- parsing ---------------------------------------------------------------------------------


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


TOPOGRAPH_BLOCK = "network.topology.nvidia.com/block"


def fabric_source(doc: Body | None) -> FabricSource | None:
    """``spec.source``: the first of topograph, kueue, volcano it sets (the CRD allows one)."""
    if not doc:
        return None
    selector: Selector | None = _selector(doc.get("nodeSelector") or {})
    if selector is not None and not selector.labels and not selector.expressions:
        selector = None  # no nodeSelector: every node the source names
    if doc.get("topograph") is not None:
        topograph = doc.get("topograph") or {}
        return FabricSource("topograph", node_selector=selector,
                            block_label=str(topograph.get("blockLabel") or TOPOGRAPH_BLOCK))
    if doc.get("kueue") is not None:
        return FabricSource("kueue", topology=str((doc.get("kueue") or {}).get("topology", "")),
                            node_selector=selector)
    if doc.get("volcano") is not None:
        return FabricSource("volcano", node_selector=selector)
    return None


def fabric_spec(body: Body) -> FabricSpec:
    spec = body.get("spec") or {}
    intra = spec.get("intraNode") or {}
    inter = spec.get("interNode") or {}
    nodes = tuple(sorted(((str(n["name"]), int(n["position"])) for n in spec.get("nodes") or []),
                         key=lambda x: (x[1], x[0])))
    blocks = tuple(sorted((str(n["name"]), str(n["block"])) for n in spec.get("nodes") or []
                          if n.get("block")))
    return FabricSpec(
        name=body["metadata"]["name"],
        generation=int(body["metadata"].get("generation") or 0),
        nodes=nodes,
        preset=str(intra.get("preset", "dgx-h100")),
        gpus=int(intra.get("gpus", 8)),
        intra_bandwidth=_opt_float(intra.get("bandwidthBytesPerSecond")),
        intra_alpha=_opt_float(intra.get("alphaSeconds")),
        inter_type=str(inter.get("type", "none")),
        rails=_opt_int(inter.get("rails")),
        dims=tuple(int(d) for d in inter.get("dims") or ()),
        inter_bandwidth=float(inter.get("bandwidthBytesPerSecond", NDR_NIC_BANDWIDTH)),
        inter_alpha=float(inter.get("alphaSeconds", 1.7e-6)),
        blocks=blocks,
        spine_oversubscription=float(inter.get("spineOversubscription", 1.0)),
        source=fabric_source(spec.get("source")),
    )


def node_fabric_spec(body: Body) -> NodeFabricSpec:
    spec = body.get("spec") or {}
    gpus = tuple(sorted((GpuInfo(int(g["index"]), bool(g.get("healthy", True)))
                         for g in spec.get("gpus") or []), key=lambda g: g.index))
    links = tuple(
        LinkInfo(src=int(lk["src"]), dst_gpu=_opt_int(lk.get("dstGPU")),
                 dst_switch=lk.get("dstSwitch"), dst_nic=lk.get("dstNIC"),
                 kind=str(lk.get("kind", "generic")), count=int(lk.get("count", 1)),
                 alpha=float(lk.get("alphaSeconds", 0.0)),
                 bandwidth=float(lk["bandwidthBytesPerSecond"]),
                 healthy=bool(lk.get("healthy", True)))
        for lk in spec.get("links") or [])
    nics = tuple(
        NicInfo(name=str(n["name"]), rail=_opt_int(n.get("rail")),
                bandwidth=_opt_float(n.get("bandwidthBytesPerSecond")),
                nearest_gpu=_opt_int(n.get("nearestGPU")), healthy=bool(n.get("healthy", True)))
        for n in spec.get("nics") or [])
    return NodeFabricSpec(str(spec.get("nodeName", "")), gpus, links, nics)


def device_failure_spec(body: Body) -> DeviceFailureSpec:
    spec = body.get("spec") or {}
    device = spec.get("device") or {}
    return DeviceFailureSpec(
        name=body["metadata"]["name"], node=str(spec.get("node", "")),
        type=str(device.get("type", "gpu")), gpu=_opt_int(device.get("gpu")),
        peer_gpu=_opt_int(device.get("peerGPU")), nic=device.get("nic"),
        switch=device.get("switch"),
        resolved=bool(spec.get("resolved", False)), reason=str(spec.get("reason", "")))


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
            labels=None if labels is None else _selector(labels)))
    return HyperNode(str(body["metadata"]["name"]), tier, tuple(members))


def _selector(doc: Body) -> Selector:
    labels = tuple(sorted((str(k), str(v)) for k, v in (doc.get("matchLabels") or {}).items()))
    exprs = tuple((str(e["key"]), str(e["operator"]), tuple(str(v) for v in e.get("values") or ()))
                  for e in doc.get("matchExpressions") or [])
    return Selector(labels, exprs)


def job_spec(body: Body) -> JobSpec:
    meta = body["metadata"]
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    colls = tuple(
        CollectiveSpec(str(c["name"]), str(c["collective"]), int(c["minBytes"]),
                       int(c["maxBytes"]), _opt_int(c.get("chunks")), int(c.get("root", 0)))
        for c in spec.get("collectives") or [])
    parts = tuple((str(p["name"]), int(p["firstRank"]), int(p["lastRank"]),
                   int(p.get("podRank", -1)))
                  for p in status.get("configMapParts") or [])
    return JobSpec(
        namespace=meta["namespace"], name=meta["name"], uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
        selector=_selector(spec.get("selector") or {}), collectives=colls,
        rank_label=str(spec.get("rankLabel", DEFAULT_RANK_LABEL)),
        gpus_per_pod=_opt_int(spec.get("gpusPerPod")), weight=float(spec.get("weight", 1.0)),
        isolation=str(spec.get("isolation", "Joint")),
        dialect=str(spec.get("dialect", "executor")), instances=int(spec.get("instances", 1)),
        protocol=str(spec.get("protocol", "Simple")),
        when_nccl_faster=str(spec.get("whenNcclFaster", "RunNccl")),
        config_map=status.get("configMap"),
        parts=parts, files=tuple(status.get("files") or ()),
        inputs_hash=(status.get("lastSynthesis") or {}).get("inputsHash"),
        deleting=bool(meta.get("deletionTimestamp")),
        conditions=tuple(tuple(sorted((str(k), str(v)) for k, v in c.items()))
                         for c in status.get("conditions") or []))


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
