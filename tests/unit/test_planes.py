"""Plans composed along planes: where they apply, and on MI250 verified, lowerable and
ahead of the packed trees."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from choreo.bounds import lower_bound
from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.msccl import interpret
from choreo.msccl.api import to_xml
from choreo.msccl.lower import lowerable
from choreo.planes import ENGINE, plane_gather, plane_layout
from choreo.simulate import simulate
from choreo.synth import SynthOptions, synthesize
from choreo.topology import Topology
from choreo.transforms import degrade_link, fail_links
from choreo.verify import verify
from choreo_dev.noise_bench import noisy

GIB = 1 << 30
GATHERS = (Collective.ALLGATHER, Collective.REDUCESCATTER)
ALL = (*GATHERS, Collective.ALLREDUCE)


def _whole(fabric: Topology, collective: Collective, size: int = GIB) -> Demand:
    return Demand(collective, tuple(fabric.npus), size, 1)


def test_mi250s_groups_are_its_packages_in_side_order() -> None:
    found = plane_layout(build("mi250"), _whole(build("mi250"), Collective.ALLGATHER))
    assert found is not None
    assert found.groups == [[2 * p, 2 * p + 1] for p in range(8)]
    assert len(found.lanes[(0, 1)]) == 4  # the in-package links


@pytest.mark.parametrize("collective", GATHERS)
def test_on_mi250_the_plan_is_kept_verified_lowerable_and_ahead_of_the_trees(
        collective: Collective) -> None:
    fabric = build("mi250")
    demand = _whole(fabric, collective)
    chosen = synthesize(fabric, [demand])
    trees = synthesize(fabric, [demand], SynthOptions(plane_gather=False))
    assert chosen.engine == ENGINE
    assert verify(chosen).ok, verify(chosen).summary()
    assert lowerable(chosen) == ""
    assert simulate(chosen).makespan < 0.98 * simulate(trees).makespan
    bound = lower_bound(fabric, demand, whole_chunks=False).value_s
    assert bound / simulate(chosen).makespan >= 0.97


@pytest.mark.parametrize("collective", ALL)
def test_its_program_runs_in_the_msccl_interpreter(collective: Collective) -> None:
    fabric = build("mi250")
    found = plane_gather(fabric, [_whole(fabric, collective, 64 << 20)])
    assert found is not None
    result = interpret.run(to_xml(found, 0))
    assert result.ok, str(result)


@pytest.mark.parametrize("name", ["torus-4x4", "hypercube-2x2x2", "dgx-h100-2", "dgx1"])
def test_fabrics_without_groups_and_planes_are_left_to_the_other_engines(name: str) -> None:
    fabric = build(name)
    assert plane_gather(fabric, [_whole(fabric, Collective.ALLGATHER)]) is None


def test_a_failed_link_inside_a_group_or_an_alltoall_leaves_it_to_the_others() -> None:
    fabric = build("mi250")
    assert plane_gather(fabric, [_whole(fabric, Collective.ALLTOALL)]) is None
    broken = fail_links(fabric, [(0, 1)])
    assert plane_layout(broken, _whole(broken, Collective.ALLGATHER)) is None


def test_an_allreduce_is_the_reducescatter_then_the_allgather_and_beats_greedy() -> None:
    fabric = build("mi250")
    demand = _whole(fabric, Collective.ALLREDUCE)
    chosen = synthesize(fabric, [demand])
    greedy = synthesize(fabric, [demand], SynthOptions(tree_packing=False, plane_gather=False))
    assert chosen.engine == ENGINE
    assert verify(chosen).ok, verify(chosen).summary()
    assert lowerable(chosen) == ""
    assert simulate(chosen).makespan < 0.9 * simulate(greedy).makespan
    idx, chunk = chosen.expanded()  # each chunk is copied out only once fully reduced
    reduced, copied = chosen.op[idx] == 1, chosen.op[idx] == 0
    last_reduce = np.full(chosen.demands[0].num_chunks, -np.inf)
    np.maximum.at(last_reduce, chunk[reduced], chosen.end[idx[reduced]])
    first_copy = np.full(chosen.demands[0].num_chunks, np.inf)
    np.minimum.at(first_copy, chunk[copied], chosen.start[idx[copied]])
    assert np.isfinite(last_reduce).all() and np.isfinite(first_copy).all()
    assert (last_reduce <= first_copy + 1e-12).all()


def test_a_runtime_the_caller_names_gets_only_what_it_can_run() -> None:
    """RCCL's executor (an MI250's runtime) allows 64 threadblocks a rank: the 1 GiB
    AllReduce's plane plan at 24 chunks needs 70, and the packed trees' AllGather at their
    fastest cut 71; each engine then keeps a coarser plan RCCL runs."""
    fabric = build("mi250")
    rccl = partial(lowerable, dialect="rccl")
    allreduce = _whole(fabric, Collective.ALLREDUCE)
    executor = synthesize(fabric, [allreduce])
    assert rccl(executor) != ""
    ours = synthesize(fabric, [allreduce], SynthOptions(accept=rccl))
    assert ours.engine == ENGINE and rccl(ours) == ""
    assert simulate(ours).makespan > simulate(executor).makespan  # fewer chunks
    gather = _whole(fabric, Collective.ALLGATHER)
    trees = synthesize(fabric, [gather], SynthOptions(plane_gather=False))
    assert trees.engine == "tree-packing" and rccl(trees) != ""
    kept = synthesize(fabric, [gather], SynthOptions(plane_gather=False, accept=rccl))
    assert kept.engine == "tree-packing" and rccl(kept) == ""
    assert simulate(kept).makespan > simulate(trees).makespan  # fewer chunks


def test_an_allreduce_on_measured_rates_plans_its_hand_overs_at_the_slowest_lane() -> None:
    """Links off by 0.5%: the ReduceScatter's planes wait for hand-overs timed at the
    slowest lane, so none comes late and holds up the plane sends behind it (timed at the
    first lane instead, the AllReduce took 1.015x its noise-free time)."""
    fabric = build("mi250")
    demand = _whole(fabric, Collective.ALLREDUCE, 256 << 20)
    clean = plane_gather(fabric, [demand])
    planned = plane_gather(noisy(fabric, 0.005), [demand])
    assert clean is not None and planned is not None and verify(planned).ok
    assert planned.makespan <= clean.makespan * 1.01


@pytest.mark.parametrize("collective", [Collective.ALLGATHER, Collective.REDUCESCATTER,
                                        Collective.ALLREDUCE])
def test_a_slow_twin_link_takes_hand_overs_at_its_own_pace(collective: Collective) -> None:
    """One of a package's four twin links at a quarter of its bandwidth: each hand-over is
    timed at the lane it takes, so the slow lane gets fewer of them (timed all alike, the
    plan took 3.3-3.9x the healthy one's time; now 1.1x)."""
    fabric = build("mi250")
    demand = _whole(fabric, collective, 256 << 20)
    found = plane_layout(fabric, demand)
    assert found is not None
    slow = degrade_link(fabric, next(iter(found.lanes.values()))[1], 0.25)
    healthy, planned = plane_gather(fabric, [demand]), plane_gather(slow, [demand])
    assert healthy is not None and planned is not None and verify(planned).ok
    assert planned.makespan <= 1.2 * healthy.makespan


def test_measured_rates_keep_the_groups_and_the_plan() -> None:
    """Every link's rate and latency off by up to 15% (as agents measure them): the
    in-package pairs still stand apart from the plane links, and the plan stays within
    twice the noise of the noise-free one."""
    fabric = build("mi250")
    demand = _whole(fabric, Collective.ALLGATHER, 256 << 20)
    clean = plane_gather(fabric, [demand])
    assert clean is not None
    for noise in (0.04, 0.15):
        measured = noisy(fabric, noise)
        found = plane_layout(measured, demand)
        assert found is not None and found.groups == plane_layout(fabric, demand).groups
        planned = plane_gather(measured, [demand])
        assert planned is not None and verify(planned).ok
        assert planned.makespan <= clean.makespan * (1 + 2 * noise)
