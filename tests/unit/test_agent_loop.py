"""The agent loop against an in-memory API server: what it writes, when, and how it copes."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from choreo.generators import build
from choreo_agents.agent import Agent, Settings
from choreo_agents.backends import BackendError
from choreo_agents.backends.script import parse_script
from choreo_agents.backends.sim import SimBackend
from choreo_agents.metrics import AgentMetrics
from choreo_agents.publisher import PROBE_REQUEST, Publisher
from choreo_agents.report import fabric_spec, significant
from choreo_api import API_VERSION, NodeFabricSpec
from choreo_api.kube import ApiException

NS = "choreo-system"
FABRIC = f"/apis/{API_VERSION}/namespaces/{NS}/nodefabrics/n0"


class FakeApi:
    """Stores objects by path; merge patches like the API server; can be told to fail."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {
            f"/api/v1/namespaces/{NS}/pods/agent-x": {"metadata": {"uid": "pod-uid-1"}}
        }
        self.fail: Exception | None = None
        self.writes: list[tuple[str, str]] = []

    def _check(self) -> None:
        if self.fail is not None:
            raise self.fail

    def get(self, path: str) -> Any:
        self._check()
        if "?labelSelector=" in path:
            base, _, selector = path.partition("?labelSelector=")
            key, _, value = selector.replace("%3D", "=").partition("=")
            items = [
                o
                for p, o in self.objects.items()
                if p.startswith(base + "/") and o["metadata"].get("labels", {}).get(key) == value
            ]
            return {"items": copy.deepcopy(items)}
        if path not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        return copy.deepcopy(self.objects[path])

    def create(self, path: str, obj: dict[str, Any]) -> Any:
        self._check()
        full = f"{path}/{obj['metadata']['name']}"
        if full in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        stored = copy.deepcopy(obj)
        stored["metadata"]["generation"] = 1
        stored.pop("status", None)
        self.objects[full] = stored
        self.writes.append(("create", full))
        return copy.deepcopy(stored)

    def merge_patch(self, path: str, patch: dict[str, Any]) -> Any:
        self._check()
        status = path.endswith("/status")
        target = path.removesuffix("/status")
        if target not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        obj = self.objects[target]
        before = json.dumps(obj.get("spec"), sort_keys=True)
        _merge(obj, patch)
        if not status and json.dumps(obj.get("spec"), sort_keys=True) != before:
            obj["metadata"]["generation"] += 1
        self.writes.append(("status" if status else "patch", target))
        return copy.deepcopy(obj)


def _merge(obj: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            obj.pop(key, None)
        elif isinstance(value, dict) and isinstance(obj.get(key), dict):
            _merge(obj[key], value)
        else:
            obj[key] = copy.deepcopy(value)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_agent(
    script: str = "", fabric: str = "dgx1", api: FakeApi | None = None, **settings: Any
) -> tuple[Agent, FakeApi, Clock]:
    clock = Clock()
    api = api or FakeApi()
    doc = yaml.safe_load(script) if script else None
    backend = SimBackend(
        build(fabric), 0, noise=0.02, script=parse_script(doc), seed=1, clock=clock
    )
    publisher = Publisher(api, "n0", NS, ("agent-x", NS))  # type: ignore[arg-type]
    options = {"stagger": 0.0, "recover_after": 1.0, "interval": 60.0, **settings}
    agent = Agent(Settings(node="n0", **options), backend, publisher, AgentMetrics(), clock)
    return agent, api, clock


def step(agent: Agent, clock: Clock, seconds: float = 0.5, ticks: int = 1) -> None:
    for _ in range(ticks):
        agent.tick()
        if agent._probe is not None:
            agent._probe.result(timeout=10)
        clock.now += seconds


def test_publishes_nodefabric_owned_by_the_pod_then_only_real_changes() -> None:
    agent, api, clock = make_agent()
    step(agent, clock)
    obj = api.objects[FABRIC]
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "pod-uid-1"
    assert obj["metadata"]["labels"]["choreo.dev/node"] == "n0"
    assert obj["spec"]["backend"] == "sim" and len(obj["spec"]["gpus"]) == 8
    step(agent, clock, ticks=3)
    obj = api.objects[FABRIC]
    assert all("fit" in link for link in obj["spec"]["links"])
    assert obj["status"]["healthyGPUs"] == 8 and obj["status"]["healthyLinks"] == 32
    conditions = {c["type"]: c for c in obj["status"]["conditions"]}
    assert conditions["Measured"]["status"] == "True"
    assert conditions["Healthy"]["observedGeneration"] == obj["metadata"]["generation"]
    patches = [w for w in api.writes if w[0] == "patch"]
    clock.now += 61.0  # periodic re-measurement: same fabric, fresh noise
    step(agent, clock, ticks=3)
    assert [w for w in api.writes if w[0] == "patch"] == patches


def test_link_failure_opens_a_device_failure_and_recovery_resolves_it() -> None:
    agent, api, clock = make_agent(
        "events: [{at: 2s, link-down: [1, 4]}, {at: 4s, link-up: [1, 4]}]"
    )
    step(agent, clock, ticks=6)  # t = 0 .. 2.5
    name = f"/apis/{API_VERSION}/devicefailures/n0-link-1-4"
    failure = api.objects[name]
    assert failure["spec"] == {
        "node": "n0",
        "device": {"type": "link", "gpu": 1, "peerGPU": 4},
        "reason": "link down",
        "source": "agent",
        "resolved": False,
    }
    links = api.objects[FABRIC]["spec"]["links"]
    assert [ln["healthy"] for ln in links if {ln["src"], ln.get("dstGPU")} == {1, 4}] == [
        False,
        False,
    ]
    assert api.objects[FABRIC]["status"]["conditions"][0]["status"] == "False"
    step(agent, clock, ticks=6)  # up at 4 s, held for 1 s
    assert api.objects[name]["spec"]["resolved"] is True
    assert all(ln["healthy"] for ln in api.objects[FABRIC]["spec"]["links"])


def test_gpu_loss_is_one_failure_and_marks_its_links_unusable() -> None:
    agent, api, clock = make_agent("events: [{at: 1s, gpu-lost: 3}]")
    step(agent, clock, ticks=6)
    failures = [p for p in api.objects if "/devicefailures/" in p]
    assert failures == [f"/apis/{API_VERSION}/devicefailures/n0-gpu3"]
    spec = api.objects[FABRIC]["spec"]
    assert spec["gpus"][3]["healthy"] is False
    assert all(not ln["healthy"] for ln in spec["links"] if 3 in (ln["src"], ln.get("dstGPU")))


def test_switch_port_failure_names_the_switch() -> None:
    agent, api, clock = make_agent("events: [{at: 0, link-down: [2, sw-nvswitch]}]", "dgx-h100-1")
    step(agent, clock, ticks=3)
    path = f"/apis/{API_VERSION}/devicefailures/n0-link-2-sw-nvswitch"
    device = api.objects[path]["spec"]["device"]
    assert device == {"type": "link", "gpu": 2, "switch": "sw-nvswitch"}


def test_a_flapping_link_produces_one_failure_not_a_storm() -> None:
    agent, api, clock = make_agent(
        "events: [{at: 0, link-flapping: [0, 1], period: 1.5s, until: 30s}]"
    )
    step(agent, clock, ticks=60)
    writes = [w for w in api.writes if "devicefailures" in w[1]]
    assert writes == [("create", f"/apis/{API_VERSION}/devicefailures/n0-link-0-1")]


def test_degraded_link_is_remeasured_and_republished() -> None:
    agent, api, clock = make_agent("events: [{at: 2s, link-degraded: [0, 1], factor: 0.4}]")
    step(agent, clock, ticks=4)
    before = [
        ln
        for ln in api.objects[FABRIC]["spec"]["links"]
        if ln["src"] == 0 and ln.get("dstGPU") == 1
    ]
    step(agent, clock, ticks=4)
    after = [
        ln
        for ln in api.objects[FABRIC]["spec"]["links"]
        if ln["src"] == 0 and ln.get("dstGPU") == 1
    ]
    ratio = after[0]["bandwidthBytesPerSecond"] / before[0]["bandwidthBytesPerSecond"]
    assert ratio == pytest.approx(0.4, rel=0.1)
    assert not [p for p in api.objects if "/devicefailures/" in p]


def test_rejected_writes_back_off_and_keep_the_last_good_fabric() -> None:
    agent, api, clock = make_agent("events: [{at: 3s, gpu-lost: 0}]")
    step(agent, clock, ticks=4)
    good = copy.deepcopy(api.objects[FABRIC])
    api.fail = ApiException(status=422, reason="Unprocessable Entity")
    step(agent, clock, ticks=6)
    assert api.objects[FABRIC] == good
    assert agent._backoff["fabric"].failures >= 1
    attempts = len([w for w in api.writes])
    api.fail = OSError("connection refused")
    step(agent, clock, ticks=4)
    assert len(api.writes) == attempts
    api.fail = None
    clock.now += 60.0
    step(agent, clock, ticks=2)
    assert api.objects[FABRIC]["spec"]["gpus"][0]["healthy"] is False
    assert f"/apis/{API_VERSION}/devicefailures/n0-gpu0" in api.objects


def test_discovery_failure_is_retried_not_fatal() -> None:
    agent, api, clock = make_agent()
    real = agent.backend.discover
    calls = []

    def flaky() -> Any:
        calls.append(clock.now)
        if len(calls) < 3:
            raise BackendError("NVML init failed: Driver Not Loaded")
        return real()

    agent.backend.discover = flaky  # type: ignore[method-assign]
    step(agent, clock, ticks=20)
    assert len(calls) == 3
    assert calls[1] - calls[0] >= 0.25  # backed off
    assert FABRIC in api.objects


def test_a_gpu_vanishing_mid_probe_keeps_previous_values() -> None:
    agent, api, clock = make_agent()
    step(agent, clock, ticks=3)
    fits = dict(agent.fits)
    spec = copy.deepcopy(api.objects[FABRIC]["spec"])

    def boom(links: Any) -> Any:
        raise RuntimeError("GPU is lost")

    agent.backend.measure = boom  # type: ignore[method-assign]
    clock.now += 61.0
    step(agent, clock, ticks=3)
    assert agent.fits == fits
    assert api.objects[FABRIC]["spec"] == spec
    cond = {c["type"]: c for c in api.objects[FABRIC]["status"]["conditions"]}
    assert cond["Measured"]["reason"] == "ProbeFailed"


def test_probe_request_annotation_triggers_a_full_probe_and_is_cleared() -> None:
    agent, api, clock = make_agent(interval=3600.0)
    step(agent, clock, ticks=3)
    api.objects[FABRIC]["metadata"]["annotations"] = {PROBE_REQUEST: "now"}
    before = agent.schedule.next_at
    agent.probe_requested.set()
    step(agent, clock, ticks=3)
    assert PROBE_REQUEST not in api.objects[FABRIC]["metadata"].get("annotations", {})
    assert agent.schedule.next_at > before


def test_restart_adopts_open_failures_and_resolves_them_once_healthy() -> None:
    api = FakeApi()
    path = f"/apis/{API_VERSION}/devicefailures/n0-gpu5"
    api.objects[path] = {
        "metadata": {"name": "n0-gpu5", "labels": {"choreo.dev/node": "n0"}, "generation": 1},
        "spec": {"node": "n0", "device": {"type": "gpu", "gpu": 5}, "reason": "XID 79",
                 "source": "agent", "resolved": False},
    }  # fmt: skip
    agent, api, clock = make_agent(api=api)
    step(agent, clock)
    assert api.objects[FABRIC]["spec"]["gpus"][5]["healthy"] is False
    step(agent, clock, ticks=4)
    assert api.objects[path]["spec"]["resolved"] is True
    assert not [w for w in api.writes if w == ("create", path)]


def test_existing_fabric_from_an_earlier_pod_is_taken_over() -> None:
    api = FakeApi()
    api.objects[FABRIC] = {
        "metadata": {"name": "n0", "generation": 4, "ownerReferences": [{"uid": "old"}]},
        "spec": {"nodeName": "n0", "gpus": [{"index": 0}]},
    }
    agent, api, clock = make_agent(api=api)
    step(agent, clock)
    assert api.objects[FABRIC]["metadata"]["ownerReferences"][0]["uid"] == "pod-uid-1"
    assert len(api.objects[FABRIC]["spec"]["gpus"]) == 8


def test_significance_ignores_noise_but_not_structure() -> None:
    agent, _, clock = make_agent()
    step(agent, clock, ticks=3)
    spec = agent.spec()

    def links(scale: float, shift: float, first_only: bool = False) -> NodeFabricSpec:
        return spec.model_copy(update={"links": tuple(
            ln.model_copy(update={"bandwidth": ln.bandwidth * scale,
                                  "alpha": (ln.alpha or 0.0) + shift})
            if i == 0 or not first_only else ln for i, ln in enumerate(spec.links))})

    assert not significant(spec, links(1.05, 30e-9), 0.1)
    assert significant(spec, links(0.8, 0.0, first_only=True), 0.1)
    sick = spec.model_copy(update={"gpus": (
        spec.gpus[0].model_copy(update={"healthy": False}), *spec.gpus[1:])})
    assert significant(spec, sick, 0.1)
    assert significant(None, spec, 0.1)


def test_fabric_spec_reports_per_link_bandwidth_for_parallel_links() -> None:
    agent, _, clock = make_agent()
    step(agent, clock, ticks=3)
    assert agent.inventory is not None
    spec = fabric_spec("n0", agent.inventory, agent.fits, {})
    double = next(ln for ln in spec.links if ln.count == 2)
    assert double.bandwidth == pytest.approx(25e9, rel=0.05)
    assert double.fit is not None and (double.fit.samples or 0) >= 40


def test_a_nic_port_down_is_one_failure_and_its_link_unusable() -> None:
    agent, api, clock = make_agent("events: [{at: 0, nic-down: mlx5_3}]", "dgx-h100-2")
    step(agent, clock, ticks=3)
    failures = sorted(p.rsplit("/", 1)[1] for p in api.objects if "/devicefailures/" in p)
    assert failures == ["n0-nic-mlx5-3"]
    spec = api.objects[FABRIC]["spec"]
    assert [n["healthy"] for n in spec["nics"]].count(False) == 1
    assert [ln["healthy"] for ln in spec["links"] if ln.get("dstNIC") == "mlx5_3"] == [False]
