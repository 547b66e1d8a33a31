"""Random large rail fabrics with failed GPUs and NICs: the rail-hierarchical plan always
verifies, and its program fits one ConfigMap per node and passes the MSCCL validator."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.msccl.api import to_xml
from choreo.msccl.split import MAX_CONFIGMAP_BYTES, split_per_node
from choreo.msccl.validate import validate
from choreo.synth import SynthOptions, auto_chunks, synthesize
from choreo.topology import NodeKind
from choreo.transforms import fail_links, fail_npus
from choreo.verify import verify


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hosts=st.integers(33, 40), failed_gpus=st.integers(0, 3), failed_nics=st.integers(0, 3),
       size_mib=st.sampled_from([16, 256, 1024]), seed=st.integers(0, 2**16))
def test_rail_plans_on_damaged_fabrics(hosts: int, failed_gpus: int, failed_nics: int,
                                       size_mib: int, seed: int) -> None:
    rnd = random.Random(seed)
    fabric = build(f"dgx-h100-{hosts}")
    gpus = rnd.sample(list(fabric.npus), failed_gpus)
    rails = [i for i, lk in enumerate(fabric.links)
             if fabric.kinds[lk.dst] is NodeKind.SWITCH and "rail" in fabric.node_name(lk.dst)
             and lk.src not in gpus]
    nics = [(fabric.links[i].src, fabric.links[i].dst) for i in rnd.sample(rails, failed_nics)]
    damaged = fail_links(fail_npus(fabric, gpus), nics)
    alive = tuple(v for v in damaged.npus if v not in damaged.failed)
    size = size_mib << 20
    demand = Demand(Collective.ALLREDUCE, alive, size,
                    auto_chunks(damaged, Collective.ALLREDUCE, size, len(alive)))
    s = synthesize(damaged, [demand], SynthOptions(relay=False))
    assert s.engine == "rail-hierarchical"
    verdict = verify(s)
    assert verdict.ok, verdict.summary()
    xml = to_xml(s, 0)
    files = split_per_node(xml, [damaged.names[r].split("/")[0] for r in s.demands[0].ranks])
    assert max(len(text.encode()) for text in files.values()) <= MAX_CONFIGMAP_BYTES
    assert validate(xml) == []
