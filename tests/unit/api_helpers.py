"""Objects of choreo's kinds for the operator's tests, read from bodies as its indexes read them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from choreo_api import (
    CollectiveJob,
    Device,
    DeviceFailure,
    DeviceFailureSpec,
    FabricTopology,
    NodeFabricSpec,
    ObjectMeta,
)
from choreo_operator import model

COLLECTIVE = {"name": "grads", "collective": "allreduce", "minBytes": 1 << 20, "maxBytes": 1 << 26}


def valid(obj: Any) -> Any:
    assert not isinstance(obj, model.Invalid), obj
    return obj


def fabric(nodes: int | Iterable[tuple[str, int]] = 2, *, name: str = "f", generation: int = 1,
           blocks: Mapping[str, str] | None = None, intra: Mapping[str, Any] | None = None,
           **inter: Any) -> FabricTopology:
    """A FabricTopology of nodes ``n0..`` (or (name, position) pairs); ``inter`` is
    ``spec.interNode`` in the CRD's spelling, type ``none`` unless given."""
    pairs = [(f"n{i}", i) for i in range(nodes)] if isinstance(nodes, int) else list(nodes)
    blocks = blocks or {}
    spec: dict[str, Any] = {
        "nodes": [{"name": n, "position": p, **({"block": blocks[n]} if n in blocks else {})}
                  for n, p in pairs],
        "interNode": {"type": "none", **inter}}
    if intra:
        spec["intraNode"] = dict(intra)
    return valid(model.fabric_topology({"metadata": {"name": name, "generation": generation},
                                        "spec": spec}))


def failure(name: str, node: str, kind: str, resolved: bool = False,
            **device: Any) -> DeviceFailure:
    """A DeviceFailure of ``device`` (the Device model's field names)."""
    return DeviceFailure(metadata=ObjectMeta(name=name), spec=DeviceFailureSpec(
        node=node, device=Device.model_validate({"type": kind, **device}), source="manual",
        resolved=resolved))


def node_fabric(doc: Mapping[str, Any]) -> NodeFabricSpec:
    """A NodeFabric spec from its document (the CRD's spelling)."""
    return valid(model.node_fabric({"metadata": {"name": str(doc["nodeName"])},
                                    "spec": dict(doc)}))


def job(name: str, namespace: str = "ns", *, labels: Mapping[str, str] | None = None,
        collectives: Iterable[Mapping[str, Any]] = (COLLECTIVE,),
        status: Mapping[str, Any] | None = None, **spec: Any) -> CollectiveJob:
    """A CollectiveJob selecting pods labelled ``t=<name>``; ``spec`` in the CRD's spelling."""
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                     "generation": 1},
        "spec": {"selector": {"matchLabels": dict(labels or {"t": name})},
                 "collectives": [dict(c) for c in collectives], **spec}}
    if status is not None:
        body["status"] = dict(status)
    return valid(model.job(body))
