"""Packed schedules end to end: an operator run with ``--unpack-image`` writes gzipped XML to
ConfigMaps on the real API server for a job that asks for the portfolio (``engine: Auto``),
its webhook gives tenant pods the sidecar, and the sidecar's own command line, run here on
the ConfigMap laid out as the kubelet lays it out, gives the pod the files the MSCCL runtime
reads. Every process is stopped by PID."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from choreo_dev import operator_testing as T
from choreo_dev import schedules
from choreo_dev.testing import LocalCluster
from choreo_operator import results

pytestmark = pytest.mark.e2e

WEBHOOK = "choreo-packed-e2e"
IMAGE = "registry.example/choreo:e2e"


@dataclass
class Stack(T.Namespace):
    operator: T.Proc


@pytest.fixture(scope="module")
def stack(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with T.operator_stack(cluster, tmp_path_factory.mktemp("packed"), "packed", WEBHOOK,
                          ["--unpack-image", IMAGE]) as (nodes, ns, operator):
        job = T.collective_job("pk", max_bytes=1 << 30)
        # The job asks for the portfolio: its schedules (other chunk counts, pieces at either
        # end) travel the same way and must pass the same checks.
        job["spec"].update(engine="Auto", engineSeconds=5)
        cluster.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(job))
        st = Stack(cluster, ns, operator)
        # The operator knows the job (its status says so), and the pods are admitted before
        # the schedule exists: they mount the alias.
        cluster.wait_for(lambda: st.status("pk").get("phase"), "the job seen", timeout=60)
        for rank, node in enumerate(nodes):
            cluster.kubectl("apply", "-n", ns, "-f", "-",
                            stdin=json.dumps(T.tenant_pod(f"pk-{rank}", node, "pk", rank)))
        try:
            cluster.wait_for(lambda: st.status("pk").get("phase") == "Ready",
                             "the packed schedule", timeout=120)
        except Exception as err:
            raise AssertionError(f"{err}\n{T.tail(operator.log, 40)}") from None
        yield st


def test_config_maps_hold_gzipped_xml_that_verifies(stack: Stack) -> None:
    status = stack.status("pk")
    names = [p["name"] for p in status.get("configMapParts") or []] or [status["configMap"]]
    for name in names:
        cm = stack.configmap(name)
        assert set(cm["data"]) == {"ranks.json"}, name  # what env[].valueFrom may read
        assert sorted(cm["binaryData"]) == status["files"]
        packed = sum(len(base64.b64decode(v)) for v in cm["binaryData"].values())
        assert packed * 4 < sum(len(x) for x in results.xml_files(cm).values())
    published = schedules.load(stack.cluster.client, stack.ns, status)
    assert published is not None and len(published.ranks) == 16
    assert schedules.problems(published) == []  # inflated, joined: MSCCL's checks and a run


def test_a_job_that_asks_for_the_portfolio_gets_its_schedules(stack: Stack) -> None:
    status = stack.status("pk")
    assert status["lastSynthesis"]["engine"] == "auto"
    assert status["lastSynthesis"]["durationSeconds"] > 0
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["status"] == "True", ready


def test_pods_get_the_sidecar_whose_copy_is_what_the_runtime_reads(stack: Stack,
                                                                    tmp_path: Path) -> None:
    pod = stack.cluster.client.get(f"/api/v1/namespaces/{stack.ns}/pods/pk-0")
    spec = pod["spec"]
    sidecar = spec["initContainers"][0]
    assert (sidecar["name"], sidecar["image"], sidecar["restartPolicy"]) == (
        "choreo-unpack", IMAGE, "Always")
    volumes = {v["name"]: v for v in spec["volumes"]}
    source = volumes["choreo-schedule"]["configMap"]
    assert source["name"] == "pk-schedule" and source["optional"]  # the alias, filled in later
    train = spec["containers"][0]
    assert {m["name"]: m["mountPath"] for m in train["volumeMounts"]}[
        "choreo-files"] == "/etc/choreo"
    algo_dir = {e["name"]: e.get("value") for e in train["env"]}["MSCCL_ALGO_DIR"]
    # The sidecar's command line as the pod runs it, on this machine's paths.
    status = stack.status("pk")
    # The 16-GPU tenant's schedule (about 0.6 MB of XML) is one ConfigMap, not split per
    # pod, so the whole of it is in the alias the pod mounts.
    assert not status.get("configMapParts"), status["configMapParts"]
    alias = stack.configmap("pk-schedule")
    assert sorted(alias["binaryData"]) == status["files"]  # the alias is packed too
    mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    where = {mounts["choreo-schedule"]: tmp_path / "packed",
             mounts["choreo-files"]: tmp_path / "files"}
    where[mounts["choreo-schedule"]].mkdir()
    T.project_config_map(alias, source["items"], where[mounts["choreo-schedule"]])
    choreo = Path(sys.executable).with_name("choreo")
    args = [str(where.get(a, a)) for a in sidecar["args"]]
    subprocess.run([str(choreo), *args, "--once"], check=True, timeout=60)
    folder = where[mounts["choreo-files"]] / Path(algo_dir).relative_to("/etc/choreo")
    got = {p.name: p.read_text() for p in folder.iterdir()}
    assert got == results.xml_files(stack.configmap(status["configMap"]))
    ranks = json.loads((where[mounts["choreo-files"]] / "ranks.json").read_text())
    assert len(ranks) == 16
