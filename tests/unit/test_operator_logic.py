"""Placement, grouping, ConfigMaps, the webhook's mutation, conditions and the debouncer."""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest
from api_helpers import fabric, valid
from api_helpers import job as _job

from choreo_api import CollectiveJob
from choreo_operator import model, results, status, webhook
from choreo_operator.debounce import Debouncer
from choreo_operator.fabric import build_fabric
from choreo_operator.grouping import Member, groups
from choreo_operator.model import PodInfo, pod_info
from choreo_operator.placement import place

FABRIC = build_fabric(fabric(2, type="rail", rails=1), {})


def _pod(name: str, tenant: str, node: str | None, gpus: int, rank: int | None,
         annotation: str | None = None) -> PodInfo:
    ranks = () if rank is None else (("batch.kubernetes.io/job-completion-index", str(rank)),)
    return PodInfo("ns", name, name, (("t", tenant),), node, gpus, annotation, ranks, (), True)


def test_packing_in_rank_order_and_annotations() -> None:
    pods = [_pod("a1", "a", "n0", 3, 1), _pod("a0", "a", "n0", 3, 0),
            _pod("b0", "b", "n0", 2, 0, annotation="6,7"), _pod("c0", "c", "n1", 8, 0),
            _pod("d0", "d", "n1", 1, 0, annotation="2"), _pod("launcher", "a", "n1", 0, None)]
    out = place([_job("a"), _job("b"), _job("c"), _job("d")], pods, FABRIC)
    assert [(s.pod, s.gpu) for s in out["ns/a"].slots] == [
        ("a0", 0), ("a0", 1), ("a0", 2), ("a1", 3), ("a1", 4), ("a1", 5)]
    assert [s.gpu for s in out["ns/b"].slots] == [6, 7]
    assert out["ns/a"].pod_ranks == {"a0": (0, 2), "a1": (3, 5)}
    # c takes the whole node n1, so d's annotated GPU 2 is double-booked: a problem for one
    problems = out["ns/c"].problems + out["ns/d"].problems
    assert len(problems) == 1 and "also claimed" in problems[0]


def test_unknown_node_and_gpu_are_problems_not_errors() -> None:
    pods = [_pod("x0", "x", "elsewhere", 8, 0), _pod("y0", "y", "n1", 2, 0, annotation="8,9")]
    out = place([_job("x"), _job("y")], pods, FABRIC)
    assert "not in the FabricTopology" in out["ns/x"].problems[0]
    assert "has no GPU 8, 9" in out["ns/y"].problems[0]
    assert not out["ns/x"].slots and not out["ns/y"].slots


def test_tenants_sharing_a_nic_group_and_partitioned_stay_alone() -> None:
    topo = FABRIC.topology
    a = Member("a", (0, 1, 8, 9), True, ("executor", 1, "Simple"))
    b = Member("b", (2, 3, 10, 11), True, ("executor", 1, "Simple"))
    c = Member("c", (4, 5, 12, 13), False, ("executor", 1, "Simple"))
    d = Member("d", (6, 7, 14, 15), True, ("legacy", 1, "Simple"))
    assert [g.members for g in groups(topo, [a, b, c, d])] == [("a", "b"), ("c",), ("d",)]
    per_gpu = build_fabric(fabric(2, type="rail", rails=8), {}).topology
    assert len(groups(per_gpu, [a, b])) == 2  # one rail per GPU: nothing shared


def test_config_maps_are_content_addressed_and_split_per_pod() -> None:
    xml = ('<algo name="x" ngpus="4"><gpu id="0"/><gpu id="1"/><gpu id="2"/>'
           '<gpu id="3"/></algo>')
    sched = results.Schedule(results.Files({"grads-0.xml": xml}), [{"rank": r} for r in range(4)])
    job = _job("a")
    _, (name, parts, bodies) = results.config_maps(job, sched, {"p0": (0, 1), "p1": (2, 3)},
                                                   {"p0": 0, "p1": 1}, "in", "fp")
    assert name.startswith("a-") and not parts and bodies[0]["immutable"] is True
    # The same file as the synthesizer gzips it: named by its XML, not by its encoding.
    zipped = results.Files({"grads-0.xml": gzip.compress(xml.encode())})
    again = results.config_maps(job, results.Schedule(zipped, list(sched.ranks)),
                                {}, {}, "other", "fp")[1][0]
    assert again == name  # same content, same object, whatever the inputs were
    _, (_, parts, bodies) = results.config_maps(job, sched, {"p0": (0, 1), "p1": (2, 3)},
                                                {"p0": 0, "p1": 1}, "in", "fp", split_bytes=10)
    assert [(p.first, p.last, p.pod_rank, p.prefix) for p in parts] == [
        (0, 1, 0, "r0."), (2, 3, 1, "r2.")]
    assert [p.name for p in parts] == [b["metadata"]["name"] for b in bodies]  # one pod each
    assert bodies[1]["data"]["r2.grads-0.xml"].count("<gpu") == 2
    assert 'id="3"' in bodies[1]["data"]["r2.grads-0.xml"]
    # each part holds its pod's ranks, as its files hold their <gpu> elements
    assert [json.loads(b["data"][f"{p.prefix}ranks.json"]) for p, b in zip(
        parts, bodies, strict=True)] == [[{"rank": 0}, {"rank": 1}], [{"rank": 2}, {"rank": 3}]]


def test_pods_parts_share_config_maps_up_to_the_split_size() -> None:
    """16 pods of 2 ranks whose parts take about 0.2 KB each: three ConfigMaps of at most
    1 KB, each part under its own prefix, every rank in exactly one, and what a pod mounts
    through its items is its own part alone."""
    gpus = "".join(f'<gpu id="{r}">{"x" * 80}</gpu>' for r in range(32))
    sched = results.Schedule(results.Files({"grads-0.xml": f'<algo ngpus="32">{gpus}</algo>'}),
                             [{"rank": r} for r in range(32)])
    pods = {f"p{i}": (2 * i, 2 * i + 1) for i in range(16)}
    _, (name, parts, bodies) = results.config_maps(
        _job("a"), sched, pods, {p: i for i, p in enumerate(pods)}, "in", "fp", split_bytes=1000)
    assert 2 < len(bodies) < 16 and not results.oversized(bodies)
    assert all(results.data_bytes(b) <= 1000 for b in bodies)
    assert {p.name for p in parts} == {b["metadata"]["name"] for b in bodies}
    by_name = {b["metadata"]["name"]: b for b in bodies}
    for n in by_name:  # each named by the ranks it holds
        mine = [p for p in parts if p.name == n]
        assert n == f"{name}-r{mine[0].first}-{mine[-1].last}"
    # Cut for another split size, the same schedule names other objects but where a
    # ConfigMap holds the same ranks: one found already always holds what its name says.
    _, (_, _, again) = results.config_maps(
        _job("a"), sched, pods, {p: i for i, p in enumerate(pods)}, "in", "fp", split_bytes=600)
    assert len(again) > len(bodies)
    for body in again:
        n = body["metadata"]["name"]
        assert n not in by_name or by_name[n] == body
    for p in parts:
        own = results.xml_files(by_name[p.name], p.prefix)["grads-0.xml"]
        assert own.count("<gpu") == 2 and f'id="{p.first}"' in own and f'id="{p.last}"' in own
        assert json.loads(by_name[p.name]["data"][f"{p.prefix}ranks.json"]) == [
            {"rank": p.first}, {"rank": p.last}]
    job = valid(model.job({"metadata": {"name": "a", "namespace": "ns", "uid": "u"},
                           "spec": {"selector": {"matchLabels": {"t": "a"}}, "collectives": [
                               {"name": "grads", "collective": "allreduce", "minBytes": 1,
                                "maxBytes": 2}]},
                           "status": {"configMap": name, "files": ["grads-0.xml"],
                                      "configMapParts": [p.status() for p in parts]}}))
    pod = {"metadata": {"namespace": "ns", "labels": {
        "t": "a", "batch.kubernetes.io/job-completion-index": "5"}},
        "spec": {"containers": [{"name": "c"}]}}
    change = webhook.mutation(pod, [job])
    assert change is not None
    source = change["volumes"][-1]["configMap"]
    assert source["name"] == parts[5].name
    assert source["items"] == [{"key": "r10.grads-0.xml", "path": "msccl/grads-0.xml"},
                               {"key": "r10.ranks.json", "path": "ranks.json"}]


class _CountedFiles(results.Files):
    """Files that count how often each is inflated."""

    def __init__(self, files: dict[str, str | bytes]) -> None:
        super().__init__(files)
        self.reads: dict[str, int] = {}

    def __getitem__(self, key: str) -> str:
        self.reads[key] = self.reads.get(key, 0) + 1
        return super().__getitem__(key)


def test_a_pod_too_small_for_every_file_leaves_the_smallest_ranges_to_nccl() -> None:
    """Two collectives, 0.3 MiB per pod per file: the largest range of each always stays,
    then the others from the largest down while they fit (one more here). Files arrive
    gzipped: each is inflated once at most (its digest names the ConfigMaps), and those
    below the first range that did not fit are never inflated."""
    def padded(per_gpu: int) -> bytes:
        gpus = "".join(f'<gpu id="{r}">{" " * per_gpu}</gpu>' for r in range(4))
        return gzip.compress(f'<algo ngpus="4">{gpus}</algo>'.encode())

    files: dict[str, str | bytes] = {}
    colls = []
    for name in ("ag", "ar"):
        sizes = []
        edges = ((1, 9), (10, 99), (100, 999)) if name == "ag" else ((1, 10), (11, 100),
                                                                      (101, 1000))
        for b, (lo, hi) in enumerate(edges):
            key = results.xml_key(name, b)
            files[key] = padded(150 << 10)  # two GPUs a pod: 0.3 MiB a pod
            sizes.append(results.SizeRange(lo, hi, False, None, (key,)))
        colls.append(results.CollectiveResult(name, 999, 1.0, 1.0, 1.0, 1.0, sizes=tuple(sizes)))
    counted = _CountedFiles(files)
    sched = results.Schedule(counted, [{"rank": r} for r in range(4)], colls)
    job = _job("a", collectives=[{"name": "ag", "collective": "allgather", "minBytes": 1,
                                  "maxBytes": 999},
                                 {"name": "ar", "collective": "allreduce", "minBytes": 1,
                                  "maxBytes": 1000}])
    fitted, (_, parts, bodies) = results.config_maps(
        job, sched, {"p0": (0, 1), "p1": (2, 3)}, {}, "in", "fp")
    assert sorted(fitted.files) == ["ag-2.xml", "ar-1.xml", "ar-2.xml"]
    assert len(parts) == 2 and not results.oversized(bodies)
    assert [(r.min_bytes, r.nccl_runs, r.reason) for r in fitted.collectives[0].sizes] == [
        (1, True, "ConfigMapLimit"), (10, True, "ConfigMapLimit"), (100, False, "")]
    assert {n: (t.floor, t.buckets) for n, t in results.trims(job, fitted).items()} == {
        "ag": (100, 1), "ar": (11, 2)}
    # kept: ag-2, ar-2, ar-1; ag-1 was cut and did not fit; ar-0 and ag-0 went unread
    assert counted.reads == {"ag-2.xml": 1, "ar-2.xml": 1, "ar-1.xml": 1, "ag-1.xml": 1}
    assert parts[0].name == f"{_job('a').name}-{fitted.content_hash()[:10]}-r0-1"
    assert parts[1].name != parts[0].name  # 0.6 MiB a pod: a ConfigMap each


def test_webhook_mutation() -> None:
    body = {"metadata": {"name": "a", "namespace": "ns", "uid": "u", "generation": 2},
            "spec": {"selector": {"matchLabels": {"t": "a"}}, "collectives": [
                {"name": "grads", "collective": "allreduce", "minBytes": 1, "maxBytes": 2}]},
            "status": {"configMap": "a-123", "files": ["grads-0.xml", "grads-1.xml"]}}
    job = valid(model.job(body))
    pod = {"metadata": {"namespace": "ns", "labels": {"t": "a"}},
           "spec": {"containers": [{"name": "c", "env": [{"name": "NCCL_ALGO", "value": "X"}]}]}}
    change = webhook.mutation(pod, [job])
    assert change is not None
    volume = change["volumes"][-1]["configMap"]
    assert volume["name"] == "a-123"
    assert {"key": "grads-1.xml", "path": "msccl/grads-1.xml"} in volume["items"]
    env = {e["name"]: e["value"] for e in change["containers"][0]["env"]}
    assert env["NCCL_ALGO"] == "X" and env["MSCCL_ALGO_DIR"] == "/etc/choreo/msccl"
    assert webhook.mutation({"metadata": {"namespace": "other", "labels": {"t": "a"}},
                             "spec": {"containers": []}}, [job]) is None
    early = webhook.mutation(pod, [valid(model.job({**body, "status": {}}))])
    assert early is not None
    assert early["volumes"][-1]["configMap"]["name"] == "a-schedule"
    assert early["volumes"][-1]["configMap"]["optional"] is True


def _scheduled_job(status: dict, dialect: str = "executor") -> CollectiveJob:
    return valid(model.job({"metadata": {"name": "a", "namespace": "ns", "uid": "u"},
                            "spec": {"selector": {"matchLabels": {"t": "a"}}, "dialect": dialect,
                                     "collectives": [{"name": "grads", "collective": "allreduce",
                                                      "minBytes": 1, "maxBytes": 2}]},
                            "status": status}))


def _env(change: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom"))
            for e in change["containers"][0]["env"]}


@pytest.mark.parametrize(("dialect", "expected"), [
    ("executor", {"MSCCL_ALGO_DIR": "/etc/choreo/msccl"}),
    ("rccl", {"MSCCL_ALGO_DIR": "/etc/choreo/msccl"}),
    ("legacy", {"MSCCL_XML_FILES": "/etc/choreo/msccl/grads-0.xml",
                "NCCL_ALGO": "MSCCL,RING,TREE"}),
])
def test_pods_get_what_their_runtime_reads_and_nccl_keeps_its_own_choice(dialect, expected):
    """The executor leaves NCCL_ALGO alone: calls without a file run NCCL's own choice,
    NVLS included, which a restricting NCCL_ALGO would forbid."""
    pod = {"metadata": {"namespace": "ns", "labels": {"t": "a"}},
           "spec": {"containers": [{"name": "c"}]}}
    change = webhook.mutation(pod, [_scheduled_job({"configMap": "a-1", "files": ["grads-0.xml"]},
                                         dialect)])
    assert _env(change) == expected


@pytest.mark.parametrize("dialect", ["executor", "rccl", "legacy"])
def test_a_schedule_nccl_beats_at_every_size_switches_msccl_off(dialect):
    """No file at all: the executor would fail communicator creation on a missing
    MSCCL_ALGO_DIR, so MSCCL is off; the ConfigMap carries the switch for early pods."""
    pod = {"metadata": {"namespace": "ns", "labels": {"t": "a"}},
           "spec": {"containers": [{"name": "c"}]}}
    change = webhook.mutation(pod, [_scheduled_job({"configMap": "a-1", "files": []}, dialect)])
    assert _env(change) == dict.fromkeys(results.MSCCL_OFF[dialect], "0")
    assert change["volumes"][-1]["configMap"]["items"] == [
        {"key": "ranks.json", "path": "ranks.json"}]
    data = results.Schedule(files=results.Files(), ranks=[], dialect=dialect).data()
    assert {k: v for k, v in data.items() if k != "ranks.json"} == dict.fromkeys(
        results.MSCCL_OFF[dialect], "0")
    assert "NCCL_MSCCL_ENABLE" not in results.Schedule(
        files=results.Files({"grads-0.xml": "<algo/>"}), ranks=[]).data()
    early = _env(webhook.mutation(pod, [_scheduled_job({}, dialect)]))
    for key in results.MSCCL_OFF[dialect]:
        assert early[key] == {"configMapKeyRef": {"name": "a-schedule", "key": key,
                                                  "optional": True}}


def test_collective_status_leads_with_nccl_and_names_who_runs_each_range() -> None:
    ranges = (results.SizeRange(1, 63, False, 1.8), results.SizeRange(64, 1024, True, 0.8))
    c = results.CollectiveResult("grads", 256, 1e-3, 400e9, 0.9e-3, 0.9, 1.25e-3,
                                 "ring/simple, 16 channels", ranges)
    doc = c.status()
    assert doc["speedupVsNccl"] == 1.25 and doc["ncclChoice"].startswith("ring/")
    assert [r["runs"] for r in doc["sizes"]] == ["choreo", "NCCL"]
    assert c.summary() == "400.0 GB/s (90% of bound, 1.25x NCCL)"
    assert c.nccl_ranges == ranges[1:]
    everything = results.CollectiveResult("grads", 256, 1e-3, 400e9, 0.9e-3, 0.9, 0.8e-3,
                                          "nvls/simple, 16 channels",
                                          (results.SizeRange(1, 1024, True, 0.8),))
    assert everything.summary() == "NCCL runs (1.25x faster than choreo)"
    unknown = results.CollectiveResult("grads", 256, 1e-3, 400e9, 0.9e-3, 0.9)
    assert "speedupVsNccl" not in unknown.status() and unknown.summary().endswith("bound)")


def test_pod_info_reads_gpus_and_mounts() -> None:
    pod = pod_info({"metadata": {"name": "p", "namespace": "ns", "labels": {
        "batch.kubernetes.io/job-completion-index": "3"}},
        "spec": {"nodeName": "n0", "containers": [
            {"resources": {"limits": {"nvidia.com/gpu": "4"}}}, {"name": "side"}],
            "volumes": [{"name": "v", "configMap": {"name": "cm"}}]},
        "status": {"phase": "Running"}})
    assert pod.gpus == 4 and pod.rank("batch.kubernetes.io/job-completion-index") == 3
    assert pod.config_maps == ("cm",) and pod.active


def test_conditions_keep_transition_time_unless_status_flips() -> None:
    first = status.merge([], {"Ready": (True, "Synthesized", "ok")}, 1)
    first[0]["lastTransitionTime"] = "2000-01-01T00:00:00Z"
    same = status.merge(first, {"Ready": (True, "Synthesized", "still ok")}, 2)
    assert same[0]["lastTransitionTime"] == "2000-01-01T00:00:00Z"
    assert same[0]["observedGeneration"] == 2
    flipped = status.merge(same, {"Ready": (False, "no pods!", "x"),
                                  "Infeasible": (True, "TenantDisconnected", "y")}, 2)
    assert flipped[0]["lastTransitionTime"] != "2000-01-01T00:00:00Z"
    assert flipped[0]["reason"] == "nopods"
    assert status.phase(flipped) == "Infeasible" and status.phase([]) == "Pending"


def test_debouncer_coalesces_a_burst() -> None:
    async def main() -> tuple[set[str], float]:
        d = Debouncer(quiet=0.1, max_delay=5.0)
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def burst() -> None:
            for _ in range(10):
                d.poke("failure")
                await asyncio.sleep(0.03)
            d.poke("node")

        task = asyncio.create_task(burst())
        reasons, _ = await d.wait()
        await task
        return reasons, loop.time() - start

    reasons, waited = asyncio.run(main())
    assert reasons == {"failure", "node"} and waited >= 0.3
