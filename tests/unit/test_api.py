"""The API models against crds/*.yaml, and the agent's documents read back by the operator.

The CRDs are the API: every property of each kind's spec and status must be in its model under
the same name, with a compatible type, the same required-ness, enums, bounds and defaults, and
nothing more; every CEL rule must be enforced by the models with the CRD's message. Then what
the agent writes (NodeFabric, DeviceFailure of every device shape) must read back in the
operator as exactly what the agent meant, and apply to the fabric.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from api_helpers import fabric, valid

from choreo.generators import build
from choreo_agents.agent import Agent, Settings
from choreo_agents.backends.script import parse_script
from choreo_agents.backends.sim import SimBackend
from choreo_agents.model import failure_name
from choreo_agents.publisher import Publisher
from choreo_api import (
    API_VERSION,
    KINDS,
    CollectiveJob,
    CollectiveSpec,
    Device,
    DeviceFailure,
    FabricTopology,
    NodeFabric,
    Object,
    ValidationError,
    problem,
)
from choreo_operator import model
from choreo_operator.fabric import build_fabric

CRDS = Path(__file__).resolve().parents[2] / "crds"
ALLOWED_DEFAULTS = {"CollectiveJob.spec.collectives[].root": 0}
"""Defaults the CRD does not state: how the operator reads the field when it is absent."""


def _crd(kind: type[Object]) -> dict[str, Any]:
    name = kind.model_fields["kind"].default
    for path in sorted(CRDS.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc["spec"]["names"]["kind"] == name:
            (version,) = doc["spec"]["versions"]
            assert f"{doc['spec']['group']}/{version['name']}" == API_VERSION
            schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
            return schema
    raise AssertionError(f"no CRD for {name}")


def _model_schema(kind: type[Object], part: str) -> tuple[dict[str, Any], dict[str, Any]]:
    schema = kind.model_json_schema(by_alias=True)
    return schema["properties"][part], schema.get("$defs", {})


def _plain(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A model property's schema without $ref and the ``null`` of an optional field."""
    out = dict(schema)
    if "anyOf" in out:
        options = [o for o in out.pop("anyOf") if o.get("type") != "null"]
        assert len(options) == 1, schema
        out = {**out, **options[0]}
    if "$ref" in out:
        out = {**out, **defs[out.pop("$ref").rsplit("/", 1)[1]]}
    return out


def _bounds(schema: dict[str, Any]) -> dict[str, Any]:
    out = {k: schema[k] for k in ("minimum", "maximum", "minLength", "maxLength", "minItems",
                                  "maxItems", "pattern") if k in schema}
    if schema.get("exclusiveMinimum") is True:  # OpenAPI v3's spelling of JSON Schema's
        out["exclusiveMinimum"] = out.pop("minimum")
    elif "exclusiveMinimum" in schema:
        out["exclusiveMinimum"] = schema["exclusiveMinimum"]
    return out


def _compare(crd: dict[str, Any], ours: dict[str, Any], defs: dict[str, Any], at: str,
             problems: list[str]) -> None:
    ours = _plain(ours, defs)
    kind = crd.get("type", "object")
    if ours.get("type", "object") != kind:
        problems.append(f"{at}: type {ours.get('type')} in the model, {kind} in the CRD")
        return
    if set(crd.get("enum", ())) != set(ours.get("enum", ())):
        problems.append(f"{at}: enum {ours.get('enum')} in the model, {crd.get('enum')}")
    if _bounds(crd) != _bounds(ours):
        problems.append(f"{at}: bounds {_bounds(ours)} in the model, {_bounds(crd)}")
    if kind == "array":
        _compare(crd["items"], ours["items"], defs, f"{at}[]", problems)
    if kind != "object":
        return
    if "additionalProperties" in crd:
        if ours.get("additionalProperties") != crd["additionalProperties"]:
            problems.append(f"{at}: a map of {crd['additionalProperties']} in the CRD")
        return
    theirs, mine = crd.get("properties", {}), ours.get("properties", {})
    for name in sorted(set(theirs) ^ set(mine)):
        where = "the model" if name in mine else "the CRD"
        problems.append(f"{at}.{name}: only in {where}")
    if set(crd.get("required", ())) != set(ours.get("required", ())):
        problems.append(f"{at}: required {sorted(ours.get('required', ()))} in the model, "
                        f"{sorted(crd.get('required', ()))} in the CRD")
    for name in sorted(set(theirs) & set(mine)):
        field = f"{at}.{name}"
        default = mine[name].get("default")
        if "default" in theirs[name]:
            if default != theirs[name]["default"]:
                problems.append(f"{field}: default {default!r}, the CRD's is "
                                f"{theirs[name]['default']!r}")
        elif default not in (None, []) and ALLOWED_DEFAULTS.get(field) != default:
            problems.append(f"{field}: default {default!r} that the CRD does not state")
        _compare(theirs[name], mine[name], defs, field, problems)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("part", ["spec", "status"])
def test_the_models_are_the_crd_schemas(kind: type[Object], part: str) -> None:
    crd = _crd(kind)
    assert crd["required"] == ["spec"] and set(crd["properties"]) == {"spec", "status"}
    ours, defs = _model_schema(kind, part)
    problems: list[str] = []
    _compare(crd["properties"][part], ours, defs, f"{kind.__name__}.{part}", problems)
    assert not problems, "\n".join(problems)


# (kind, document breaking one CEL rule, the path the error names)
CEL_CASES: dict[str, tuple[type[Object], dict[str, Any], str]] = {
    "a link's src must be a GPU index of this node": (NodeFabric, {"nodeName": "n", "gpus": [
        {"index": 0}], "links": [{"src": 1, "dstSwitch": "sw", "kind": "nvswitch",
                                  "bandwidthBytesPerSecond": 1e9}]}, "spec"),
    "a link's dstGPU must be a GPU index of this node": (NodeFabric, {"nodeName": "n", "gpus": [
        {"index": 0}], "links": [{"src": 0, "dstGPU": 3, "kind": "nvlink",
                                  "bandwidthBytesPerSecond": 1e9}]}, "spec"),
    "exactly one of dstGPU, dstSwitch, dstNIC": (NodeFabric, {"nodeName": "n", "gpus": [
        {"index": 0}, {"index": 1}], "links": [{"src": 0, "dstGPU": 1, "dstNIC": "mlx5_0",
                                                "kind": "nvlink",
                                                "bandwidthBytesPerSecond": 1e9}]},
        "spec.links[0]"),
    "a gpu failure names its gpu index": (
        DeviceFailure, {"node": "n", "source": "manual", "device": {"type": "gpu"}},
        "spec.device"),
    "a link failure names gpu and its peer (peerGPU, switch or nic)": (
        DeviceFailure, {"node": "n", "source": "manual", "device": {"type": "link", "gpu": 1}},
        "spec.device"),
    "a nic failure names the nic": (
        DeviceFailure, {"node": "n", "source": "manual", "device": {"type": "nic"}},
        "spec.device"),
    "a link joins two different GPUs": (
        DeviceFailure, {"node": "n", "source": "manual",
                        "device": {"type": "link", "gpu": 1, "peerGPU": 1}}, "spec.device"),
    "set exactly one of nodes and source": (
        FabricTopology, {"interNode": {"type": "none"}}, "spec"),
    "set exactly one of topograph, kueue and volcano": (
        FabricTopology, {"source": {"volcano": {}, "topograph": {}},
                         "interNode": {"type": "none"}}, "spec.source"),
    "type rail needs rails": (FabricTopology, {"nodes": [{"name": "a", "position": 0}],
                                               "interNode": {"type": "rail"}},
                              "spec.interNode"),
    "type torus needs dims": (FabricTopology, {"nodes": [{"name": "a", "position": 0}],
                                               "interNode": {"type": "torus", "dims": []}},
                              "spec.interNode"),
    "the selector must select something": (CollectiveJob, {"selector": {}, "collectives": [
        {"name": "g", "collective": "allreduce", "minBytes": 1, "maxBytes": 2}]},
        "spec.selector"),
    "minBytes must not exceed maxBytes": (CollectiveJob, {
        "selector": {"matchLabels": {"a": "b"}},
        "collectives": [{"name": "g", "collective": "allreduce", "minBytes": 4, "maxBytes": 2}]},
        "spec.collectives[0]"),
}


def _cel_messages(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {rule["message"] for rule in node.get("x-kubernetes-validations", ())}
        return found.union(*(_cel_messages(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_cel_messages(v) for v in node))
    return set()


def test_every_cel_rule_is_enforced_with_its_message() -> None:
    assert set(CEL_CASES) == set().union(*(_cel_messages(_crd(k)) for k in KINDS))
    for message, (kind, spec, at) in CEL_CASES.items():
        with pytest.raises(ValidationError) as err:
            kind.model_validate({"metadata": {"name": "x"}, "spec": spec})
        assert problem(err.value) == f"{at}: {message}"


def test_problems_name_the_field_like_the_api_server() -> None:
    bad = {"metadata": {"name": "x"}, "spec": {"node": "n", "source": "agent",
                                               "device": {"type": "gpu", "gpu": "three"}}}
    got = model.device_failure(bad)
    assert isinstance(got, model.Invalid) and got.kind == "DeviceFailure" and got.name == "x"
    assert got.message.startswith("spec.device.gpu: Input should be a valid integer")
    assert got.message.endswith("got 'three'")
    fan = model.device_failure({**bad, "spec": {**bad["spec"], "device": {"type": "fan"}}})
    assert isinstance(fan, model.Invalid)
    assert fan.message.startswith("spec.device.type: Input should be 'gpu', 'link' or 'nic'")
    missing = model.fabric_topology({"metadata": {"name": "f"}, "spec": {
        "nodes": [{"name": "a", "position": 0}], "interNode": {"type": "rail", "rails": 0}}})
    assert isinstance(missing, model.Invalid)
    assert missing.message.startswith("spec.interNode.rails: Input should be greater than or")



def test_a_float_no_json_carries_is_refused_not_built_into_a_zero_bandwidth_link() -> None:
    """An infinite spineOversubscription divided the uplinks' bandwidth to 0, and routing over
    them divided by zero. The API server's JSON cannot carry inf or NaN; a Python caller can,
    and gets the field named."""
    body = {"metadata": {"name": "f"}, "spec": {
        "nodes": [{"name": "a", "position": 0, "block": "x"},
                  {"name": "b", "position": 1, "block": "y"}],
        "interNode": {"type": "rail", "rails": 8, "spineOversubscription": float("inf")}}}
    got = model.fabric_topology(body)
    assert isinstance(got, model.Invalid)
    assert got.message.startswith("spec.interNode.spineOversubscription: Input should be a "
                                  "finite number")
    body["spec"]["interNode"]["spineOversubscription"] = 2.0  # type: ignore[index]
    topo = build_fabric(valid(model.fabric_topology(body)), {}).topology
    assert min(lk.bandwidth for lk in topo.links) > 0

def test_collective_spec_prints_as_the_hash_of_recorded_inputs_expects() -> None:
    """The operator hashes each tenant's collectives by their repr; the repr is the one the
    inputs hashes in CollectiveJob statuses were made with, so they stay current."""
    spec = CollectiveSpec.model_validate(
        {"name": "grads", "collective": "allreduce", "minBytes": 1 << 20, "maxBytes": 1 << 26})
    assert repr(spec) == ("CollectiveSpec(name='grads', collective='allreduce', "
                          "min_bytes=1048576, max_bytes=67108864, chunks=None, root=0)")


# ---- the agent's documents, read back by the operator ---------------------------------------


class Store:
    """An API server that keeps what is written, as JSON, and merge-patches."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    def get(self, path: str) -> Any:
        if "?" in path:
            base = path.split("?")[0] + "/"
            return {"items": [v for k, v in self.objects.items() if k.startswith(base)]}
        return self.objects[path]

    def create(self, path: str, obj: dict[str, Any]) -> Any:
        stored = json.loads(json.dumps(obj))
        stored["metadata"]["generation"] = 1
        self.objects[f"{path}/{obj['metadata']['name']}"] = stored
        return stored

    def merge_patch(self, path: str, patch: dict[str, Any]) -> Any:
        key = path.removesuffix("/status")
        _merge(self.objects.setdefault(key, {"metadata": {}}), json.loads(json.dumps(patch)))
        return self.objects[key]


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            into.pop(k, None)
        elif isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _agent(script: str, fabric_name: str = "dgx-h100-2") -> tuple[Agent, Store]:
    """An agent on position 0 of ``fabric_name`` after a few ticks of ``script``."""
    store, clock = Store(), Clock()
    backend = SimBackend(build(fabric_name), 0, noise=0.0,
                         script=parse_script(yaml.safe_load(script)), seed=1, clock=clock)
    agent = Agent(Settings(node="n0", interval=600.0, stagger=0.0, recover_after=5.0), backend,
                  Publisher(store, "n0", "choreo-system"),  # type: ignore[arg-type]
                  clock=clock)
    for _ in range(4):
        agent.tick()
        if agent._probe is not None:
            agent._probe.result(timeout=10)
        clock.now += 0.5
    return agent, store


def test_the_operator_reads_the_node_fabric_the_agent_meant() -> None:
    agent, store = _agent("events: [{at: 0, nic-down: mlx5_3}, {at: 0, gpu-lost: 5}]")
    path = f"/apis/{API_VERSION}/namespaces/choreo-system/nodefabrics/n0"
    body = store.objects[path]
    read = model.node_fabric(body)
    assert read == agent.spec() == agent.published
    assert not isinstance(read, model.Invalid)
    assert [g.healthy for g in read.gpus].count(False) == 1
    assert [n.healthy for n in read.nics].count(False) == 1
    assert sum(ln.fit is not None for ln in read.links) >= 8  # the lost GPU's are not
    # the document holds the CRD's keys only, with no empty values
    link = body["spec"]["links"][0]
    assert set(link) <= {"src", "dstGPU", "dstSwitch", "dstNIC", "kind", "count", "alphaSeconds",
                         "bandwidthBytesPerSecond", "healthy", "fit"}
    assert body["metadata"]["labels"]["choreo.dev/node"] == "n0"
    status = NodeFabric.model_validate(body).status
    assert status is not None and status.healthy_gpus == 7 and status.conditions is not None
    assert {c.type: c.status for c in status.conditions} == {"Healthy": "False",
                                                             "Measured": "True"}
    fab = build_fabric(fabric([("n0", 0), ("n1", 1)], type="rail", rails=8), {"n0": read})
    assert fab.topology.names[5] == "n0/gpu5" and 5 in fab.topology.failed


DEVICES = {
    "gpu": "events: [{at: 0, gpu-lost: 2}]",
    "nic": "events: [{at: 0, nic-down: mlx5_1}]",
    "gpu pair": "events: [{at: 0, link-down: [4, 1]}]",
    "gpu to switch": "events: [{at: 0, link-down: [3, sw-nvswitch]}]",
}


@pytest.mark.parametrize("shape", sorted(DEVICES))
def test_the_operator_applies_every_device_failure_the_agent_writes(shape: str) -> None:
    agent, store = _agent(DEVICES[shape], "dgx1" if shape == "gpu pair" else "dgx-h100-2")
    (device,) = agent.hysteresis.bad()
    body = store.objects[f"/apis/{API_VERSION}/devicefailures/{failure_name('n0', device)}"]
    read = model.device_failure(body)
    assert isinstance(read, DeviceFailure) and read.spec.device == device
    assert read.spec.node == "n0" and read.spec.source == "agent" and not read.spec.resolved
    nf = model.node_fabric(store.objects[
        f"/apis/{API_VERSION}/namespaces/choreo-system/nodefabrics/n0"])
    assert not isinstance(nf, model.Invalid)
    ft = fabric([("n0", 0), ("n1", 1)], type="rail", rails=8)
    well = {part: tuple(x.model_copy(update={"healthy": True}) for x in getattr(nf, part))
            for part in ("gpus", "links", "nics")}
    healthy = build_fabric(ft, {"n0": nf.model_copy(update=well)}).topology
    fab = build_fabric(ft, {"n0": nf}, [read])
    assert not fab.problems, fab.problems
    topo = fab.topology
    hit = len(topo.failed) + sum(not lk.healthy for lk in topo.links)
    assert hit > len(healthy.failed) + sum(not lk.healthy for lk in healthy.links)


def test_a_link_to_a_nic_reads_back_with_its_nic() -> None:
    device = Device.link(2, nic="mlx5_2")
    doc = DeviceFailure.model_validate(
        {"metadata": {"name": "x"}, "spec": {"node": "n0", "source": "agent",
                                             "device": device.dump()}})
    assert doc.spec.device == device and device.dump() == {"type": "link", "gpu": 2,
                                                           "nic": "mlx5_2"}
    assert Device.link(5, gpu=1) == Device.link(1, gpu=5)
    assert Device.link(5, gpu=1).dump() == {"type": "link", "gpu": 1, "peerGPU": 5}
