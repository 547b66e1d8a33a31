"""Fake GPU nodes described by a fabric: names, GPU counts and position labels.

A fabric description is YAML (or JSON) in one of two shapes::

    # explicit nodes
    gpusPerNode: 8
    labels: {choreo.dev/fabric: rail-16}
    nodes:
      - name: gpu-a0
        position: [0, 0]
      - name: gpu-a1
        position: [0, 1]
        gpus: 4
        labels: {choreo.dev/spare: "true"}

    # a grid of nodes, named prefix-0 .. prefix-(N-1) in row-major order
    namePrefix: gpu-node
    dims: [4, 2]
    gpusPerNode: 8

Each node's position becomes labels, so the operator (and a scheduler) can see where in
the fabric a node sits: ``choreo.dev/fabric-position: "1.0"`` plus one label per
dimension (``choreo.dev/fabric-dim-0: "1"``), and ``choreo.dev/fabric-index``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from choreo_dev.errors import DevClusterError

GPU_RESOURCE = "nvidia.com/gpu"
LABEL_PREFIX = "choreo.dev"
POSITION_LABEL = f"{LABEL_PREFIX}/fabric-position"
INDEX_LABEL = f"{LABEL_PREFIX}/fabric-index"
DIM_LABEL = f"{LABEL_PREFIX}/fabric-dim-"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class NodeSpec:
    """One fake node: what kwok will pretend exists."""

    name: str
    gpus: int = 8
    labels: Mapping[str, str] = field(default_factory=dict)
    cpu: str = "64"
    memory: str = "512Gi"
    pods: int = 110
    taints: tuple[Mapping[str, str], ...] = ()


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise DevClusterError(
            f"invalid node name {name!r}: use lower-case letters, digits, '-' and '.'"
        )
    return name


def _check_labels(labels: Any, where: str) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise DevClusterError(f"{where}: labels must be a mapping of strings")
    out = {}
    for key, value in labels.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if not _LABEL_VALUE.match(text):
            raise DevClusterError(f"{where}: label {key}={text!r} is not a valid label value")
        out[str(key)] = text
    return out


def _check_gpus(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DevClusterError(f"{where}: gpus must be a non-negative integer, got {value!r}")
    return value


def position_labels(position: Sequence[int], index: int) -> dict[str, str]:
    """Labels that place a node in the fabric."""
    labels = {
        POSITION_LABEL: ".".join(str(p) for p in position),
        INDEX_LABEL: str(index),
    }
    for dim, coord in enumerate(position):
        labels[f"{DIM_LABEL}{dim}"] = str(coord)
    return labels


def grid(prefix: str, dims: Sequence[int], gpus: int, labels: Mapping[str, str]) -> list[NodeSpec]:
    """Nodes on a grid of ``dims``, in row-major order."""
    if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise DevClusterError(f"dims must be a list of positive integers, got {list(dims)!r}")
    specs = []
    for index, position in enumerate(itertools.product(*(range(d) for d in dims))):
        specs.append(
            NodeSpec(
                name=_check_name(f"{prefix}-{index}"),
                gpus=gpus,
                labels={**labels, **position_labels(position, index)},
            )
        )
    return specs


def parse(doc: Any) -> list[NodeSpec]:
    """Turn a fabric description (already loaded from YAML) into node specs."""
    if not isinstance(doc, Mapping):
        raise DevClusterError("a fabric description must be a mapping with `nodes` or `dims`")
    default_gpus = _check_gpus(doc.get("gpusPerNode", 8), "gpusPerNode")
    common = _check_labels(doc.get("labels"), "labels")
    if "dims" in doc:
        return grid(str(doc.get("namePrefix", "gpu-node")), doc["dims"], default_gpus, common)
    nodes = doc.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise DevClusterError("a fabric description needs a non-empty `nodes` list or `dims`")
    specs: list[NodeSpec] = []
    seen: set[str] = set()
    for index, entry in enumerate(nodes):
        where = f"nodes[{index}]"
        if not isinstance(entry, Mapping) or "name" not in entry:
            raise DevClusterError(f"{where}: each node needs at least a `name`")
        name = _check_name(entry["name"])
        if name in seen:
            raise DevClusterError(f"{where}: node name {name!r} appears twice")
        seen.add(name)
        labels = dict(common)
        if "position" in entry:
            position = entry["position"]
            if not isinstance(position, list) or not all(isinstance(p, int) for p in position):
                raise DevClusterError(f"{where}: position must be a list of integers")
            labels.update(position_labels(position, index))
        labels.update(_check_labels(entry.get("labels"), where))
        gpus = _check_gpus(entry.get("gpus", default_gpus), where)
        specs.append(NodeSpec(name=name, gpus=gpus, labels=labels))
    return specs


def node_manifest(spec: NodeSpec) -> dict[str, Any]:
    """The Node object kwok takes over: capacity includes ``nvidia.com/gpu``.

    The node carries no taint, so ordinary Jobs and DaemonSets land on it without
    tolerations; select GPU nodes by the ``nvidia.com/gpu.present`` label.
    """
    resources = {
        "cpu": spec.cpu,
        "memory": spec.memory,
        "pods": str(spec.pods),
        GPU_RESOURCE: str(spec.gpus),
    }
    # Every label a kubelet registers with, the legacy pair too: without them the
    # controller-manager adds those to each node, one update per node at startup.
    labels = {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/hostname": spec.name,
        "type": "kwok",
        "nvidia.com/gpu.present": "true" if spec.gpus > 0 else "false",
        **spec.labels,
    }
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": labels,
            "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }
    if spec.taints:
        node["spec"]["taints"] = [dict(t) for t in spec.taints]
    return node
