"""The rail-aligned hierarchical AllReduce: verified, lowered, and linear in the ranks."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import choreo.hierarchy as hierarchy
from choreo.collectives import Collective, Demand
from choreo.errors import InputError
from choreo.generators import build
from choreo.hierarchy import Hop, Shape, applies, hierarchical, hosts_of, slicing, timeline
from choreo.msccl import interpret
from choreo.msccl.api import to_xml
from choreo.msccl.layout import MAX_CNT
from choreo.msccl.split import split_per_node
from choreo.routing import route
from choreo.schedule import Schedule
from choreo.simulate import simulate
from choreo.synth import SynthOptions, synthesize
from choreo.transforms import fail_npus
from choreo.verify import check, verify


def _allreduce(fabric_name: str, size: int = 16 << 20, chunks: int = 1,
               failed: tuple[str, ...] = ()) -> Schedule:
    fabric = build(fabric_name)
    if failed:
        fabric = fail_npus(fabric, failed)
    demand = Demand(Collective.ALLREDUCE, tuple(fabric.npus), size, chunks)
    return hierarchical(fabric, [demand])


@pytest.mark.parametrize(("fabric", "failed"), [
    ("dgx-h100-2", ()),
    ("dgx-h100-3", ()),  # hosts not a power of two: one level of radix 3
    ("dgx-h100-6", ()),  # radices 3 and 2
    ("dgx-h100-5", ("node2/gpu1",)),
    ("dgx-h100-4", ("node1/gpu3",)),  # a host without slot 3 hands its part to a mate
    ("dgx-h100-4", ("node0/gpu0", "node2/gpu5", "node2/gpu6")),
])
def test_plan_is_verified_and_its_program_computes_the_allreduce(
        fabric: str, failed: tuple[str, ...]) -> None:
    s = _allreduce(fabric, failed=failed)
    check(s)
    result = interpret.run(to_xml(s, 0))
    assert result.ok, str(result)


def test_ranges_longer_than_a_step_are_cut_into_steps() -> None:
    s = _allreduce("dgx-h100-2", size=4 << 20, chunks=128)  # one slice: parts of 256
    assert int(s.count.max()) > MAX_CNT
    xml = to_xml(s, 0)
    counts = [int(c) for c in re.findall(r'cnt="(\d+)"', xml)]
    assert max(counts) == MAX_CNT
    assert interpret.run(xml).ok


def test_transfers_grow_as_n_log_n_not_n_squared() -> None:
    small, large = _allreduce("dgx-h100-4"), _allreduce("dgx-h100-16")
    ratio = len(large) / len(small)  # 4x the ranks
    assert ratio < 4 * 2.5, ratio  # a chunk-level plan would be about 16x
    assert verify(large).ok


def test_slices_overlap_the_phases_at_large_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    sliced = _allreduce("dgx-h100-16", size=256 << 20)
    assert sliced.demands[0].chunks > 1 and verify(sliced).ok
    monkeypatch.setattr(hierarchy, "slicing", lambda *_a, **_k: hierarchy.Slices((1,), 1))
    one = _allreduce("dgx-h100-16", size=256 << 20)
    assert one.demands[0].chunks == 1
    assert sliced.makespan < 0.8 * one.makespan, (sliced.makespan, one.makespan)


def test_slicing_follows_the_estimate_and_the_program_budget() -> None:
    host, rail = Hop(1.4e-6, 1 / 370e9), Hop(3.4e-6, 1 / 46e9)
    shape = Shape(parts=8, hosts=128)
    assert slicing(shape, 1 << 17, host, rail, 1024).weights == (1,)  # latency-bound
    big = slicing(shape, 32 << 20, host, rail, 1024)
    w = big.weights
    assert len(w) > 1 and w == w[::-1]  # short ends: the fill and drain nothing hides
    assert 1024 * big.chunks % sum(w) == 0  # every slice is whole chunks
    ends = {v: timeline(shape, v, 32 << 20, host, rail).end for v in [(1,), (1, 1), w]}
    assert ends[w] < ends[(1, 1)] < ends[(1,)]
    assert shape.steps_per_host(w, 1024, big.chunks) <= hierarchy.MAX_HOST_STEPS
    assert slicing(shape, 32 << 20, host, rail, 1024, max_steps=1000).weights == (1,)


def test_too_few_chunks_to_cut_evenly_lengthen_the_estimate() -> None:
    host, rail = Hop(1.4e-6, 1 / 370e9), Hop(3.4e-6, 1 / 46e9)
    shape = Shape(parts=8, hosts=33, levels=(11, 3))
    even = timeline(shape, (1, 2, 1), 128 << 20, host, rail, 264 * 4 / 8).end
    ragged = timeline(shape, (1, 2, 1), 128 << 20, host, rail, 264 * 1 / 8).end
    assert ragged > 1.1 * even
    assert even >= timeline(shape, (1, 2, 1), 128 << 20, host, rail).end


def test_the_step_estimate_bounds_the_lowered_program() -> None:
    s = _allreduce("dgx-h100-4", size=256 << 20)
    d, weights = s.demands[0], tuple(s.meta["slices"][0])
    assert len(weights) > 1 and d.n * d.chunks % sum(weights) == 0
    files = split_per_node(to_xml(s, 0), [s.fabric.names[r].split("/")[0] for r in d.ranks])
    steps = [len(re.findall(r"<step ", text)) for text in files.values()]
    assert max(steps) <= Shape(parts=8, hosts=4).steps_per_host(weights, d.n, d.chunks)


@pytest.mark.parametrize(("fabric", "size", "failed"), [
    ("dgx-h100-16", 256 << 20, ()),
    ("dgx-h100-33", 256 << 20, ()),  # radices 11 and 3
    ("dgx-h100-34", 1 << 30, ("node0/gpu5",)),  # radix 17, seven parts
    # five slots lost: hosts hand their parts to mates, and a rank owns two
    ("dgx-h100-33", 256 << 20, tuple(f"node{i}/gpu{i}" for i in range(5))),
])
def test_the_threadblock_estimate_bounds_the_lowered_program(
        fabric: str, size: int, failed: tuple[str, ...]) -> None:
    s = _allreduce(fabric, size=size, failed=failed)
    d, weights = s.demands[0], tuple(s.meta["slices"][0])
    hosts = hosts_of(s.fabric, d.ranks)
    assert hosts is not None
    slots, owners = hierarchy.owners_of(hosts, hierarchy.railed_ranks(s.fabric, d.ranks))
    shape = Shape(len(slots), len(hosts), max(len(m) for m in hosts),
                  tuple(s.meta["radices"][0]),
                  owned=max(row.count(r) for row in owners for r in row))
    xml = to_xml(s, 0)
    most = max(len(re.findall(r"<tb ", gpu)) for gpu in xml.split("<gpu ")[1:])
    assert len(weights) > 1
    assert most <= shape.threadblocks(weights, d.n, d.chunks) <= hierarchy.MAX_RANK_THREADBLOCKS


def test_the_estimate_orders_the_phases_of_every_slice() -> None:
    est = timeline(Shape(8, 16), (1, 2, 2, 1), 32 << 20, Hop(1e-6, 1 / 370e9),
                   Hop(3e-6, 1 / 46e9))
    for j in range(4):
        assert est.host_rs[j] < est.rail[j] < est.host_ag[j] < est.end
        if j:
            assert est.rail[j] > est.rail[j - 1] and est.host_rs[j] > est.host_rs[j - 1]


def test_simulated_times_match_the_schedule() -> None:
    s = _allreduce("dgx-h100-3", size=64 << 20, chunks=2)
    sim = simulate(s)
    assert np.allclose(sim.end, s.end) and np.allclose(sim.start, s.start)


def test_slots_follow_the_fabric_not_the_tenant() -> None:
    fabric = fail_npus(build("dgx-h100-2"), ["node1/gpu2"])
    hosts = hosts_of(fabric, fabric.npus)
    assert hosts is not None
    assert [s for s, _ in hosts[1]] == [0, 1, 3, 4, 5, 6, 7]


def test_only_large_allreduce_tenants_over_several_hosts_apply() -> None:
    fabric = build("dgx-h100-4")
    ranks = tuple(fabric.npus)
    assert applies(fabric, Demand(Collective.ALLREDUCE, ranks, 1 << 20), large=16)
    assert not applies(fabric, Demand(Collective.ALLREDUCE, ranks, 1 << 20))  # 32 <= 256
    assert not applies(fabric, Demand(Collective.ALLGATHER, ranks, 1 << 20), large=16)
    assert not applies(fabric, Demand(Collective.ALLREDUCE, ranks[:8], 1 << 20), large=4)
    torus = build("torus-4x4")
    assert not applies(torus, Demand(Collective.ALLREDUCE, tuple(torus.npus), 1), large=4)


def test_synthesize_picks_the_plan_for_large_tenants() -> None:
    fabric = build("dgx-h100-4")
    demand = Demand(Collective.ALLREDUCE, tuple(fabric.npus), 16 << 20)
    s = synthesize(fabric, [demand], SynthOptions(relay=False, large_tenant=16))
    assert s.engine == "rail-hierarchical" and verify(s).ok
    assert synthesize(fabric, [demand], SynthOptions(relay=False)).engine != s.engine


def test_counts_survive_a_round_trip_and_bad_ranges_are_named(tmp_path: Path) -> None:
    s = _allreduce("dgx-h100-2", chunks=4)
    path = tmp_path / "s.json"
    s.save(path)
    back = Schedule.load(path)
    assert np.array_equal(back.count, s.count) and verify(back).ok
    bad = back.select(np.ones(len(back), dtype=bool))
    bad.count[0] = back.demands[0].num_chunks + 1
    verdict = verify(bad)
    assert not verdict.ok and verdict.counts["index"] == 1
    assert "out of range" in verdict.errors[0]
    with pytest.raises(InputError, match="chunks"):
        to_xml(bad, 0)


def test_a_range_cut_short_is_caught_by_the_verifier() -> None:
    s = _allreduce("dgx-h100-2")
    longest = int(np.argmax(s.count))
    s.count[longest] -= 1
    verdict = verify(s)
    assert not verdict.ok and verdict.counts["postcondition"] > 0


def test_a_lost_gpu_or_nic_takes_its_rail_out_of_the_parts() -> None:
    """Handing the lost slot's part to a mate would load that mate's NIC twice (2.63 ms for
    the lost GPU here); cutting the buffer into seven parts loads seven NICs evenly (1.69 ms;
    1.33 ms healthy)."""
    healthy = _allreduce("dgx-h100-4", size=256 << 20)
    fabric = build("dgx-h100-4")
    nic = [i for i, lk in enumerate(fabric.links)
           if 10 in (lk.src, lk.dst) and "rail" in fabric.node_name(lk.dst if lk.src == 10
                                                                      else lk.src)]
    for damaged in (fail_npus(fabric, ["node1/gpu3"]), fabric.with_health(frozenset(), nic)):
        ranks = tuple(v for v in damaged.npus if v not in damaged.failed)
        hosts = hosts_of(damaged, ranks)
        assert hosts is not None
        slots, _ = hierarchy.owners_of(hosts, hierarchy.railed_ranks(damaged, ranks))
        assert len(slots) == 7 and (3 if damaged.failed else 2) not in slots
        s = hierarchical(damaged, [Demand(Collective.ALLREDUCE, ranks, 256 << 20)])
        assert verify(s).ok
        assert s.makespan <= healthy.makespan * 1.3, (s.makespan, healthy.makespan)


def test_any_host_count_reduces_in_its_prime_factors() -> None:
    assert hierarchy.radices(128) == (2,) * 7
    assert hierarchy.radices(125) == (5, 5, 5) and hierarchy.radices(33) == (11, 3)
    assert hierarchy.radices(38) == (19, 2) and hierarchy.radices(62) == (5, 3, 2, 2)  # 31: fold
    assert hierarchy.radices(62, 62) == (31, 2)
    odd = _allreduce("dgx-h100-12", size=256 << 20)  # 3 x 2 x 2
    assert odd.meta["radices"] == [[3, 2, 2]] and verify(odd).ok
    even = _allreduce("dgx-h100-16", size=256 << 20)
    assert odd.makespan < even.makespan * 1.05  # no fold: about as fast as 16 hosts


def test_gpus_that_only_meet_through_each_other_still_route() -> None:
    fabric = build("dgx1")  # direct NVLinks, no switch: some pairs need a GPU between them
    pairs = {(a, b) for a in fabric.npus for b in fabric.npus if a != b}
    with pytest.raises(InputError, match="no usable path"):
        route(fabric, pairs, 1e6, transit=False)
    _, chosen = route(fabric, pairs, 1e6)
    assert set(chosen) == pairs


def test_the_first_rail_level_groups_neighbouring_hosts() -> None:
    levels = (3, 2)
    placed = hierarchy._near_first(list(range(7)), levels)  # six in the core, one folds in
    assert placed[6] == 6
    # Level 0 (radix 3, the largest ranges) groups positions a stride of 2 apart.
    assert [sorted(placed[p::2][:3]) for p in range(2)] == [[0, 1, 2], [3, 4, 5]]


def test_the_largest_rail_ranges_stay_under_one_leaf(monkeypatch: pytest.MonkeyPatch) -> None:
    """On leaves under a 2:1 spine, the levels that move the most stay inside a block; where
    one switch joins every host, the order changes nothing."""
    demand = Demand(Collective.ALLREDUCE, tuple(range(64)), 256 << 20)
    spine, rails = build("dgx-h100-spine-2x4"), build("dgx-h100-8")
    near = [hierarchical(f, [demand]).makespan for f in (spine, rails)]
    monkeypatch.setattr(hierarchy, "_near_first", lambda members, _levels: members)
    in_order = [hierarchical(f, [demand]).makespan for f in (spine, rails)]
    assert near[0] * 1.25 < in_order[0]  # 1.69 against 2.24 ms (each uplink two lanes)
    assert near[1] == pytest.approx(in_order[1], rel=1e-9)
