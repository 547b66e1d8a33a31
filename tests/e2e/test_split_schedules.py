"""A schedule cut per pod end to end: an operator run with a small ``--split-bytes`` (and
``--unpack-image``) publishes a 16-GPU tenant of eight 2-GPU pods as parts that share
ConfigMaps on the real API server; each pod is admitted (a server-side dry run through the
real webhook) with its own part's keys, and the sidecar's own command line, run here on that
ConfigMap laid out as the kubelet lays out a volume with ``items``, gives the pod its ranks'
files and nothing else. Every process is stopped by PID."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from choreo_dev import operator_testing as T
from choreo_dev import schedules
from choreo_dev.testing import LocalCluster
from choreo_operator import results

pytestmark = pytest.mark.e2e

WEBHOOK = "choreo-split-e2e"
IMAGE = "registry.example/choreo:e2e"
SPLIT_BYTES = 16_000  # a pod's packed part is about 6 KB here: a few pods to a ConfigMap
PODS = 8


@dataclass
class Stack(T.Namespace):
    nodes: list[str]


def _pod(rank: int, nodes: list[str]) -> dict[str, Any]:
    return T.tenant_pod(f"sp-{rank}", nodes[rank * 2 // 8], "sp", rank, gpus=2)


@pytest.fixture(scope="module")
def stack(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with T.operator_stack(cluster, tmp_path_factory.mktemp("split"), "split", WEBHOOK, [
            "--unpack-image", IMAGE, "--split-bytes", str(SPLIT_BYTES)]) as (nodes, ns, operator):
        cluster.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(T.collective_job("sp")))
        for rank in range(PODS):
            cluster.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(_pod(rank, nodes)))
        st = Stack(cluster, ns, nodes)
        try:
            cluster.wait_for(lambda: st.status("sp").get("phase") == "Ready"
                             and st.status("sp").get("ranks") == 2 * PODS,
                             "the schedule cut per pod", timeout=120)
        except Exception as err:
            raise AssertionError(f"{err}\n{T.tail(operator.log, 40)}") from None
        yield st


def test_pods_parts_share_config_maps_each_under_its_own_prefix(stack: Stack) -> None:
    parts = stack.status("sp")["configMapParts"]
    assert [(p["firstRank"], p["lastRank"], p["podRank"], p["keyPrefix"]) for p in parts] == [
        (2 * r, 2 * r + 1, r, f"r{2 * r}.") for r in range(PODS)]
    names = list(dict.fromkeys(p["name"] for p in parts))
    assert 1 < len(names) < PODS  # shared, and cut by size
    for name in names:
        cm = stack.configmap(name)
        assert results.data_bytes(cm) <= SPLIT_BYTES
        mine = [p for p in parts if p["name"] == name]
        assert name.endswith(f"-r{mine[0]['firstRank']}-{mine[-1]['lastRank']}")
        assert sorted(cm["binaryData"]) == sorted(
            f"{p['keyPrefix']}{f}" for p in mine for f in stack.status("sp")["files"])
    published = schedules.load(stack.cluster.client, stack.ns, stack.status("sp"))
    assert published is not None and len(published.ranks) == 2 * PODS
    assert sorted(published.configmaps) == sorted(names)
    assert schedules.problems(published) == []  # joined from its parts: MSCCL's checks and a run


def test_a_pod_admitted_now_reads_its_own_part_alone(stack: Stack, tmp_path: Path) -> None:
    """Admission as a dry run (nothing is created): the webhook mounts the ConfigMap that
    holds rank 5's part with items naming its keys, and the sidecar inflates them into the
    files the runtime reads, the pod's two ranks only."""
    rank = 5
    late = _pod(rank, stack.nodes)
    late["metadata"]["name"] = f"sp-late-{rank}"  # the rank is what the webhook goes by
    pod = stack.cluster.client.create(f"/api/v1/namespaces/{stack.ns}/pods?dryRun=All", late)
    status = stack.status("sp")
    part = next(p for p in status["configMapParts"] if p["podRank"] == rank)
    spec = pod["spec"]
    source = {v["name"]: v for v in spec["volumes"]}["choreo-schedule"]["configMap"]
    assert source["name"] == part["name"]
    assert {i["key"] for i in source["items"]} == {
        f"{part['keyPrefix']}{k}" for k in [*status["files"], "ranks.json"]}
    sidecar = spec["initContainers"][0]
    mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    where = {mounts["choreo-schedule"]: tmp_path / "packed",
             mounts["choreo-files"]: tmp_path / "files"}
    where[mounts["choreo-schedule"]].mkdir()
    T.project_config_map(stack.configmap(part["name"]), source["items"],
                         where[mounts["choreo-schedule"]])
    choreo = Path(sys.executable).with_name("choreo")
    args = [str(where.get(a, a)) for a in sidecar["args"]]
    subprocess.run([str(choreo), *args, "--once"], check=True, timeout=60)
    files = where[mounts["choreo-files"]]
    ranks = json.loads((files / "ranks.json").read_text())
    assert [r["rank"] for r in ranks] == [2 * rank, 2 * rank + 1]
    for key in status["files"]:
        xml = (files / "msccl" / key).read_text()
        assert xml.count("<gpu ") == 2
        assert f'<gpu id="{2 * rank}"' in xml and f'<gpu id="{2 * rank + 1}"' in xml
