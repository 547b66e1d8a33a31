"""FabricTopology spec.source end to end: Topograph labels, a Kueue Topology and Volcano
HyperNodes on a real API server give the operator the fabric a hand-written FabricTopology
gives for the same cluster, and the operator follows the source as it changes.

The Kueue and Volcano CRDs (minimal copies under testdata/) exist before the operator starts,
as kopf only serves resources it finds at startup. The operator reads the FabricTopology
named first, and its status cache outlives a deleted FabricTopology, so each phase creates
the same name on a freshly started operator: equal status fingerprints then mean equal
FabricTopologies as the operator reads them (nodes, positions, blocks, inter-node model) and
so equal fabrics.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from choreo_dev import observe
from choreo_dev import operator_testing as T
from choreo_dev.kube import ApiException
from choreo_dev.testing import LocalCluster
from choreo_operator import model

pytestmark = pytest.mark.e2e

GROUP = "/apis/choreo.dev/v1alpha1"
TESTDATA = Path(__file__).parent / "testdata"
CRDS = ("kueue-topology-crd.yaml", "volcano-hypernode-crd.yaml")
BLOCK = "network.topology.nvidia.com/block"
SPINE = "network.topology.nvidia.com/spine"
ROW, RACK = "e2e.choreo.dev/row", "e2e.choreo.dev/rack"
INTER = {"type": "rail", "rails": 8, "spineOversubscription": 2}
NAME = "0-fabric-sources"  # sorts before any other FabricTopology: the one the operator uses


@dataclass
class World:
    cluster: LocalCluster
    logs: Path
    blocks: dict[str, str]  # node -> block
    kueue: str
    hypernodes: list[str]
    operator: T.Proc | None = None

    def fabric(self, spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "choreo.dev/v1alpha1", "kind": "FabricTopology",
                "metadata": {"name": NAME},
                "spec": {"intraNode": {"preset": "dgx-h100"}, "interNode": INTER, **spec}}

    def status(self) -> dict[str, Any]:
        try:
            return dict(self.cluster.client.get(f"{GROUP}/fabrictopologies/{NAME}").get(
                "status") or {})
        except ApiException:
            return {}

    def wait(self, what: str, check: Any, timeout: float = 30.0) -> dict[str, Any]:
        try:
            found: dict[str, Any] = self.cluster.wait_for(
                lambda: (lambda s: s if s.get("fingerprint") and check(s) else None)(
                    self.status()), what, timeout=timeout)
            return found
        except Exception as err:
            log = T.tail(self.operator.log, 30) if self.operator else ""
            raise AssertionError(f"{err}\nstatus: {self.status()}\n--- operator ---\n{log}") \
                from None

    @contextlib.contextmanager
    def phase(self, spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """A fresh operator and the FabricTopology ``spec``; its first status."""
        self.operator, _ = T.start_operator(
            self.logs / "operator.log", self.cluster.info.kubeconfig, "127.0.0.1:1",
            self.logs / "certs", webhook=False, extra=["--debounce", "0.2"])
        try:
            self.cluster.apply(self.fabric(spec))
            yield self.wait("the fabric is built", lambda s: s.get("observedGeneration") == 1)
        finally:
            self.operator.stop()
            with contextlib.suppress(ApiException):
                self.cluster.client.delete(f"{GROUP}/fabrictopologies/{NAME}")
            self.cluster.wait_for(lambda: not _exists(self.cluster), "FabricTopology deleted",
                                  timeout=30)

    def label(self, node: str, labels: dict[str, str | None]) -> None:
        self.cluster.client.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": labels}})


def _exists(cluster: LocalCluster) -> bool:
    try:
        cluster.client.get(f"{GROUP}/fabrictopologies/{NAME}")
        return True
    except ApiException:
        return False


def _ready(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == "Ready")


@pytest.fixture(scope="module")
def world(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    for crd in T.crd_documents():
        cluster.kubectl("apply", "-f", str(crd))
    for name in CRDS:
        cluster.kubectl("apply", "-f", str(TESTDATA / name))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    # two leaf switches; the nodes of leaf-a have the later names, so (block, name) order
    # differs from name order
    blocks: dict[str, str] = {}
    for prefix, leaf in (("srcz", "leaf-a"), ("srcy", "leaf-b")):
        for node in cluster.add_nodes(2, gpus=8, prefix=prefix, labels={
                BLOCK: leaf, SPINE: "spine-1", ROW: "row-1", RACK: leaf}):
            blocks[node] = leaf
    a0, a1 = sorted(blocks, key=lambda n: (blocks[n], n))[:2]
    kueue = cluster.unique("tas")
    cluster.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Topology",
                   "metadata": {"name": kueue}, "spec": {"levels": [
                       {"nodeLabel": ROW}, {"nodeLabel": RACK},
                       {"nodeLabel": "kubernetes.io/hostname"}]}})
    members = {
        "leaf-a": [{"type": "Node", "selector": {"exactMatch": {"name": a0}}},
                   {"type": "Node", "selector": {"regexMatch": {"pattern": f"^{a1}$"}}}],
        "leaf-b": [{"type": "Node", "selector": {"labelMatch": {"matchLabels": {
            RACK: "leaf-b"}}}}],
    }
    for name, mine in members.items():
        cluster.apply({"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
                       "metadata": {"name": name}, "spec": {"tier": 1, "members": mine}})
    cluster.apply({"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
                   "metadata": {"name": "spine-1"}, "spec": {"tier": 2, "members": [
                       {"type": "HyperNode", "selector": {"exactMatch": {"name": n}}}
                       for n in members]}})
    w = World(cluster, tmp_path_factory.mktemp("sources"), blocks, kueue,
              [*members, "spine-1"])
    try:
        yield w
    finally:
        if w.operator is not None:
            w.operator.stop()
        paths = [f"/apis/kueue.x-k8s.io/v1beta1/topologies/{kueue}",
                 *(f"/apis/topology.volcano.sh/v1alpha1/hypernodes/{h}"
                   for h in [*w.hypernodes, "leaf-x"]),
                 f"{GROUP}/fabrictopologies/{NAME}"]
        for path in paths:
            with contextlib.suppress(ApiException):
                cluster.client.delete(path)
        # later modules' operators run with the shipped ClusterRole: leave no foreign CRDs
        for name in CRDS:
            cluster.kubectl("delete", "--wait=true", "--ignore-not-found", "-f",
                            str(TESTDATA / name))
    assert w.operator is None or not w.operator.alive()


def test_each_source_gives_the_hand_written_fabric_and_follows_changes(world: World) -> None:
    w = world
    order = sorted(w.blocks, key=lambda n: (w.blocks[n], n))
    hand_spec = {"nodes": [{"name": n, "position": i, "block": w.blocks[n]}
                           for i, n in enumerate(order)]}
    with w.phase(hand_spec) as hand:
        assert hand["nodes"] == 4 and hand["gpus"] == 32 and _ready(hand)["status"] == "True"
        written = model.fabric_topology(
            w.cluster.client.get(f"{GROUP}/fabrictopologies/{NAME}"))
    selector = {"matchLabels": {"nvidia.com/gpu.present": "true"}}
    for source in ({"topograph": {}}, {"kueue": {"topology": w.kueue}}, {"volcano": {}}):
        with w.phase({"source": {**source, "nodeSelector": selector}}) as got:
            assert {k: got[k] for k in ("nodes", "gpus", "fingerprint")} == {
                k: hand[k] for k in ("nodes", "gpus", "fingerprint")}, (source, got)
            assert _ready(got)["status"] == "True", got
            # the offline planner of the demo and scenarios resolves sources the same way
            seen = [f for f in observe.read_inputs(w.cluster.client).fabrics if f.name == NAME]
            assert seen == [written]
            if "topograph" in source:
                # a node moved to the other leaf switch: a new fabric
                w.label(order[0], {BLOCK: "leaf-b"})
                moved = w.wait("the relabelled node moves",
                               lambda s: s["fingerprint"] != hand["fingerprint"])
                assert moved["nodes"] == 4 and _ready(moved)["status"] == "True"
                w.label(order[0], {BLOCK: "leaf-a"})
                w.wait("the node moves back", lambda s: s["fingerprint"] == hand["fingerprint"])
            if "volcano" in source:
                # a second tier-1 HyperNode claims a node: reported, the last fabric kept
                w.cluster.apply({"apiVersion": "topology.volcano.sh/v1alpha1",
                                 "kind": "HyperNode", "metadata": {"name": "leaf-x"},
                                 "spec": {"tier": 1, "members": [
                                     {"type": "Node", "selector": {"exactMatch": {
                                         "name": order[3]}}}]}})
                bad = w.wait("the conflict is reported",
                             lambda s: _ready(s)["status"] == "False")
                message = _ready(bad)["message"]
                assert f"node {order[3]} is in tier-1 HyperNodes leaf-b, leaf-x" in message
                assert "kept in block leaf-b" in message
                assert {k: bad[k] for k in ("nodes", "gpus", "fingerprint")} == {
                    k: hand[k] for k in ("nodes", "gpus", "fingerprint")}
