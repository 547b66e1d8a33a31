"""Packed broadcast trees: a certified packing, verified and runnable schedules, and where
``synthesize`` keeps them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import choreo_engine
from choreo.bounds import lower_bound
from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.msccl import interpret
from choreo.msccl.api import to_xml
from choreo.msccl.lower import lowerable
from choreo.schedule import Schedule
from choreo.simulate import simulate
from choreo.synth import SynthOptions, synthesize
from choreo.topology import Link, NodeKind, Topology
from choreo.transforms import fail_links, fail_npus
from choreo.treepack import ENGINE, GAP, lay_out, pack, tree_packing
from choreo.verify import verify
from choreo_dev.noise_bench import noisy

GIB = 1 << 30
GATHERS = (Collective.ALLGATHER, Collective.REDUCESCATTER)


def _whole(fabric: Topology, collective: Collective, size: int = GIB) -> Demand:
    return Demand(collective, tuple(fabric.npus), size, 1)


@pytest.mark.parametrize("collective", GATHERS)
@pytest.mark.parametrize("name", ["mi250", "dgx1"])
def test_the_packing_reaches_the_cut_bound_certified(name: str, collective: Collective) -> None:
    fabric = build(name)
    demand = _whole(fabric, collective)
    found = pack(fabric, demand)
    assert found is not None
    bound = lower_bound(fabric, demand, whole_chunks=False).value_s
    assert found.bound <= found.time * (1 + 1e-9)
    assert found.time <= found.bound * (1 + GAP) + 1e-12
    # ForestColl: tree packings reach the throughput bound on these fabrics
    assert found.time == pytest.approx(bound, rel=GAP)
    for trees in found.trees:
        assert sum(share for _, share in trees) == pytest.approx(1.0)


@pytest.mark.parametrize("collective", GATHERS)
def test_synthesize_keeps_the_trees_where_they_beat_greedy(collective: Collective) -> None:
    fabric = build("mi250")
    demand = _whole(fabric, collective)
    chosen = synthesize(fabric, [demand], SynthOptions(plane_gather=False))
    greedy = synthesize(fabric, [demand], SynthOptions(tree_packing=False, plane_gather=False))
    assert chosen.engine == ENGINE
    assert verify(chosen).ok, verify(chosen).summary()
    assert simulate(chosen).makespan < 0.95 * simulate(greedy).makespan
    bound = lower_bound(fabric, demand, whole_chunks=False).value_s
    assert bound / simulate(chosen).makespan >= 0.92


def test_small_buffers_are_left_to_greedy() -> None:
    fabric = build("mi250")
    assert tree_packing(fabric, (_whole(fabric, Collective.ALLGATHER, 1 << 20),)) is None


def _any_runtime(_schedule: Schedule) -> str:
    return ""  # the layout's correctness, whatever a runtime's limits


@pytest.mark.parametrize("collective", GATHERS)
def test_a_degraded_fabric_still_gets_verified_trees(collective: Collective) -> None:
    """Verified trees around a failed GCD and link; their programs take more steps than the
    executor's 64 a threadblock in 32 channels at every cut, so they are not what ships:
    ``synthesize`` keeps one the executor runs."""
    fabric = fail_links(fail_npus(build("mi250"), [3]), [(0, 2)])
    demand = _whole(fabric, collective)
    s = tree_packing(fabric, (demand,), accept=_any_runtime)
    assert s is not None
    assert verify(s).ok, verify(s).summary()
    assert 3 not in set(s.src.tolist()) | set(s.dst.tolist())
    assert lowerable(s) != "" and tree_packing(fabric, (demand,)) is None
    shipped = synthesize(fabric, [demand])
    assert lowerable(shipped) == "" and verify(shipped).ok


@pytest.mark.parametrize("collective", GATHERS)
def test_its_program_runs_in_the_msccl_interpreter(collective: Collective) -> None:
    fabric = build("dgx1")
    demand = _whole(fabric, collective, 64 << 20)
    found = pack(fabric, demand)
    assert found is not None
    result = interpret.run(to_xml(lay_out(fabric, demand, found, 8), 0))
    assert result.ok, str(result)


def test_a_rank_no_tree_can_reach_gives_no_packing() -> None:
    us = 1e-6
    links = (Link(0, 1, us, 1e9), Link(1, 2, us, 1e9), Link(2, 0, us, 1e9), Link(0, 3, us, 1e9))
    fabric = Topology("one-way", (NodeKind.NPU,) * 4, links)
    assert pack(fabric, _whole(fabric, Collective.ALLGATHER)) is None


def test_min_arborescences_finds_the_cheapest_tree_and_reports_unreachable_roots() -> None:
    src = np.array([0, 0, 1, 2], np.uint32)
    dst = np.array([1, 2, 2, 1], np.uint32)
    cost = np.array([1.0, 5.0, 1.0, 1.0])
    trees = choreo_engine.min_arborescences(3, src, dst, cost, np.array([0, 1], np.uint32))
    assert sorted(trees[0].tolist()) == [0, 2]  # 0->1->2 costs 2, not 0->2 at 5
    assert trees[1].tolist() == [-1, -1]  # nothing reaches node 0
    with pytest.raises(ValueError, match="out of range"):
        choreo_engine.min_arborescences(3, src, dst, cost, np.array([7], np.uint32))


@st.composite
def _fabrics(draw: st.DrawFn) -> Topology:
    """A random strongly connected fabric of direct links with uneven bandwidths."""
    n = draw(st.integers(3, 9))
    links = []
    bw = st.sampled_from([25e9, 50e9, 100e9])
    for v in range(n):  # a ring keeps it strongly connected
        links.append(Link(v, (v + 1) % n, 1e-6, draw(bw)))
    extra = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    links += [Link(a, b, 1e-6, draw(bw)) for a, b in extra if a != b]
    return Topology("random", (NodeKind.NPU,) * n, tuple(links))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fabric=_fabrics(), collective=st.sampled_from(GATHERS))
def test_random_fabrics_get_verified_trees_no_faster_than_the_bound(
        fabric: Topology, collective: Collective) -> None:
    demand = _whole(fabric, collective)
    s = tree_packing(fabric, (demand,), accept=_any_runtime)
    assert s is not None
    assert verify(s).ok, verify(s).summary()
    bound = lower_bound(fabric, demand, whole_chunks=False).value_s
    # Both are lower bounds: the cuts of ``choreo.bounds`` on any schedule, the packing's
    # on any tree packing, which this schedule is (it may be the tighter of the two).
    assert simulate(s).makespan >= max(bound, s.meta["packing_bound_s"]) * (1 - 1e-9)


def test_a_packing_leaves_the_exact_engines_their_solver() -> None:
    """HiGHS keeps one scheduler per process and fails any run that asks for another thread
    count: a packing, then the MILP, then solves on two threads and on one, all finish (a
    service worker that packed trees once failed every MILP after)."""
    from choreo.portfolio import solve
    from choreo.teccl.highs import Model

    fabric = build("mi250")
    assert pack(fabric, Demand(Collective.ALLGATHER, tuple(fabric.npus), 1 << 30)) is not None
    ring = build("ring-4")
    milp = solve(ring, [Demand(Collective.ALLGATHER, tuple(ring.npus), 4 << 20)], "milp",
                 deadline_s=10.0)
    assert milp.engine == "milp"
    for threads in (2, 1):
        m = Model()
        x = m.add_vars(2, hi=3.0)
        m.add_rows(np.array([0, 0]), x, 1.0, lo=0.0, hi=4.0)
        m.set_cost(x, -1.0)
        assert m.solve(threads=threads).optimal, threads


def test_parallel_links_measured_a_little_apart_are_still_one_edge() -> None:
    """MI250's four twin links measured with 0.5% noise: each its own edge, the packing
    cycled through trees that only swap them and ended 45% slower than without noise."""
    fabric = build("mi250")
    demand = _whole(fabric, Collective.ALLGATHER, 256 << 20)
    clean = tree_packing(fabric, (demand,))
    measured = tree_packing(noisy(fabric, 0.005), (demand,))
    assert clean is not None and measured is not None
    assert measured.makespan <= clean.makespan * 1.01
