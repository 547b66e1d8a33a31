"""The ``choreo.dev/v1alpha1`` API: the four CRDs of ``crds/`` as pydantic models.

The node agent writes NodeFabric and DeviceFailure objects with these types and the operator
reads every kind with them, so both sides spell each field the one way the CRDs do (the
camelCase names are the aliases) and name a failed GPU, NIC or link with one ``Device``.
The models check what the schemas and CEL rules check, so an object that slipped past them
(an older CRD, a hand-made body) is refused with ``problem``'s one line naming the field, as
the API server would word it, instead of failing somewhere later. Models are frozen and use
tuples for lists: the operator's indexes compare and hash them. ``tests/unit/test_api.py``
holds them to ``crds/*.yaml``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

GROUP = "choreo.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
NODE_LABEL = f"{GROUP}/node"
"""Label on an agent's NodeFabric and DeviceFailures: the node they describe."""
DEFAULT_RANK_LABEL = "batch.kubernetes.io/job-completion-index"
TOPOGRAPH_BLOCK = "network.topology.nvidia.com/block"
DEFAULT_INTER_BANDWIDTH = 46e9
DEFAULT_INTER_ALPHA = 1.7e-6


class Model(BaseModel):
    """Frozen, camelCase on the wire, fields without a value left out of documents.

    Unknown keys are ignored when reading (the API server prunes them anyway), so a newer
    CRD does not make an older reader refuse objects."""

    model_config = ConfigDict(
        frozen=True, extra="ignore", alias_generator=to_camel, validate_by_name=True,
        validate_by_alias=True, serialize_by_alias=True, allow_inf_nan=False,
    )  # fmt: skip

    def model_post_init(self, context: Any, /) -> None:
        # Each instance's own set of the fields it was given would be half its memory (35 MiB
        # for a 1000-node cluster's NodeFabrics in the operator's index). A frozen model never
        # changes it and pydantic copies it before a model_copy updates it: share one per
        # combination of fields.
        given = self.__pydantic_fields_set__
        object.__setattr__(self, "__pydantic_fields_set__",
                           _FIELDS_SET.setdefault(frozenset(given), given))

    def dump(self) -> dict[str, Any]:
        """The JSON document the API server stores."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


_FIELDS_SET: dict[frozenset[str], set[str]] = {}


def problem(err: ValidationError) -> str:
    """The first error of ``err`` as one line naming the field (``spec.device.gpu: ...``)."""
    errors = err.errors(include_url=False)
    # a list whose item failed is also "too short" by the items that passed: not news
    inner = [e["loc"] for e in errors]
    errors = [e for e in errors if not (e["type"] == "too_short" and any(
        loc[: len(e["loc"])] == e["loc"] and len(loc) > len(e["loc"]) for loc in inner))]
    first = errors[0]
    at = ""
    for part in first["loc"]:
        at += f"[{part}]" if isinstance(part, int) else (f".{part}" if at else str(part))
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] not in ("missing", "value_error") and not isinstance(
        first.get("input"), dict | list
    ):
        message += f", got {first.get('input')!r}"
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return f"{at + ': ' if at else ''}{message}{more}"


def _pairs(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted(value.items(), key=lambda kv: str(kv[0])))
    return value


StrMap = Annotated[
    tuple[tuple[str, str], ...],
    BeforeValidator(_pairs),
    PlainSerializer(dict, return_type=dict[str, str]),
    WithJsonSchema({"type": "object", "additionalProperties": {"type": "string"}}),
]
"""A string map (labels, matchLabels), held as sorted pairs so that models stay hashable."""

GpuIndex = Annotated[int, Field(ge=0, le=63)]
Short = Annotated[str, Field(max_length=63)]
ObjectName = Annotated[str, Field(min_length=1, max_length=253)]


# ---- shared parts ----------------------------------------------------------------------------


class OwnerReference(Model):
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(Model):
    """The parts of Kubernetes object metadata choreo reads or writes."""

    name: str
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    labels: StrMap | None = None
    owner_references: tuple[OwnerReference, ...] | None = None
    deletion_timestamp: str | None = None


class Condition(Model):
    type: str = Field(max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = Field(max_length=32768)
    observed_generation: int | None = Field(None, ge=0)
    last_transition_time: str


Conditions = tuple[Condition, ...]


class Object(Model):
    """An object of one of the kinds; each kind fixes ``kind`` and adds spec and status."""

    api_version: Literal["choreo.dev/v1alpha1"] = "choreo.dev/v1alpha1"
    kind: str
    metadata: ObjectMeta

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        """The namespace, "" for a cluster-scoped object."""
        return self.metadata.namespace or ""

    @property
    def key(self) -> str:
        """``namespace/name``, or the name of a cluster-scoped object."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


class SelectorRequirement(Model):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] | None = None


class LabelSelector(Model):
    match_labels: StrMap | None = None
    match_expressions: tuple[SelectorRequirement, ...] | None = None

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Kubernetes' semantics, except that an empty selector matches nothing: it would
        claim every pod of a namespace."""
        if self.empty:
            return False
        if any(labels.get(k) != v for k, v in self.match_labels or ()):
            return False
        for req in self.match_expressions or ():
            present = req.key in labels
            inside = present and labels[req.key] in (req.values or ())
            if (
                (req.operator == "In" and not inside)
                or (req.operator == "NotIn" and inside)
                or (req.operator == "Exists" and not present)
                or (req.operator == "DoesNotExist" and present)
            ):
                return False
        return True


# ---- devices ---------------------------------------------------------------------------------

DeviceType = Literal["gpu", "link", "nic"]


class Device(Model):
    """What can fail on a node: GPU ``gpu``, NIC ``nic``, or the link from GPU ``gpu`` to GPU
    ``peerGPU``, to the node's switch ``switch`` or to NIC ``nic``. A GPU pair is one device
    whichever end reports it: ``link`` puts the lower index first. (``spec.device`` of a
    DeviceFailure; a NodeFabric link names its far end with ``dstGPU``/``dstSwitch``/``dstNIC``,
    and ``NodeLink.device`` is its Device.)"""

    type: DeviceType
    gpu: GpuIndex | None = None
    peer_gpu: GpuIndex | None = Field(None, alias="peerGPU")
    nic: Short | None = None
    switch: Short | None = None

    @model_validator(mode="after")
    def _rules(self) -> Self:
        if self.type == "gpu" and self.gpu is None:
            raise ValueError("a gpu failure names its gpu index")
        if self.type == "link" and (
            self.gpu is None or (self.peer_gpu is None and self.nic is None and self.switch is None)
        ):
            raise ValueError("a link failure names gpu and its peer (peerGPU, switch or nic)")
        if self.type == "nic" and self.nic is None:
            raise ValueError("a nic failure names the nic")
        if self.peer_gpu is not None and self.gpu is not None and self.peer_gpu == self.gpu:
            raise ValueError("a link joins two different GPUs")
        return self

    @classmethod
    def of_gpu(cls, index: int) -> Device:
        return cls(type="gpu", gpu=index)

    @classmethod
    def of_nic(cls, name: str) -> Device:
        return cls(type="nic", nic=name)

    @classmethod
    def link(
        cls, src: int, *, gpu: int | None = None, switch: str | None = None, nic: str | None = None
    ) -> Device:
        """The link from GPU ``src`` to exactly one of GPU ``gpu``, ``switch`` or ``nic``."""
        if sum(x is not None for x in (gpu, switch, nic)) != 1:
            raise ValueError("a link goes to exactly one of gpu, switch, nic")
        if gpu is not None and gpu < src:
            src, gpu = gpu, src
        return cls(type="link", gpu=src, peer_gpu=gpu, switch=switch, nic=nic)

    def label(self) -> str:
        """Short text for logs, metrics and object names: ``gpu3``, ``nic-mlx5_0``,
        ``link-1-5``, ``link-2-sw-nvswitch``."""
        if self.type == "gpu":
            return f"gpu{self.gpu}"
        if self.type == "nic":
            return f"nic-{self.nic}"
        far = self.peer_gpu if self.peer_gpu is not None else (self.switch or self.nic)
        return f"link-{self.gpu}-{far}"

    def _order(self) -> tuple[str, int, int, str, str]:
        return (self.type, -1 if self.gpu is None else self.gpu,
                -1 if self.peer_gpu is None else self.peer_gpu, self.switch or "",
                self.nic or "")  # fmt: skip

    def __lt__(self, other: Device) -> bool:
        return self._order() < other._order()


# ---- NodeFabric ------------------------------------------------------------------------------

LinkKind = Literal["nvlink", "nvswitch", "pcie", "xgmi", "ib", "roce", "ethernet", "optical",
                   "generic"]  # fmt: skip


class NodeGpu(Model):
    index: GpuIndex
    uuid: str | None = Field(None, max_length=128)
    pci_bus_id: str | None = Field(None, max_length=64)
    model: str | None = Field(None, max_length=128)
    healthy: bool = True


class LinkFit(Model):
    """The least-squares fit t = alpha + beta * n the values come from."""

    samples: int | None = Field(None, ge=0)
    residual_seconds: float | None = Field(None, ge=0)
    relative_error: float | None = Field(None, ge=0)


class NodeLink(Model):
    """A directed link out of GPU ``src``; ``bandwidth`` is per physical link of ``count``."""

    src: int = Field(ge=0)
    dst_gpu: int | None = Field(None, ge=0, alias="dstGPU")
    dst_switch: Short | None = Field(None, alias="dstSwitch")
    dst_nic: Short | None = Field(None, alias="dstNIC")
    kind: LinkKind
    count: int = Field(1, ge=1)
    alpha: float | None = Field(None, ge=0, alias="alphaSeconds")
    bandwidth: float = Field(gt=0, alias="bandwidthBytesPerSecond")
    healthy: bool = True
    fit: LinkFit | None = None

    @model_validator(mode="after")
    def _one_end(self) -> Self:
        if sum(x is not None for x in (self.dst_gpu, self.dst_switch, self.dst_nic)) != 1:
            raise ValueError("exactly one of dstGPU, dstSwitch, dstNIC")
        return self

    @property
    def device(self) -> Device:
        return Device.link(self.src, gpu=self.dst_gpu, switch=self.dst_switch, nic=self.dst_nic)


class NodeNic(Model):
    name: Short
    rail: int | None = Field(None, ge=0)
    bandwidth: float | None = Field(None, gt=0, alias="bandwidthBytesPerSecond")
    nearest_gpu: int | None = Field(None, ge=0, alias="nearestGPU")
    healthy: bool = True


class NodeFabricSpec(Model):
    """One GPU node's intra-node fabric, measured and written by the node's agent."""

    node_name: ObjectName
    backend: Literal["nvml", "sim"] | None = None
    gpus: tuple[NodeGpu, ...] = Field(min_length=1, max_length=64)
    links: tuple[NodeLink, ...] = Field((), max_length=4096)
    nics: tuple[NodeNic, ...] = Field((), max_length=64)

    @model_validator(mode="after")
    def _local_gpus(self) -> Self:
        if any(lk.src >= len(self.gpus) for lk in self.links):
            raise ValueError("a link's src must be a GPU index of this node")
        if any(lk.dst_gpu is not None and lk.dst_gpu >= len(self.gpus) for lk in self.links):
            raise ValueError("a link's dstGPU must be a GPU index of this node")
        return self


class NodeFabricStatus(Model):
    observed_generation: int | None = None
    healthy_gpus: int | None = Field(None, alias="healthyGPUs")
    healthy_links: int | None = None
    last_probe_time: str | None = None
    conditions: Conditions | None = None


class NodeFabric(Object):
    kind: Literal["NodeFabric"] = "NodeFabric"
    spec: NodeFabricSpec
    status: NodeFabricStatus | None = None


# ---- DeviceFailure ---------------------------------------------------------------------------


class DeviceFailureSpec(Model):
    node: ObjectName
    device: Device
    reason: str | None = Field(None, max_length=1024)
    source: Literal["agent", "manual"]
    resolved: bool = False


class DeviceFailureStatus(Model):
    observed_generation: int | None = None
    affected_count: int | None = None
    affected: tuple[str, ...] | None = None
    conditions: Conditions | None = None


class DeviceFailure(Object):
    kind: Literal["DeviceFailure"] = "DeviceFailure"
    spec: DeviceFailureSpec
    status: DeviceFailureStatus | None = None


# ---- FabricTopology --------------------------------------------------------------------------


class FabricNode(Model):
    name: ObjectName
    position: int = Field(ge=0)
    block: ObjectName | None = None


class TopographSource(Model):
    block_label: str = Field(TOPOGRAPH_BLOCK, min_length=1, max_length=317)


class KueueSource(Model):
    topology: ObjectName


class VolcanoSource(Model):
    pass


class FabricSource(Model):
    node_selector: LabelSelector | None = None
    topograph: TopographSource | None = None
    kueue: KueueSource | None = None
    volcano: VolcanoSource | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if sum(x is not None for x in (self.topograph, self.kueue, self.volcano)) != 1:
            raise ValueError("set exactly one of topograph, kueue and volcano")
        return self


Preset = Literal["dgx-h100", "hgx-8", "dgx1", "dgx2", "mi250", "generic"]


class IntraNode(Model):
    preset: Preset = "dgx-h100"
    gpus: int = Field(8, ge=1, le=64)
    bandwidth: float | None = Field(None, gt=0, alias="bandwidthBytesPerSecond")
    alpha: float | None = Field(None, ge=0, alias="alphaSeconds")


class InterNode(Model):
    type: Literal["rail", "switch", "torus", "none"]
    rails: int | None = Field(None, ge=1, le=64)
    spine_oversubscription: float | None = Field(None, ge=1)
    dims: tuple[Annotated[int, Field(ge=1)], ...] | None = Field(None, max_length=3)
    bandwidth: float = Field(DEFAULT_INTER_BANDWIDTH, gt=0, alias="bandwidthBytesPerSecond")
    alpha: float = Field(DEFAULT_INTER_ALPHA, ge=0, alias="alphaSeconds")

    @model_validator(mode="after")
    def _shape(self) -> Self:
        if self.type == "rail" and self.rails is None:
            raise ValueError("type rail needs rails")
        if self.type == "torus" and not self.dims:
            raise ValueError("type torus needs dims")
        return self


class FabricTopologySpec(Model):
    nodes: tuple[FabricNode, ...] | None = Field(None, min_length=1, max_length=4096)
    source: FabricSource | None = None
    intra_node: IntraNode | None = None
    inter_node: InterNode

    @model_validator(mode="after")
    def _nodes_or_source(self) -> Self:
        if (self.nodes is None) == (self.source is None):
            raise ValueError("set exactly one of nodes and source")
        return self


class FabricTopologyStatus(Model):
    observed_generation: int | None = None
    nodes: int | None = None
    gpus: int | None = None
    fingerprint: str | None = None
    conditions: Conditions | None = None


class FabricTopology(Object):
    kind: Literal["FabricTopology"] = "FabricTopology"
    spec: FabricTopologySpec
    status: FabricTopologyStatus | None = None


# ---- CollectiveJob ---------------------------------------------------------------------------

MAX_BYTES = 1 << 40


class Workload(Model):
    kind: Literal["Job", "JobSet", "PyTorchJob", "MPIJob", "Pod"] | None = None
    name: str | None = Field(None, max_length=253)


class CollectiveSpec(Model):
    """One collective of a tenant and the size range its schedules cover. ``root`` reads as
    0 when absent (the rooted collectives' default root)."""

    name: str = Field(max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    collective: Literal["allreduce", "allgather", "reducescatter", "broadcast", "reduce",
                        "alltoall"]  # fmt: skip
    min_bytes: int = Field(ge=1, le=MAX_BYTES)
    max_bytes: int = Field(ge=1, le=MAX_BYTES)
    chunks: int | None = Field(None, ge=1, le=64)
    root: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _range(self) -> Self:
        if self.min_bytes > self.max_bytes:
            raise ValueError("minBytes must not exceed maxBytes")
        return self


class CollectiveJobSpec(Model):
    selector: LabelSelector
    workload: Workload | None = None
    rank_label: str = Field(DEFAULT_RANK_LABEL, max_length=317)
    gpus_per_pod: int | None = Field(None, ge=1, le=64)
    collectives: tuple[CollectiveSpec, ...] = Field(min_length=1, max_length=16)
    weight: float = Field(1.0, gt=0, le=1000)
    isolation: Literal["Joint", "Partitioned"] = "Joint"
    dialect: Literal["executor", "rccl", "legacy"] = "executor"
    instances: int = Field(1, ge=1, le=8)
    protocol: Literal["Simple", "LL", "LL128"] = "Simple"
    when_nccl_faster: Literal["RunNccl", "ShipSchedule"] = "RunNccl"
    engine: Literal["Greedy", "Auto"] = "Greedy"
    engine_seconds: float = Field(10.0, gt=0, le=300)

    @field_validator("selector")
    @classmethod
    def _selects(cls, selector: LabelSelector) -> LabelSelector:
        if selector.match_labels is None and selector.match_expressions is None:
            raise ValueError("the selector must select something")
        return selector


class ConfigMapPart(Model):
    name: str | None = None
    first_rank: int | None = None
    last_rank: int | None = None
    pod_rank: int | None = None
    key_prefix: str | None = None


class SizeRange(Model):
    min_bytes: int | None = None
    max_bytes: int | None = None
    runs: Literal["choreo", "NCCL"] | None = None
    reason: Literal["NcclFaster", "ConfigMapLimit"] | None = None
    speedup_vs_nccl: float | None = None


class CollectiveStatus(Model):
    name: str | None = None
    predicted_time_seconds: float | None = None
    predicted_bus_bandwidth_bytes_per_second: float | None = None
    lower_bound_seconds: float | None = None
    fraction_of_bound: float | None = None
    size_bytes: int | None = None
    engine: str | None = None
    predicted_nccl_time_seconds: float | None = None
    nccl_choice: str | None = None
    speedup_vs_nccl: float | None = None
    sizes: tuple[SizeRange, ...] | None = None


class LastSynthesis(Model):
    time: str | None = None
    reason: str | None = None
    duration_seconds: float | None = None
    engine: str | None = None
    fabric_fingerprint: str | None = None
    inputs_hash: str | None = None


Phase = Literal["Pending", "Synthesizing", "Ready", "Degraded", "Infeasible"]


class CollectiveJobStatus(Model):
    observed_generation: int | None = None
    phase: Phase | None = None
    ranks: int | None = None
    nodes: tuple[str, ...] | None = None
    config_map: str | None = None
    config_map_parts: tuple[ConfigMapPart, ...] | None = None
    files: tuple[str, ...] | None = None
    content_hash: str | None = None
    summary: str | None = None
    collectives: tuple[CollectiveStatus, ...] | None = None
    last_synthesis: LastSynthesis | None = None
    conditions: Conditions | None = None


class CollectiveJob(Object):
    kind: Literal["CollectiveJob"] = "CollectiveJob"
    spec: CollectiveJobSpec
    status: CollectiveJobStatus | None = None


KINDS: tuple[type[Object], ...] = (FabricTopology, NodeFabric, CollectiveJob, DeviceFailure)
