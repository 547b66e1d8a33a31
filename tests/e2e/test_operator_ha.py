"""Two operator replicas, one Lease: the standby takes over when the active one dies or leaves.

Real API server, real `choreo serve`, both operators as subprocesses (stopped by PID). The
active replica is SIGKILLed and a DeviceFailure created right after must still get its new
ConfigMap, written by the standby alone, with no ConfigMap lost or left over.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from choreo_dev import operator_testing as T
from choreo_dev.kube import ApiException
from choreo_dev.testing import LocalCluster

pytestmark = pytest.mark.e2e

GROUP = "/apis/choreo.dev/v1alpha1"
LEASE = "/apis/coordination.k8s.io/v1/namespaces/default/leases/choreo-ha-e2e"
TAKEOVER_TARGET_S = 15.0
KEEP_REPLACED_SECONDS = 5  # short, so the test sees the superseded schedule go


@dataclass
class Replica:
    identity: str
    proc: T.Proc
    ports: T.OperatorPorts

    def leading(self) -> bool:
        url = f"http://127.0.0.1:{self.ports.metrics}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            return False
        return T.metric(text, "choreo_operator_leader") == 1.0

    def wrote(self) -> bool:
        return "published" in self.proc.log.read_text(errors="replace")


@dataclass
class HA:
    cluster: LocalCluster
    logs: Path
    synth: str
    ns: str
    nodes: list[str]
    replicas: dict[str, Replica]

    def start(self, identity: str) -> Replica:
        proc, ports = T.start_operator(
            self.logs / f"operator-{identity}.log", self.cluster.info.kubeconfig, self.synth,
            self.logs / "certs", webhook=False,
            extra=["--identity", identity, "--lease-name", "choreo-ha-e2e",
                   "--lease-namespace", "default", "--debounce", "0.2",
                   "--keep-replaced", str(KEEP_REPLACED_SECONDS)])
        self.replicas[identity] = Replica(identity, proc, ports)
        return self.replicas[identity]

    def status(self) -> dict[str, Any]:
        job = self.cluster.client.get(f"{GROUP}/namespaces/{self.ns}/collectivejobs/ha")
        return dict(job.get("status") or {})

    def schedules(self) -> list[str]:
        items = self.cluster.client.get(f"/api/v1/namespaces/{self.ns}/configmaps?labelSelector="
                                        "choreo.dev/collectivejob=ha")["items"]
        return sorted(cm["metadata"]["name"] for cm in items
                      if cm["metadata"]["name"] != "ha-schedule")

    def logs_tail(self) -> str:
        return "".join(f"\n--- {r.identity} ---\n{T.tail(r.proc.log, 25)}"
                       for r in self.replicas.values())


@pytest.fixture(scope="module")
def ha(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HA]:
    logs = tmp_path_factory.mktemp("operator-ha")
    nodes, ns = T.prepare_cluster(cluster, "ha")
    cluster.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps({
        "apiVersion": "choreo.dev/v1alpha1", "kind": "CollectiveJob", "metadata": {"name": "ha"},
        "spec": {"selector": {"matchLabels": {"tenant": "ha"}},
                 "collectives": [{"name": "grads", "collective": "allreduce",
                                  "minBytes": 1 << 20, "maxBytes": 1 << 26}]}}))
    for rank, node in enumerate(nodes):
        cluster.kubectl("apply", "-n", ns, "-f", "-",
                        stdin=json.dumps(T.tenant_pod(f"ha-{rank}", node, "ha", rank)))
    synth, port = T.start_synthesizer(logs / "synth.log")
    state = HA(cluster, logs, f"127.0.0.1:{port}", ns, nodes, {})
    try:
        yield state
    finally:
        for r in state.replicas.values():
            r.proc.stop()
        synth.stop()
        for path in (f"{GROUP}/fabrictopologies/ha", f"{GROUP}/devicefailures/ha-gpu", LEASE):
            with contextlib.suppress(ApiException):
                cluster.client.delete(path)
    assert not any(r.proc.alive() for r in state.replicas.values()) and not synth.alive()


def test_one_replica_leads_and_the_standby_takes_over_a_kill(ha: HA) -> None:
    a = ha.start("ha-a")
    ha.cluster.wait_for(a.leading, "ha-a to lead", timeout=30)
    first = ha.cluster.wait_for(lambda: ha.status() if ha.status().get("phase") == "Ready"
                                else None, "the tenant Ready", timeout=90)
    b = ha.start("ha-b")
    time.sleep(3.0)  # several election rounds: the standby must stay one
    assert a.leading() and not b.leading(), ha.logs_tail()
    assert not b.wrote()

    a.proc.kill()
    killed = time.monotonic()
    ha.cluster.apply({"apiVersion": "choreo.dev/v1alpha1", "kind": "DeviceFailure",
                      "metadata": {"name": "ha-gpu"},
                      "spec": {"node": ha.nodes[1], "device": {"type": "gpu", "gpu": 5},
                               "source": "manual"}})
    try:
        after = ha.cluster.wait_for(
            lambda: ha.status() if ha.status().get("ranks") == 15
            and ha.status().get("configMap") != first["configMap"] else None,
            "a new schedule from the standby", timeout=60)
    except Exception as err:
        raise AssertionError(f"{err}{ha.logs_tail()}") from None
    takeover = time.monotonic() - killed
    print(f"operator takeover: kill -> new ConfigMap {takeover:.1f} s "
          f"(target {TAKEOVER_TARGET_S:.0f} s)")
    assert b.leading() and b.wrote()
    lease = ha.cluster.client.get(LEASE)["spec"]
    assert lease["holderIdentity"] == "ha-b" and lease["leaseTransitions"] >= 1
    assert after["configMap"] in ha.schedules()
    ha.cluster.wait_for(lambda: ha.schedules() == [after["configMap"]],
                        "the superseded ConfigMap collected, nothing else left",
                        timeout=KEEP_REPLACED_SECONDS + 30)


def test_a_clean_shutdown_hands_the_lease_over_at_once(ha: HA) -> None:
    b = ha.replicas["ha-b"]
    a = ha.start("ha-a")  # back as a standby
    time.sleep(2.0)
    assert b.leading() and not a.leading()
    before = ha.status()["configMap"]
    b.proc.stop()  # SIGTERM: stop reconciling, release the Lease
    left = time.monotonic()
    ha.cluster.wait_for(a.leading, "ha-a to lead after the release", timeout=30)
    handover = time.monotonic() - left
    print(f"operator handover after SIGTERM: {handover:.1f} s")
    assert handover < 8.0  # well inside the 8 s lease a kill must wait out
    ha.cluster.client.merge_patch(f"{GROUP}/devicefailures/ha-gpu", {"spec": {"resolved": True}})
    ha.cluster.wait_for(lambda: ha.status().get("configMap") not in (None, before)
                        and ha.status().get("ranks") == 16, "the new leader resynthesizes",
                        timeout=60)
