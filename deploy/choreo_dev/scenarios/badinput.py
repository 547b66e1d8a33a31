"""Bad-input scenario: a batch of invalid manifests sent to the API server.

Wrong types, unknown fields and out-of-range values must be rejected by the API server
itself (schemas and CEL rules in ``crds/``), with a message naming the field. A reference to
a node that does not exist passes any schema, so the operator must flag it in a condition.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from choreo_dev.errors import DevClusterError
from choreo_dev.observe import GROUP
from choreo_dev.scenarios.world import World, wait

API = "choreo.dev/v1alpha1"
COLL = {"name": "grads", "collective": "allreduce", "minBytes": 1024, "maxBytes": 4096}


def _job(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"selector": {"matchLabels": {"app": "x"}}, "collectives": [COLL]}
    return {"apiVersion": API, "kind": "CollectiveJob",
            "metadata": {"name": name, "namespace": "default"}, "spec": {**base, **spec}}


def _fabric(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"nodes": [{"name": "n0", "position": 0}],
                            "interNode": {"type": "none"}}
    return {"apiVersion": API, "kind": "FabricTopology", "metadata": {"name": name},
            "spec": {**base, **spec}}


def _failure(name: str, device: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "DeviceFailure", "metadata": {"name": name},
            "spec": {"node": "n0", "device": device, "source": "manual", **spec}}


# (manifest, substrings the rejection must contain: the field and what is wrong)
INVALID: list[tuple[dict[str, Any], list[str]]] = [
    # wrong types
    (_job("type-weight", weight="heavy"), ["spec.weight", "must be of type number"]),
    (_job("type-collectives", collectives={"name": "x"}), ["spec.collectives"]),
    (_job("type-maxbytes", collectives=[{**COLL, "maxBytes": "1GiB"}]),
     ["spec.collectives[0].maxBytes", "integer"]),
    (_fabric("type-position", nodes=[{"name": "n0", "position": "first"}]),
     ["spec.nodes[0].position", "integer"]),
    (_failure("type-gpu", {"type": "gpu", "gpu": "three"}), ["spec.device.gpu", "integer"]),
    (_failure("type-resolved", {"type": "gpu", "gpu": 1}, resolved="yes"),
     ["spec.resolved", "boolean"]),
    # unknown fields
    (_job("unknown-spec", priority=3), ["unknown field", "spec.priority"]),
    (_job("unknown-collective", collectives=[{**COLL, "algorithm": "ring"}]),
     ["unknown field", "spec.collectives[0].algorithm"]),
    (_fabric("unknown-internode", interNode={"type": "none", "hops": 2}),
     ["unknown field", "spec.interNode.hops"]),
    # out-of-range and invalid values
    (_job("range-weight", weight=-1), ["spec.weight"]),
    (_job("range-min", collectives=[{**COLL, "minBytes": 0}]),
     ["spec.collectives[0].minBytes"]),
    (_job("range-order", collectives=[{**COLL, "minBytes": 8192}]),
     ["spec.collectives[0]", "minBytes must not exceed maxBytes"]),
    (_job("range-collective", collectives=[{**COLL, "collective": "allsum"}]),
     ["spec.collectives[0].collective", "allsum"]),
    (_job("range-empty", collectives=[]), ["spec.collectives"]),
    (_job("range-isolation", isolation="Shared"), ["spec.isolation", "Shared"]),
    (_fabric("range-position", nodes=[{"name": "n0", "position": -1}]),
     ["spec.nodes[0].position"]),
    (_fabric("range-preset", intraNode={"preset": "dgx9"}), ["spec.intraNode.preset", "dgx9"]),
    (_fabric("range-rails", interNode={"type": "rail"}), ["spec.interNode", "rails"]),
    (_failure("range-gpu", {"type": "gpu", "gpu": -2}), ["spec.device.gpu"]),
    (_failure("range-link", {"type": "link", "gpu": 1, "peerGPU": 1}),
     ["spec.device", "a link joins two different GPUs"]),
    (_failure("range-device", {"type": "fan"}), ["spec.device.type", "fan"]),
]


@dataclass
class Outcome:
    name: str
    rejected: bool
    named: bool  # the message contains every expected substring
    message: str


def send(w: World, manifest: dict[str, Any]) -> str | None:
    """``kubectl apply`` (strict field validation, as by default); the error, or None."""
    try:
        w.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    except DevClusterError as err:
        return str(err).split("failed: ", 1)[-1]
    return None


def rejected(w: World) -> list[Outcome]:
    out = []
    for manifest, needles in INVALID:
        message = send(w, manifest)
        text = message or ""
        out.append(Outcome(manifest["metadata"]["name"], message is not None,
                           all(n in text for n in needles), text.strip()[:300]))
    return out


@dataclass
class Flagged:
    what: str
    condition: dict[str, Any]


def missing_nodes(w: World, node: str, timeout: float = 60.0) -> list[Flagged]:
    """A DeviceFailure and a tenant's pod naming nodes outside the fabric get conditions."""
    absent = "no-such-node"
    w.fabric_topology("badinput", [node])
    w.client.create(f"{GROUP}/devicefailures", _failure("ghost-gpu", {"type": "gpu", "gpu": 0},
                                                        node=absent))
    ns = w.namespace("badinput")
    stray = w.add_nodes("stray", 1)[0]  # a real node that the FabricTopology does not list
    w.tenant(ns, "stray", [node, stray])

    def applied() -> dict[str, Any] | None:
        st = w.client.get(f"{GROUP}/devicefailures/ghost-gpu").get("status") or {}
        return next((c for c in st.get("conditions") or [] if c["type"] == "Applied"), None)

    def placed() -> dict[str, Any] | None:
        st = w.client.get(f"{GROUP}/namespaces/{ns}/collectivejobs/stray").get("status") or {}
        return next((c for c in st.get("conditions") or [] if c["type"] == "Ready"
                     and c.get("reason") == "UnknownNode"), None)

    return [Flagged(f"DeviceFailure on node {absent}",
                    wait(applied, timeout, "the DeviceFailure's Applied condition", w)),
            Flagged(f"pod on node {stray}, not in the FabricTopology",
                    wait(placed, timeout, "the CollectiveJob's UnknownNode condition", w))]
