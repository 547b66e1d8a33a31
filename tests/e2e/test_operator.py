"""The operator end to end: real API server, real `choreo serve`, the operator as a subprocess.

One synthesizer and one operator serve the whole module; tests that stop either restart it.
Every wait is bounded, every process is stopped by PID.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from choreo import msccl
from choreo.service.ports import listen_port
from choreo_dev import operator_testing as T
from choreo_dev.kube import ApiException
from choreo_dev.testing import LocalCluster

pytestmark = pytest.mark.e2e

GROUP = "/apis/choreo.dev/v1alpha1"
WEBHOOK = "choreo-operator-e2e"
KEEP_REPLACED_SECONDS = 10  # short, so the test sees the replaced schedule go


@dataclass
class Stack:
    cluster: LocalCluster
    logs: Path
    synth: T.Proc
    synth_port: int
    operator: T.Proc
    ports: T.OperatorPorts
    ns: str
    nodes: list[str]

    def start_operator(self) -> None:
        self.operator, self.ports = T.start_operator(
            self.logs / "operator.log", self.cluster.info.kubeconfig,
            f"127.0.0.1:{self.synth_port}", self.logs / "certs",
            extra=["--webhook-config", WEBHOOK, "--debounce", "0.5", "--keep-replaced",
                   str(KEEP_REPLACED_SECONDS)], ports=self.ports)

    def start_synthesizer(self) -> None:
        self.synth, _ = T.start_synthesizer(self.logs / "synth.log", port=self.synth_port)

    def job(self, name: str) -> dict[str, Any]:
        return dict(self.cluster.client.get(f"{GROUP}/namespaces/{self.ns}/collectivejobs/{name}"))

    def configmaps(self, job: str) -> dict[str, dict[str, Any]]:
        items = self.cluster.client.get(f"/api/v1/namespaces/{self.ns}/configmaps?labelSelector="
                                        f"choreo.dev/collectivejob={job}")["items"]
        return {cm["metadata"]["name"]: cm for cm in items}

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.ports.metrics}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode())

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        for c in self.job(name).get("status", {}).get("conditions", []):
            if c["type"] == kind:
                return dict(c)
        return None

    def wait_status(self, name: str, what: str, check: Any, timeout: float = 60.0) -> Any:
        try:
            return self.cluster.wait_for(lambda: check(self.job(name).get("status") or {}),
                                         f"{name}: {what}", timeout=timeout)
        except Exception as err:
            status = json.dumps(self.job(name).get("status"), indent=1)[:3000]
            raise AssertionError(f"{err}\nstatus: {status}{self.fail_message()}") from None

    def fail_message(self) -> str:
        return (f"\n--- operator log ---\n{T.tail(self.operator.log, 40)}"
                f"\n--- synthesizer log ---\n{T.tail(self.synth.log, 15)}")


def _pod(name: str, node: str, labels: dict[str, str], gpus: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "containers": [{
                "name": "train", "image": "trainer:latest",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def _job(name: str, selector: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "choreo.dev/v1alpha1", "kind": "CollectiveJob",
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": selector},
                     "collectives": [{"name": "grads", "collective": "allreduce",
                                      "minBytes": 1 << 20, "maxBytes": 1 << 26}], **extra}}


@pytest.fixture(scope="module")
def stack(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("operator")
    nodes, ns = T.prepare_cluster(cluster, "op", webhook=WEBHOOK)
    synth, synth_port = T.start_synthesizer(logs / "synth.log")
    st = Stack(cluster, logs, synth, synth_port, synth, T.OperatorPorts(listen_port(),
                                                                        listen_port()), ns, nodes)
    try:
        st.start_operator()
        yield st
    finally:
        st.operator.stop()
        st.synth.stop()
        for path in (f"{GROUP}/fabrictopologies/op",
                     f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{WEBHOOK}"):
            with contextlib.suppress(ApiException):
                cluster.client.delete(path)
    assert not st.operator.alive() and not st.synth.alive()


@pytest.fixture(scope="module")
def tenants(stack: Stack) -> Stack:
    """Two tenants, 4 GPUs on each of the two nodes; their nodes share one NIC and rail."""
    for tenant in ("ta", "tb"):
        stack.cluster.kubectl("apply", "-n", stack.ns, "-f", "-",
                              stdin=json.dumps(_job(tenant, {"tenant": tenant})))
        for rank, node in enumerate(stack.nodes):
            pod = _pod(f"{tenant}-{rank}", node, {
                "tenant": tenant, "batch.kubernetes.io/job-completion-index": str(rank)}, 4)
            stack.cluster.kubectl("apply", "-n", stack.ns, "-f", "-", stdin=json.dumps(pod))
    for tenant in ("ta", "tb"):
        stack.wait_status(tenant, "Ready", lambda s: s.get("phase") == "Ready", timeout=90)
    return stack


def test_two_tenants_sharing_links_get_verified_schedules(tenants: Stack) -> None:
    st = tenants
    hashes = set()
    for tenant in ("ta", "tb"):
        status = st.job(tenant)["status"]
        assert status["ranks"] == 8, st.fail_message()
        assert status["nodes"] == sorted(st.nodes)
        assert status["lastSynthesis"]["engine"]
        hashes.add(status["lastSynthesis"]["inputsHash"])
        ready = st.condition(tenant, "Ready")
        assert ready is not None and ready["status"] == "True"
        assert ready["observedGeneration"] == st.job(tenant)["metadata"]["generation"]
        coll = status["collectives"][0]
        assert coll["name"] == "grads" and coll["predictedBusBandwidthBytesPerSecond"] > 0
        assert 0 < coll["fractionOfBound"] <= 1.0 + 1e-9
        # against NCCL as it runs, and who runs each size range: NCCL where it is faster
        assert coll["speedupVsNccl"] > 0 and coll["ncclChoice"], coll
        sizes = coll["sizes"]
        assert sizes[0]["minBytes"] == 1 << 20 and sizes[-1]["maxBytes"] == 1 << 26
        assert all(a["maxBytes"] + 1 == b["minBytes"] for a, b in itertools.pairwise(sizes))
        assert all((r["runs"] == "NCCL") == (r["speedupVsNccl"] < 1) for r in sizes), sizes
        assert len(status["files"]) == sum(r["runs"] == "choreo" for r in sizes)
        cms = st.configmaps(tenant)
        cm = cms[status["configMap"]]
        assert cm["immutable"] is True
        assert cm["metadata"]["ownerReferences"][0]["uid"] == st.job(tenant)["metadata"]["uid"]
        ranks = json.loads(cm["data"]["ranks.json"])
        assert [r["rank"] for r in ranks] == list(range(8))
        assert {(r["node"], r["gpu"]) for r in ranks} == {
            (n, g) for n in st.nodes for g in (range(4) if tenant == "ta" else range(4, 8))}
        xml_keys = [k for k in cm["data"] if k.endswith(".xml")]
        assert xml_keys and sorted(xml_keys) == status["files"]
        for key in xml_keys:
            xml = cm["data"][key]
            assert msccl.validate(xml) == [], key
            run = msccl.run(xml)
            assert run.ngpus == 8 and not run.errors and not run.stalls, key
    # one synthesis group: the same inputs hash, and each names the other in its condition
    assert len(hashes) == 1
    for tenant, other in (("ta", "tb"), ("tb", "ta")):
        ready = st.condition(tenant, "Ready")
        assert ready is not None and f"{st.ns}/{other}" in ready["message"]
    text = st.metrics()
    for tenant in ("ta", "tb"):
        assert (T.metric(text, "choreo_tenant_predicted_busbw_bytes_per_second",
                         namespace=st.ns, job=tenant, collective="grads") or 0) > 0
        assert (T.metric(text, "choreo_tenant_bound_fraction", namespace=st.ns, job=tenant,
                         collective="grads") or 0) > 0
        assert (T.metric(text, "choreo_tenant_predicted_speedup_vs_nccl", namespace=st.ns,
                         job=tenant, collective="grads") or 0) > 0
        ranges = [T.metric(text, "choreo_tenant_size_ranges", namespace=st.ns, job=tenant,
                           collective="grads", runs=runs) for runs in ("choreo", "nccl")]
        assert None not in ranges and sum(ranges) == len(  # type: ignore[arg-type]
            st.job(tenant)["status"]["collectives"][0]["sizes"])
    assert (T.metric(text, "choreo_tenants", phase="Ready") or 0) >= 2
    assert (T.metric(text, "choreo_resynthesis_latency_seconds_count") or 0) >= 1


def test_job_pods_get_schedule_volume_and_env(tenants: Stack) -> None:
    st = tenants
    cm = st.job("ta")["status"]["configMap"]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "ta-train"},
           "spec": {"completionMode": "Indexed", "completions": 1, "parallelism": 1,
                    "template": {"metadata": {"labels": {"tenant": "ta"}},
                                 "spec": {"restartPolicy": "Never", "containers": [{
                                     "name": "train", "image": "trainer:latest",
                                     "env": [{"name": "NCCL_ALGO", "value": "MSCCL,RING"}]}]}}}}
    st.cluster.kubectl("apply", "-n", st.ns, "-f", "-", stdin=json.dumps(job))

    def pod() -> dict[str, Any] | None:
        items = st.cluster.client.get(f"/api/v1/namespaces/{st.ns}/pods?labelSelector="
                                      "job-name=ta-train")["items"]
        return items[0] if items else None

    created = st.cluster.wait_for(pod, "the Job's pod", timeout=60)
    volumes = {v["name"]: v for v in created["spec"]["volumes"]}
    assert volumes["choreo-schedule"]["configMap"]["name"] == cm, st.fail_message()
    items = volumes["choreo-schedule"]["configMap"]["items"]
    assert {i["path"] for i in items} == {f"msccl/{k}" for k in st.job("ta")["status"]["files"]
                                          } | {"ranks.json"}
    container = created["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MSCCL_ALGO_DIR"] == "/etc/choreo/msccl"  # the executor reads the folder
    assert "MSCCL_XML_FILES" not in env  # only the legacy runtime reads a list
    assert env["NCCL_ALGO"] == "MSCCL,RING"  # the pod's own setting wins
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["choreo-schedule"]["mountPath"] == "/etc/choreo"
    assert created["metadata"]["annotations"]["choreo.dev/schedule"] == cm
    st.cluster.client.request("DELETE", f"/apis/batch/v1/namespaces/{st.ns}/jobs/ta-train"
                              "?propagationPolicy=Background")


def test_device_failure_resynthesizes_around_the_gpu_and_resolving_restores(
        tenants: Stack) -> None:
    st = tenants
    before = st.job("ta")["status"]
    original_uid = st.configmaps("ta")[before["configMap"]]["metadata"]["uid"]
    untouched = st.job("tb")["status"]["configMap"]
    node = st.nodes[1]
    st.cluster.apply({"apiVersion": "choreo.dev/v1alpha1", "kind": "DeviceFailure",
                      "metadata": {"name": "e2e-gpu"},
                      "spec": {"node": node, "device": {"type": "gpu", "gpu": 2},
                               "source": "manual", "reason": "Xid 79"}})
    after = st.wait_status("ta", "a new schedule without the failed GPU",
                           lambda s: s if s.get("configMap") not in (None, before["configMap"])
                           and s.get("ranks") == 7 else None, timeout=60)
    cm = st.configmaps("ta")[after["configMap"]]
    ranks = json.loads(cm["data"]["ranks.json"])
    assert (node, 2) not in {(r["node"], r["gpu"]) for r in ranks}
    assert len(ranks) == 7
    for key in after["files"]:
        run = msccl.run(cm["data"][key])
        assert run.ngpus == 7 and not run.errors and not run.stalls
    degraded = st.condition("ta", "Degraded")
    assert degraded is not None and degraded["reason"] == "DevicesFailed"
    failure = st.cluster.client.get(f"{GROUP}/devicefailures/e2e-gpu")
    assert failure["status"]["affected"] == [f"{st.ns}/ta"]
    assert st.job("tb")["status"]["ranks"] == 8

    st.cluster.client.merge_patch(f"{GROUP}/devicefailures/e2e-gpu", {"spec": {"resolved": True}})
    restored = st.wait_status("ta", "the original schedule back",
                              lambda s: s if s.get("configMap") == before["configMap"]
                              and s.get("phase") == "Ready" else None, timeout=60)
    assert restored["ranks"] == 8
    # The group's inputs are the original ones again, so the tenant that shares its links
    # gets its original schedule back too (published after ``ta``'s, so waited for).
    st.wait_status("tb", "its original schedule back",
                   lambda s: s if s.get("configMap") == untouched
                   and s.get("phase") == "Ready" else None, timeout=60)
    # The original schedule stayed while replaced, so it came back without a write; the one it
    # replaced in turn stays for the window, then goes (no pod mounts it).
    maps = st.configmaps("ta")
    assert maps[before["configMap"]]["metadata"]["uid"] == original_uid
    assert after["configMap"] in maps
    st.cluster.wait_for(lambda: after["configMap"] not in st.configmaps("ta"),
                        "the superseded ConfigMap to be deleted",
                        timeout=KEEP_REPLACED_SECONDS + 30)
    st.cluster.client.delete(f"{GROUP}/devicefailures/e2e-gpu")


def test_burst_of_failures_causes_one_resynthesis_per_group(tenants: Stack) -> None:
    st = tenants
    before = T.metric(st.metrics(), "choreo_resynthesis_total", reason="failure",
                      result="ok") or 0
    node = st.nodes[0]
    for i in range(20):
        st.cluster.client.create(f"{GROUP}/devicefailures", {
            "apiVersion": "choreo.dev/v1alpha1", "kind": "DeviceFailure",
            "metadata": {"name": f"e2e-burst-{i}"},
            "spec": {"node": node, "device": {"type": "link", "gpu": i % 8,
                                              "peerGPU": (i + 1) % 8},
                     "source": "agent", "reason": "burst"}})
        time.sleep(0.04)
    st.cluster.wait_for(
        lambda: st.cluster.client.get(f"{GROUP}/devicefailures/e2e-burst-19").get("status"),
        "the burst to be seen", timeout=30)
    time.sleep(2.0)
    after = T.metric(st.metrics(), "choreo_resynthesis_total", reason="failure",
                     result="ok") or 0
    # DGX-H100 GPUs have no direct GPU-to-GPU links: these link failures name nothing,
    # so no schedule changes; each failure says so in its status instead of crashing anything
    status = st.cluster.client.get(f"{GROUP}/devicefailures/e2e-burst-3")["status"]
    applied = status["conditions"][0]
    assert applied["status"] == "False" and applied["reason"] == "UnknownDevice"
    assert after == before
    for i in range(20):
        st.cluster.client.delete(f"{GROUP}/devicefailures/e2e-burst-{i}")
    # now a real burst: 20 GPU failures within a second, hitting both tenants (one group)
    for i in range(20):
        st.cluster.client.create(f"{GROUP}/devicefailures", {
            "apiVersion": "choreo.dev/v1alpha1", "kind": "DeviceFailure",
            "metadata": {"name": f"e2e-burst-gpu-{i}"},
            "spec": {"node": st.nodes[i % 2], "device": {"type": "gpu", "gpu": (0, 1, 4, 5)[
                (i // 2) % 4]}, "source": "agent", "reason": "burst"}})
        time.sleep(0.04)
    for tenant in ("ta", "tb"):
        st.wait_status(tenant, "4 surviving ranks", lambda s: s.get("ranks") == 4, timeout=60)
    time.sleep(1.0)
    text = st.metrics()
    total = T.metric(text, "choreo_resynthesis_total", reason="failure", result="ok") or 0
    stale = T.metric(text, "choreo_resynthesis_total", reason="failure", result="stale") or 0
    assert (total - after, stale) == (1, 0), st.fail_message()
    for i in range(20):
        st.cluster.client.delete(f"{GROUP}/devicefailures/e2e-burst-gpu-{i}")
    for tenant in ("ta", "tb"):
        st.wait_status(tenant, "recovered", lambda s: s.get("phase") == "Ready"
                       and s.get("ranks") == 8, timeout=60)


def test_synthesizer_down_gives_degraded_and_recovers(tenants: Stack) -> None:
    st = tenants
    good = st.job("ta")["status"]["configMap"]
    st.synth.stop()
    st.cluster.apply({"apiVersion": "choreo.dev/v1alpha1", "kind": "DeviceFailure",
                      "metadata": {"name": "e2e-down"},
                      "spec": {"node": st.nodes[0], "device": {"type": "gpu", "gpu": 1},
                               "source": "manual"}})
    try:
        st.wait_status("ta", "Degraded", lambda s: s.get("phase") == "Degraded", timeout=60)
        degraded = st.condition("ta", "Degraded")
        assert degraded is not None and degraded["reason"] == "SynthesizerUnavailable"
        assert st.job("ta")["status"]["configMap"] == good  # last good schedule kept
        assert good in st.configmaps("ta")
    finally:
        st.start_synthesizer()
    recovered = st.wait_status("ta", "a schedule from the restarted synthesizer",
                               lambda s: s if s.get("phase") == "Degraded"
                               and s.get("ranks") == 7 and s.get("configMap") != good
                               else None, timeout=90)
    assert st.condition("ta", "Degraded")["reason"] == "DevicesFailed"  # type: ignore[index]
    assert recovered["lastSynthesis"]["reason"]
    st.cluster.client.delete(f"{GROUP}/devicefailures/e2e-down")
    st.wait_status("ta", "Ready again", lambda s: s.get("phase") == "Ready"
                   and s.get("configMap") == good, timeout=60)


def test_infeasible_tenant_keeps_its_schedule(tenants: Stack) -> None:
    st = tenants
    good = st.job("ta")["status"]["configMap"]
    st.cluster.apply({"apiVersion": "choreo.dev/v1alpha1", "kind": "DeviceFailure",
                      "metadata": {"name": "e2e-nic"},
                      "spec": {"node": st.nodes[1], "device": {"type": "nic", "nic": "nic0"},
                               "source": "manual"}})
    st.wait_status("ta", "Infeasible", lambda s: s.get("phase") == "Infeasible", timeout=60)
    infeasible = st.condition("ta", "Infeasible")
    assert infeasible is not None and infeasible["reason"] == "TenantDisconnected"
    assert "disconnected" in infeasible["message"]
    assert st.job("ta")["status"]["configMap"] == good
    assert good in st.configmaps("ta")
    st.cluster.client.delete(f"{GROUP}/devicefailures/e2e-nic")
    st.wait_status("ta", "Ready again", lambda s: s.get("phase") == "Ready", timeout=60)


def test_unknown_node_sets_a_condition(tenants: Stack) -> None:
    st = tenants
    outside = st.cluster.add_nodes(1, gpus=8, prefix="stray")[0]
    st.cluster.kubectl("apply", "-n", st.ns, "-f", "-",
                       stdin=json.dumps(_job("stray", {"tenant": "stray"})))
    for rank in range(2):
        st.cluster.kubectl("apply", "-n", st.ns, "-f", "-", stdin=json.dumps(_pod(
            f"stray-{rank}", outside, {"tenant": "stray",
                                       "batch.kubernetes.io/job-completion-index": str(rank)},
            4)))
    status = st.wait_status("stray", "a placement condition",
                            lambda s: s if s.get("conditions") else None, timeout=60)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "UnknownNode"
    assert outside in ready["message"]
    assert status["phase"] == "Pending"
    assert st.operator.alive()
    assert st.job("ta")["status"]["phase"] == "Ready"


def test_operator_killed_mid_resynthesis_converges(tenants: Stack) -> None:
    st = tenants
    before = st.job("ta")["status"]["configMap"]
    st.cluster.apply({"apiVersion": "choreo.dev/v1alpha1", "kind": "DeviceFailure",
                      "metadata": {"name": "e2e-kill"},
                      "spec": {"node": st.nodes[0], "device": {"type": "gpu", "gpu": 3},
                               "source": "manual"}})
    st.cluster.wait_for(lambda: (st.condition("ta", "Synthesizing") or {}).get("status")
                        == "True" or st.job("ta")["status"].get("ranks") == 7,
                        "the resynthesis to start", timeout=30)
    st.operator.kill()
    st.start_operator()
    after = st.wait_status("ta", "converged after the restart",
                           lambda s: s if s.get("ranks") == 7 and s.get("phase") == "Degraded"
                           and (next((c for c in s["conditions"] if c["type"] == "Synthesizing"),
                                     {}).get("status") == "False") else None, timeout=90)
    assert before != after["configMap"]
    assert after["configMap"] in st.configmaps("ta")
    # Nothing stray once the replaced schedules' window has passed: the new schedule only.
    st.cluster.wait_for(lambda: set(st.configmaps("ta")) - {"ta-schedule"}
                        == {after["configMap"]}, "the replaced schedules to be collected",
                        timeout=KEEP_REPLACED_SECONDS + 30)
    st.cluster.client.delete(f"{GROUP}/devicefailures/e2e-kill")
    st.wait_status("ta", "Ready again", lambda s: s.get("configMap") == before
                   and s.get("phase") == "Ready", timeout=60)


def test_a_failed_link_to_the_nvswitch_takes_that_link_down(tenants: Stack) -> None:
    """``device.switch`` names a GPU's link to its NVSwitch (as the agent reports it): the
    operator applies it and resynthesizes; it is not read as a GPU pair."""
    st = tenants
    before = st.job("ta")["status"]
    st.cluster.apply({"apiVersion": "choreo.dev/v1alpha1", "kind": "DeviceFailure",
                      "metadata": {"name": "e2e-nvlink"},
                      "spec": {"node": st.nodes[0], "device": {"type": "link", "gpu": 1,
                                                              "switch": "sw-nvswitch"},
                               "source": "manual"}})

    def applied() -> dict[str, Any] | None:
        s = st.cluster.client.get(f"{GROUP}/devicefailures/e2e-nvlink").get("status") or {}
        return s if s.get("conditions") else None

    failure = st.cluster.wait_for(applied, "the failure's status", timeout=60)
    cond = next(c for c in failure["conditions"] if c["type"] == "Applied")
    assert cond["status"] == "True", cond
    assert failure["affected"] == [f"{st.ns}/ta"]
    after = st.wait_status(
        "ta", "a schedule for the fabric without the link",
        lambda s: s if s.get("lastSynthesis", {}).get("fabricFingerprint")
        != before["lastSynthesis"]["fabricFingerprint"] and s.get("phase") == "Ready" else None,
        timeout=60)
    assert after["ranks"] == 8  # the GPU keeps its other NVLinks and stays in the schedule
    st.cluster.client.delete(f"{GROUP}/devicefailures/e2e-nvlink")
    st.wait_status("ta", "the original schedule back",
                   lambda s: s.get("configMap") == before["configMap"]
                   and s.get("phase") == "Ready", timeout=60)


def test_deleting_a_job_drops_its_metric_series(tenants: Stack) -> None:
    st = tenants
    series = ("choreo_tenant_predicted_busbw_bytes_per_second",
              "choreo_tenant_bound_fraction", "choreo_tenant_predicted_speedup_vs_nccl")

    def present() -> list[str]:
        text = st.metrics()
        return [s for s in series if T.metric(text, s, namespace=st.ns, job="tb",
                                              collective="grads") is not None]

    assert present() == list(series)
    st.cluster.client.delete(f"{GROUP}/namespaces/{st.ns}/collectivejobs/tb")
    st.cluster.wait_for(lambda: not present() or None, "tb's series to go", timeout=60)
    text = st.metrics()
    assert T.metric(text, "choreo_tenant_size_ranges", namespace=st.ns, job="tb",
                    collective="grads", runs="choreo") is None
    assert T.metric(text, "choreo_tenant_bound_fraction", namespace=st.ns, job="ta",
                    collective="grads") is not None
