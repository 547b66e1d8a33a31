"""Every built-in topology (small instances) x every collective x every runtime: the lowered
files (one per kind of call the runtime needs) pass the validator and the interpreter proves
they compute the collective for both in-place and out-of-place calls."""

from __future__ import annotations

import numpy as np
import pytest
from msccl_helpers import schedule

from choreo.collectives import Collective, Demand
from choreo.errors import InputError
from choreo.generators import build
from choreo.msccl import run, to_xml, validate
from choreo.msccl.layout import DIALECTS, file_kinds, own_apart
from choreo.schedule import Schedule

TOPOLOGIES = ["ring-8", "uniring-6", "fc-8", "mesh-3x3", "torus-4x4", "hypercube-2x2x2",
              "switch-8", "switch2d-4x2", "3d-rfs-16", "dragonfly-4x5", "dgx1", "dgx2",
              "ndv2-2", "dgx-h100-2", "mi250"]
LEGACY_MISSING = {Collective.GATHER, Collective.SCATTER}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("collective", [c.value for c in Collective])
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_lowered_file_is_valid_and_computes_the_collective(topology: str, collective: str,
                                                           dialect: str) -> None:
    coll = Collective(collective)
    root = 1 if coll.rooted else 0
    sched = schedule(topology, collective, 1, root)
    if dialect == "legacy" and coll in LEGACY_MISSING:
        with pytest.raises(InputError, match="legacy runtime has no"):
            to_xml(sched, dialect=dialect)
        return
    served = []
    for kind in file_kinds(coll, dialect):
        xml = to_xml(sched, dialect=dialect, calls=kind)
        assert validate(xml) == []
        result = run(xml)
        assert result.ok, str(result)
        served += result.modes
        assert not xml.lstrip().startswith("<?xml")
    expected = ["out-of-place"] + ([] if coll is Collective.ALLTOALL else ["in-place"])
    assert sorted(served) == sorted(expected)


@pytest.mark.parametrize("collective", [c.value for c in Collective])
@pytest.mark.parametrize("topology", ["ring-8", "dgx1", "torus-4x4"])
def test_several_chunks_and_instances(topology: str, collective: str) -> None:
    sched = schedule(topology, collective, 2, 0)
    xml = to_xml(sched, instances=2)
    assert validate(xml) == []
    result = run(xml, root=0)
    assert result.ok, str(result)


@pytest.mark.parametrize("root", [0, 3])
@pytest.mark.parametrize("collective", ["broadcast", "reduce", "gather", "scatter"])
def test_rooted_collectives_check_the_root_they_were_built_for(collective: str,
                                                               root: int) -> None:
    xml = to_xml(schedule("ring-8", collective, 1, root))
    assert run(xml).ok
    assert run(xml, root=root).ok
    wrong = run(xml, root=(root + 1) % 8)
    assert not wrong.ok


@pytest.mark.parametrize(("collective", "edges"), [
    (Collective.ALLGATHER, [1, 2, 4, 5]),  # the sender's own shard, chunks 2..3, in its input
    (Collective.REDUCESCATTER, [1, 4, 5]),  # the receiver's, chunks 4..5, in its output
    (Collective.ALLREDUCE, [1, 5])])  # every chunk in both buffers: one range
def test_a_range_across_an_own_shard_is_cut_at_its_edges(collective: Collective,
                                                         edges: list[int]) -> None:
    """One step moves a contiguous range of one buffer, so a transfer whose chunks lie
    partly in another (a rail plan's block of a whole host's shards) is cut there into
    consecutive transfers, each its share of the time, the last ending as it did."""
    fabric = build("switch-4")
    demand = Demand(collective, tuple(fabric.npus), 1 << 20, 2)
    one = np.ones(1)
    s = Schedule(fabric, fabric, (demand,), tenant=0 * one, chunk=one, src=one,
                 dst=2 * one, link=0 * one, start=one, end=5 * one, op=0 * one, count=4 * one)
    cut, origin = own_apart(s, demand)
    assert [*cut.chunk, cut.chunk[-1] + cut.count[-1]] == edges
    assert [*cut.start, cut.end[-1]] == edges  # from 1 s to 5 s: a second a chunk
    assert np.array_equal(cut.end[:-1], cut.start[1:]) and list(origin) == [0] * len(cut)
    none = s.select(np.zeros(1, dtype=bool))  # a tenant with nothing to move
    assert len(own_apart(none, demand)[0]) == 0
