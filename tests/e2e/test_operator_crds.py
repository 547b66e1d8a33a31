"""Invalid CRs are rejected by the API server with a message naming the field."""

from __future__ import annotations

import json

import pytest

from choreo_dev import operator_testing as T
from choreo_dev.errors import DevClusterError
from choreo_dev.testing import LocalCluster

pytestmark = pytest.mark.e2e

BAD = [
    ({"kind": "CollectiveJob", "metadata": {"name": "bad-range", "namespace": "default"},
      "spec": {"selector": {"matchLabels": {"a": "b"}}, "collectives": [
          {"name": "x", "collective": "allreduce", "minBytes": 10, "maxBytes": 5}]}},
     ["spec.collectives[0]", "minBytes must not exceed maxBytes"]),
    ({"kind": "CollectiveJob", "metadata": {"name": "bad-coll", "namespace": "default"},
      "spec": {"selector": {"matchLabels": {"a": "b"}}, "collectives": [
          {"name": "x", "collective": "allsum", "minBytes": 1, "maxBytes": 5}]}},
     ["spec.collectives[0].collective", "allsum"]),
    ({"kind": "CollectiveJob", "metadata": {"name": "bad-sel", "namespace": "default"},
      "spec": {"selector": {}, "collectives": [
          {"name": "x", "collective": "allreduce", "minBytes": 1, "maxBytes": 5}]}},
     ["spec.selector", "the selector must select something"]),
    ({"kind": "DeviceFailure", "metadata": {"name": "bad-gpu"},
      "spec": {"node": "n", "device": {"type": "gpu"}, "source": "manual"}},
     ["spec.device", "a gpu failure names its gpu index"]),
    ({"kind": "DeviceFailure", "metadata": {"name": "bad-link"},
      "spec": {"node": "n", "device": {"type": "link", "gpu": 1, "peerGPU": 1},
               "source": "agent"}},
     ["spec.device", "a link joins two different GPUs"]),
    ({"kind": "FabricTopology", "metadata": {"name": "bad-rail"},
      "spec": {"nodes": [{"name": "n", "position": 0}], "interNode": {"type": "rail"}}},
     ["spec.interNode", "type rail needs rails"]),
    ({"kind": "FabricTopology", "metadata": {"name": "bad-preset"},
      "spec": {"nodes": [{"name": "n", "position": -1}], "interNode": {"type": "none"},
               "intraNode": {"preset": "dgx9"}}},
     ["spec.nodes[0].position", "spec.intraNode.preset"]),
    ({"kind": "FabricTopology", "metadata": {"name": "bad-nodes-and-source"},
      "spec": {"nodes": [{"name": "n", "position": 0}], "source": {"volcano": {}},
               "interNode": {"type": "none"}}},
     ["spec", "set exactly one of nodes and source"]),
    ({"kind": "FabricTopology", "metadata": {"name": "bad-two-sources"},
      "spec": {"source": {"volcano": {}, "kueue": {"topology": "t"}},
               "interNode": {"type": "rail", "rails": 8, "spineOversubscription": 0.5}}},
     ["spec.source", "set exactly one of topograph, kueue and volcano",
      "spec.interNode.spineOversubscription"]),
    ({"kind": "FabricTopology", "metadata": {"name": "bad-empty-source"},
      "spec": {"source": {}, "interNode": {"type": "none"}}},
     ["spec.source", "set exactly one of topograph, kueue and volcano"]),
    ({"kind": "NodeFabric", "metadata": {"name": "bad-nf", "namespace": "default"},
      "spec": {"nodeName": "n", "gpus": [{"index": 0}], "links": [
          {"src": 0, "dstGPU": 3, "kind": "nvlink", "bandwidthBytesPerSecond": 1e9}]}},
     ["spec", "a link's dstGPU must be a GPU index of this node"]),
]


@pytest.mark.parametrize(("doc", "needles"), BAD, ids=[d["metadata"]["name"] for d, _ in BAD])
def test_invalid_resources_are_rejected_naming_the_field(
        cluster: LocalCluster, doc: dict[str, object], needles: list[str]) -> None:
    for crd in T.crd_documents():
        cluster.kubectl("apply", "-f", str(crd))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    manifest = {"apiVersion": "choreo.dev/v1alpha1", **doc}
    with pytest.raises(DevClusterError) as err:
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    for needle in needles:
        assert needle in str(err.value), str(err.value)
