"""Cutting a schedule's first and last transfers into pieces: still the collective, still
lowerable, and faster where the pipeline's fill or drain is what it loses."""

from __future__ import annotations

import time

import numpy as np
import pytest

from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.msccl import run, to_xml, validate
from choreo.msccl.layout import DIALECTS
from choreo.msccl.lower import lowerable
from choreo.pieces import Cut, best_cut, cut_ends
from choreo.portfolio import PortfolioOptions, solve
from choreo.simulate import durations, simulate
from choreo.synth import SynthOptions, synthesize
from choreo.verify import verify

GIB = 1 << 30


def _greedy(topology: str, collective: Collective, size: int, chunks: int):
    fabric = build(topology)
    demand = Demand(collective, tuple(fabric.npus), size, chunks)
    return synthesize(fabric, [demand], SynthOptions(restarts=1, relay=False))


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("collective", [Collective.ALLGATHER, Collective.REDUCESCATTER,
                                        Collective.ALLREDUCE])
@pytest.mark.parametrize("topology", ["dragonfly-4x5", "switch2d-4x2", "dgx-h100-2"])
def test_cut_ends_keep_the_collective_and_lower(topology, collective, dialect):
    """Pieces received apart and then passed on whole must lie side by side in the
    receiver's scratch (the lowering places a run's atoms together), and every cut schedule
    verifies, validates and computes the collective in the interpreter."""
    sched = _greedy(topology, collective, 1 << 20, 2)
    longest = float(durations(sched).max())
    for cut in (Cut(2, longest, -1.0), Cut(4, -1.0, longest), Cut(3, longest, 2 * longest)):
        cut_sched = cut_ends(sched, cut)
        assert len(cut_sched) > len(sched)
        assert cut_sched.demands[0].chunks == sched.demands[0].chunks * cut.pieces
        assert verify(cut_sched).ok, verify(cut_sched).summary()
        assert lowerable(cut_sched) == ""
        xml = to_xml(cut_sched, dialect=dialect)
        assert validate(xml) == []
        result = run(xml)
        assert result.ok, str(result)


def test_a_cut_transfer_becomes_its_pieces_and_the_rest_stay_whole():
    """Every transfer cut becomes ``k`` transfers of one piece, every other one carries its
    chunk's ``k`` pieces whole; on this drain the cut schedule ends no later."""
    sched = _greedy("dragonfly-4x5", Collective.ALLGATHER, GIB, 8)
    cut = cut_ends(sched, Cut(4, -1.0, float(durations(sched).max())))
    whole = cut.count == 4  # an uncut transfer carries its chunk's 4 pieces, a piece one
    assert 0 < whole.sum() < len(sched)
    assert (~whole).sum() == 4 * (len(sched) - whole.sum())
    assert cut.makespan <= sched.makespan * (1 + 1e-9)
    assert np.all(cut.end > cut.start)


def test_the_drain_of_a_dragonfly_allgather_is_cut_short():
    """On dragonfly-8x9 the best uniform chunks (3 a shard) lose about 2% to the copies of
    the last arrivals into each group; cutting them into pieces wins at least 1% back."""
    sched = _greedy("dragonfly-8x9", Collective.ALLGATHER, GIB, 3)
    found = best_cut(sched, time.monotonic() + 60)
    assert found is not None
    cut_sched, cut = found
    assert cut.tail > 0 and cut.pieces >= 2
    assert cut_sched.makespan < simulate(sched).makespan * 0.99
    assert verify(cut_sched).ok
    assert cut_sched.meta["pieces"]["pieces"] == cut.pieces


def test_no_cut_without_time_or_gain():
    sched = _greedy("dragonfly-4x5", Collective.ALLGATHER, GIB, 8)
    assert best_cut(sched, time.monotonic() - 1) is None  # no time left: nothing tried
    ring = _greedy("ring-4", Collective.ALLGATHER, 1 << 10, 1)  # one hop a chunk: no drain
    assert best_cut(ring, time.monotonic() + 30) is None
    with pytest.raises(ValueError, match="pieces"):
        cut_ends(sched, Cut(1, 0.0, 0.0))


def test_auto_cuts_the_ends_of_its_fastest_candidate():
    fabric = build("dragonfly-4x5")
    demand = Demand(Collective.REDUCESCATTER, tuple(fabric.npus), GIB, 8)
    sched = solve(fabric, [demand], "auto", 10.0, PortfolioOptions(relay=False,
                                                                  accept=lowerable))
    info = sched.meta["portfolio"]
    assert "pieces" in info["variant"]
    uncut = min(c["time"] for c in info["candidates"]
                if "time" in c and "pieces" not in c["variant"])
    assert info["time"] < uncut * 0.995
    assert verify(sched).ok and lowerable(sched) == ""


@pytest.mark.parametrize("topology", ["dragonfly-4x5", "switch2d-4x2"])
def test_messages_larger_than_the_fifo_lower_without_deadlock(topology):
    """Every transfer moving 4 chunks (nothing cut, chunks refined 4 times): a send that
    would overfill a connection's FIFO (2 chunks) waits for the message before it, so a
    receive fused with its send must not come before that message is taken. The lowering
    once counted the FIFO in messages, and this AllReduce deadlocked in the interpreter."""
    sched = _greedy(topology, Collective.ALLREDUCE, 1 << 20, 2)
    ranged = cut_ends(sched, Cut(4, -1.0, -1.0))
    assert ranged.ranged and int(ranged.count.min()) == 4
    result = run(to_xml(ranged))
    assert result.ok, str(result)
