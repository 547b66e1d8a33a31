"""A schedule the simulator retimed carries that simulation, and ``simulate`` hands it back
instead of running again: that is sound only if simulating the retimed schedule gives the
very same times. Checked here against a fresh simulation (a copy of the schedule, which
carries nothing) for the plans that are timed so (rail-hierarchical, rail and block gathers,
NCCL's ring) on built-in fabrics with failed GPUs and NICs, and on random fabrics."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
from fabric_strategies import fabrics
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

from choreo.collectives import Collective, Demand
from choreo.errors import InfeasibleError
from choreo.generators import build
from choreo.nccl.schedule import ring_schedule
from choreo.schedule import Schedule
from choreo.simulate import simulate
from choreo.synth import SynthOptions, auto_chunks, synthesize
from choreo.topology import NodeKind, Topology
from choreo.transforms import fail_links, fail_npus

# fabrics where the rail and plane plans win some gathers (elsewhere greedy, untimed, wins)
FABRICS = ("dgx-h100-2", "dgx-h100-4", "dgx-h100-5", "dgx-h100-16", "dgx-a100-4",
           "switch2d-4x4", "mi250")
TIMED = {"rail-hierarchical", "rail-gather", "block-gather"}  # engines whose plans are retimed
RING_RANKS = 32  # the NCCL ring's own cross-check simulates every chunk up to this many
COLLECTIVES = (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCESCATTER)


def _same_as_fresh(s: Schedule) -> None:
    carried, fresh = simulate(s), simulate(replace(s))
    event(f"{s.engine}: {'carried' if carried is simulate(s) else 'simulated afresh'}")
    assert s.engine not in TIMED or carried is simulate(s), f"{s.engine} carries no simulation"
    assert carried is not fresh, "a copy of the schedule carried the simulation along"
    assert np.array_equal(carried.start, fresh.start)
    assert np.array_equal(carried.end, fresh.end)
    assert np.array_equal(carried.tenant_time, fresh.tenant_time)
    assert np.allclose(carried.link_utilization, fresh.link_utilization, rtol=1e-12, atol=0)
    assert np.allclose(carried.fabric_utilization, fresh.fabric_utilization, rtol=1e-12, atol=0)


def _planned(fabric: Topology, coll: Collective, size: int, seed: int) -> tuple[Schedule, Demand]:
    """What the synthesizer ships for ``coll`` over every live GPU (the case rejected where
    the failures cut a GPU off)."""
    alive = tuple(v for v in fabric.npus if v not in fabric.failed)
    demand = Demand(coll, alive, size, auto_chunks(fabric, coll, size, len(alive)))
    try:
        return synthesize(fabric, [demand], SynthOptions(relay=False, seed=seed)), demand
    except InfeasibleError:
        reject()
        raise  # not reached: reject() raises


def _damaged(name: str, rnd: random.Random, gpus: int, nics: int) -> Topology:
    fabric = build(name)
    dead = rnd.sample(list(fabric.npus), min(gpus, len(fabric.npus) - 2))
    ports = [(lk.src, lk.dst) for lk in fabric.links
             if fabric.kinds[lk.dst] is NodeKind.SWITCH and lk.src not in dead]
    return fail_links(fail_npus(fabric, dead), rnd.sample(ports, min(nics, len(ports))))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(FABRICS), coll=st.sampled_from(COLLECTIVES),
       size_mib=st.sampled_from([64, 256, 1024]), gpus=st.integers(0, 2), nics=st.integers(0, 2),
       seed=st.integers(0, 2**16))
def test_a_retimed_plan_simulates_to_its_own_times(name: str, coll: Collective, size_mib: int,
                                                    gpus: int, nics: int, seed: int) -> None:
    fabric = _damaged(name, random.Random(seed), gpus, nics)
    s, demand = _planned(fabric, coll, size_mib << 20, seed)
    _same_as_fresh(s)
    if coll is Collective.ALLREDUCE and demand.n <= RING_RANKS:
        _same_as_fresh(ring_schedule(fabric, demand))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hosts=st.integers(33, 36), gpus=st.integers(0, 2), nics=st.integers(0, 2),
       size_mib=st.sampled_from([16, 256]), seed=st.integers(0, 2**16))
def test_a_rail_hierarchical_plan_simulates_to_its_own_times(hosts: int, gpus: int, nics: int,
                                                             size_mib: int, seed: int) -> None:
    fabric = _damaged(f"dgx-h100-{hosts}", random.Random(seed), gpus, nics)
    _same_as_fresh(_planned(fabric, Collective.ALLREDUCE, size_mib << 20, seed)[0])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fabric=fabrics(), chunks=st.integers(1, 4))
def test_nccls_ring_on_random_fabrics_simulates_to_its_own_times(fabric: Topology,
                                                                 chunks: int) -> None:
    demand = Demand(Collective.ALLREDUCE, fabric.npus, 1 << 20, chunks)
    ring = ring_schedule(fabric, demand)
    carried = simulate(ring)
    assert carried is simulate(ring), "a retimed schedule simulated afresh"
    _same_as_fresh(ring)
