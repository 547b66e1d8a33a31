"""Random connected fabrics and random failures: every synthesized schedule verifies."""

from __future__ import annotations

import networkx as nx
from fabric_strategies import fabrics
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from choreo.bounds import lower_bound
from choreo.collectives import Collective, Demand
from choreo.errors import InfeasibleError
from choreo.simulate import simulate
from choreo.synth import SynthOptions, synthesize
from choreo.transforms import fail_links, fail_npus
from choreo.verify import verify

MIB = 1 << 20


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fabric=fabrics(), coll=st.sampled_from(list(Collective)), chunks=st.integers(1, 3),
       data=st.data())
def test_random_fabrics_and_failures_verify(fabric, coll, chunks, data):
    npus = fabric.npus
    if data.draw(st.booleans(), label="fail an npu"):
        fabric = fail_npus(fabric, [data.draw(st.sampled_from(npus), label="failed npu")])
    if data.draw(st.booleans(), label="fail a link"):
        link = data.draw(st.integers(0, len(fabric.links) - 1), label="failed link")
        fabric = fail_links(fabric, [link])
    live = fabric.npus
    ranks = data.draw(st.lists(st.sampled_from(live), min_size=2, unique=True), label="ranks")
    root = data.draw(st.integers(0, len(ranks) - 1), label="root")
    demand = Demand(coll, tuple(ranks), 4 * MIB, chunks, root=root)
    try:
        sched = synthesize(fabric, [demand], SynthOptions(restarts=1,
                                                           seed=data.draw(st.integers(0, 99))))
    except InfeasibleError:
        # only when the failures really cut the tenant apart
        reach = nx.DiGraph()
        reach.add_nodes_from(range(fabric.num_nodes))
        reach.add_edges_from((fabric.links[i].src, fabric.links[i].dst)
                             for i in fabric.usable_links())
        assert not all(nx.has_path(reach, ranks[0], r) and nx.has_path(reach, r, ranks[0])
                       for r in ranks)
        return
    verdict = verify(sched)
    assert verdict.ok, verdict.errors[:5]
    assert not (set(sched.src.tolist()) | set(sched.dst.tolist())) & set(fabric.failed)
    assert simulate(sched).makespan <= sched.makespan * (1 + 1e-9)
    assert simulate(sched).makespan >= lower_bound(fabric, demand).value_s * (1 - 1e-9)


@settings(max_examples=25, deadline=None)
@given(fabric=fabrics(), split=st.integers(1, 8), data=st.data())
def test_random_tenant_pairs_share_the_fabric(fabric, split, data):
    npus = fabric.npus
    k = max(2, min(len(npus) - 2, split))
    a, b = npus[:k], npus[k:]
    if len(b) < 2:
        b = npus[-2:]
    colls = data.draw(st.lists(st.sampled_from(list(Collective)), min_size=2, max_size=2))
    demands = [Demand(colls[0], tuple(a), 2 * MIB, 1, name="a"),
               Demand(colls[1], tuple(b), 2 * MIB, 2, name="b")]
    sched = synthesize(fabric, demands, SynthOptions(restarts=1))
    verdict = verify(sched)
    assert verdict.ok, verdict.errors[:5]
    bound = lower_bound(fabric, demands[0], demands[1:]).value_s
    assert simulate(sched).makespan >= bound * (1 - 1e-9)
