"""Random rail fabrics, tenants on some slots of every host, a GPU lost now and then: the
AllGather, ReduceScatter or AllReduce that ``synthesize`` returns always verifies, is never
faster than the bound, is never slower than the rail plan where that applies, and its
program fits one ConfigMap per node and passes the MSCCL validator."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from choreo.bounds import lower_bound
from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.msccl.api import to_xml
from choreo.msccl.lower import lowerable
from choreo.msccl.split import MAX_CONFIGMAP_BYTES, split_per_node
from choreo.msccl.validate import validate
from choreo.railgather import Shape, block_groups, estimate, even_cuts, layout, plans, rail_gather
from choreo.report import tenant_bounds
from choreo.simulate import simulate
from choreo.synth import SynthOptions, synthesize
from choreo.transforms import fail_npus
from choreo.verify import verify


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(preset=st.sampled_from(["dgx-h100", "dgx-a100"]), hosts=st.integers(2, 6),
       slots=st.integers(2, 8), lost=st.booleans(),
       collective=st.sampled_from([Collective.ALLGATHER, Collective.REDUCESCATTER,
                                   Collective.ALLREDUCE]),
       size_mib=st.sampled_from([16, 256, 1024]), seed=st.integers(0, 2**16))
def test_gathers_on_rails(preset: str, hosts: int, slots: int, lost: bool,
                          collective: Collective, size_mib: int, seed: int) -> None:
    rnd = random.Random(seed)
    fabric = build(f"{preset}-{hosts}")
    chosen = set(rnd.sample(range(8), slots))
    ranks = [v for v in fabric.npus if int(fabric.names[v].rsplit("gpu", 1)[1]) in chosen]
    if lost:
        gone = rnd.choice(ranks)
        fabric = fail_npus(fabric, [gone])
        ranks.remove(gone)
    demand = Demand(collective, tuple(ranks), size_mib << 20, 1)
    s = synthesize(fabric, [demand], SynthOptions(relay=False))
    verdict = verify(s)
    assert verdict.ok, verdict.summary()
    took = simulate(s).makespan
    assert lower_bound(fabric, demand, whole_chunks=not s.ranged).value_s <= took * (1 + 1e-9)
    if layout(fabric, demand) is not None:
        assert not lost
        assert took <= simulate(rail_gather(fabric, [demand])).makespan * (1 + 1e-9)
    xml = to_xml(s, 0)
    files = split_per_node(xml, [fabric.names[r].split("/")[0] for r in s.demands[0].ranks])
    assert max(len(text.encode()) for text in files.values()) <= MAX_CONFIGMAP_BYTES
    assert validate(xml) == []


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=st.integers(2, 4), per_block=st.sampled_from([2, 4]), tenants=st.integers(1, 2),
       slots=st.integers(2, 8), size_mib=st.sampled_from([16, 1024]),
       seed=st.integers(0, 2**16))
# The first tenant across a NIC-wide uplink ends before the joint bound: 2.838 < 2.918 ms.
@example(blocks=2, per_block=2, tenants=2, slots=8, size_mib=1024, seed=0)
def test_gathers_under_a_spine(blocks: int, per_block: int, tenants: int, slots: int,
                               size_mib: int, seed: int) -> None:
    """Tenants with as many nodes in every block of a 2:1 spine, on some slots: every
    tenant's AllGather verifies, is never faster than its bound (its own; the last end, than
    the tenants' joint bound) nor slower than the rail plan, and its program fits one
    ConfigMap per node and passes the validator."""
    rnd = random.Random(seed)
    fabric = build(f"dgx-h100-spine-{blocks}x{per_block}")
    chosen = set(rnd.sample(range(8), slots))
    per = per_block // tenants
    demands = [Demand(Collective.ALLGATHER, tuple(
        (b * per_block + t * per + i) * 8 + u for b in range(blocks) for i in range(per)
        for u in sorted(chosen)), size_mib << 20, 1, name=f"t{t}") for t in range(tenants)]
    s = synthesize(fabric, demands, SynthOptions(relay=False))
    verdict = verify(s)
    assert verdict.ok, verdict.summary()
    sim = simulate(s)
    # Each tenant's own bound holds for it; the tenants' joint bound only for the last end
    # (a tenant that crosses the spine first may beat it).
    for t, d in enumerate(demands):
        alone = lower_bound(fabric, d, whole_chunks=not s.ranged).value_s
        assert alone <= sim.tenant_time[t] * (1 + 1e-9)
    joint = lower_bound(fabric, demands[0], demands[1:], whole_chunks=not s.ranged).value_s
    assert joint <= sim.makespan * (1 + 1e-9)
    assert all(b.value_s <= time * (1 + 1e-9)
               for b, time in zip(tenant_bounds(s, sim.tenant_time), sim.tenant_time,
                                  strict=True))
    if all(layout(fabric, d) is not None for d in demands):
        assert sim.makespan <= simulate(rail_gather(fabric, demands)).makespan * (1 + 1e-9)
    for t, d in enumerate(s.demands):
        xml = to_xml(s, t)
        files = split_per_node(xml, [fabric.names[r].split("/")[0] for r in d.ranks])
        assert max(len(text.encode()) for text in files.values()) <= MAX_CONFIGMAP_BYTES
        assert validate(xml) == []


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(preset=st.sampled_from(["dgx-h100", "dgx-a100"]), hosts=st.integers(4, 24),
       collective=st.sampled_from([Collective.ALLGATHER, Collective.REDUCESCATTER,
                                   Collective.ALLREDUCE]),
       size_mib=st.sampled_from([1, 16, 64, 256, 1024]))
def test_rail_rounds_of_blocks(preset: str, hosts: int, collective: Collective,
                               size_mib: int) -> None:
    """Every host count, even those whose rounds of blocks do not divide: the rail plan with
    blocks of mates' shards verifies, simulates no slower than its estimate (which waits
    for the slowest slot's block), and, up to 64 ranks, lowers to MSCCL."""
    fabric = build(f"{preset}-{hosts}")
    demand = Demand(collective, tuple(fabric.npus), size_mib << 20, 1)
    plan = plans(fabric, [demand])[0]
    s = rail_gather(fabric, [demand], [plan])
    verdict = verify(s)
    assert verdict.ok, verdict.summary()
    assert simulate(s).makespan <= plan.estimate * (1 + 1e-9)
    if demand.n <= 64:
        assert lowerable(s) == ""


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mates=st.sampled_from([4, 8, 16]), hosts=st.integers(4, 12),
       collective=st.sampled_from([Collective.ALLGATHER, Collective.REDUCESCATTER]),
       size_mib=st.sampled_from([1, 64, 1024]), data=st.data())
def test_rounds_of_blocks_that_relay_chunks(mates: int, hosts: int, collective: Collective,
                                            size_mib: int, data: st.DataObject) -> None:
    """Where the NVSwitch ports are the bound (switch2d, 12x their NICs): a plan of blocks
    whose rounds of ``group`` relay any share of the block's first shard, in any even
    pieces (a ReduceScatter's own shard in parts of any size), verifies (every chunk
    reaches every rank once: the relayed chunks and the rest of the block by other ways),
    simulates no slower than its estimate (every forward turn a permutation, so no GPU
    receives from two mates at once), and, up to 64 ranks, lowers (a ReduceScatter's
    reductions each into one buffer)."""
    fabric = build(f"switch2d-{mates}x{hosts}")
    ranks = tuple(fabric.npus)
    base = plans(fabric, [Demand(collective, ranks, size_mib << 20, 1)])[0]
    group = data.draw(st.sampled_from(block_groups(base.hosts, 1)), label="group")
    chunks = data.draw(st.sampled_from([2, 4, 8, 16, 32]), label="chunks")
    relay = data.draw(st.integers(1, chunks - 1), label="relay")
    piece = data.draw(st.sampled_from([0, 1, chunks // 2, chunks, 2 * chunks]), label="piece")
    reduced = collective is Collective.REDUCESCATTER
    part = data.draw(st.integers(0, chunks - 1), label="part") if reduced else 0
    shape = Shape(chunks, relay, 0, group=group, part=part)
    if piece:
        shape = replace(shape, cuts=even_cuts(shape.cut_widths(hosts, reduced), piece))
    shard = (size_mib << 20) / len(ranks)
    est = estimate(shape, mates, hosts, shard, base.host, base.rail, reduced)
    demand = Demand(collective, ranks, size_mib << 20, chunks)
    s = rail_gather(fabric, [demand], [replace(base, phases=[(reduced, shape)],
                                               estimate=est.end)])
    verdict = verify(s)
    assert verdict.ok, verdict.summary()
    assert simulate(s).makespan <= est.end * (1 + 1e-9)
    if demand.n <= 64:
        assert lowerable(s) == ""
