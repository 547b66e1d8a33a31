"""The run-based data replay (``choreo.rangeflow``) finds exactly what the chunk-level replay
finds, in the same counts, on correct and broken schedules of every collective."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from choreo import rangeflow
from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.hierarchy import hierarchical
from choreo.schedule import Op, Schedule
from choreo.synth import SynthOptions, synthesize
from choreo.transforms import fail_npus
from choreo.verify import EPS, verify

DATA = ("causality", "double", "postcondition")
_CACHE: dict[tuple[object, ...], Schedule] = {}


def _hierarchical(hosts: int, failed: tuple[str, ...], chunks: int) -> Schedule:
    key = ("h", hosts, failed, chunks)
    if key not in _CACHE:
        fabric = build(f"dgx-h100-{hosts}")
        if failed:
            fabric = fail_npus(fabric, failed)
        d = Demand(Collective.ALLREDUCE, tuple(fabric.npus), 64 << 20, chunks)
        _CACHE[key] = hierarchical(fabric, [d])
    return _CACHE[key]


def _greedy(collective: Collective) -> Schedule:
    key = ("g", collective)
    if key not in _CACHE:
        fabric = build("dgx-h100-1")
        d = Demand(collective, tuple(fabric.npus[:5]), 1 << 20, 2, root=1)
        _CACHE[key] = synthesize(fabric, [d], SynthOptions(restarts=1))
    return _CACHE[key]


def _broken(s: Schedule, draw: st.DrawFn) -> Schedule:
    """``s`` with a few random edits: a transfer dropped, cut short, moved, or its op
    flipped, its chunk shifted or its start moved earlier."""
    s = s.select(np.ones(len(s), dtype=bool))
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(s) - 1))
        edit = draw(st.sampled_from(["drop", "short", "op", "chunk", "early"]))
        if edit == "drop":
            s = s.select(np.arange(len(s)) != i)
        elif edit == "short" and s.count[i] > 1:
            s.count[i] -= 1
        elif edit == "op" and s.demands[int(s.tenant[i])].collective.combining:
            s.op[i] = Op.COPY if s.op[i] == Op.REDUCE else Op.REDUCE
        elif edit == "chunk" and s.chunk[i] + s.count[i] < s.demands[int(s.tenant[i])].num_chunks:
            s.chunk[i] += 1
        elif edit == "early":
            shift = s.start[i] * draw(st.floats(0.1, 1.0))
            s.start[i] -= shift
            s.end[i] -= shift
    return s


def _same_findings(s: Schedule) -> None:
    by_runs, by_chunk = verify(s), verify(s, by_chunk=True)
    assert {k: by_runs.counts[k] for k in DATA} == {k: by_chunk.counts[k] for k in DATA}
    assert by_runs.ok == by_chunk.ok


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_ranged_plans_replay_alike(data: st.DataObject) -> None:
    hosts = data.draw(st.integers(2, 3))
    failed = data.draw(st.sampled_from([(), ("node1/gpu3",), ("node0/gpu0", "node1/gpu5")]))
    s = _hierarchical(hosts, failed, data.draw(st.integers(1, 3)))
    _same_findings(_broken(s, data.draw))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_collective_replays_alike_on_runs(data: st.DataObject) -> None:
    """Chunk-level schedules are not ranged, so verify replays them by chunk; the run replay
    is called directly here to cover every collective's origins and destinations."""
    s = _broken(_greedy(data.draw(st.sampled_from(list(Collective)))), data.draw)
    found = rangeflow.replay(s, np.arange(len(s)), EPS)
    ref = verify(s, by_chunk=True).counts
    assert (found.causality_chunks, found.double_chunks, found.postcondition_chunks) == (
        ref["causality"], ref["double"], ref["postcondition"])


def test_a_broken_plan_is_caught_alike_by_both_replays() -> None:
    plan = _hierarchical(3, ("node1/gpu3",), 2)
    s = plan.select(np.ones(len(plan), dtype=bool))
    longest = int(np.argmax(s.count))
    s.count[longest] -= 1
    s.op[int(np.flatnonzero(s.op == Op.COPY)[0])] = Op.REDUCE
    found = verify(s)
    assert found.counts["postcondition"] > 0 and found.counts["double"] > 0
    _same_findings(s)
    runs = rangeflow.replay(s, np.arange(len(s)), EPS)
    n = s.demands[0].n
    assert runs.doubles and all(0 < overlap < 1 << n for _, overlap in runs.doubles)
    assert runs.postcondition and all(v != (1 << n) - 1 and 0 <= v < 1 << n
                                      for *_, v in runs.postcondition)


def test_times_that_dwarf_eps_keep_each_write_after_its_read() -> None:
    """At 1e12 s start + eps is start again, and so is start plus a transfer's microseconds:
    its write sorted before its own read ("written before it was read", a ValueError out of
    the verifier). Both replays now agree there too."""
    far = _hierarchical(3, (), 2)
    far = far.select(np.ones(len(far), dtype=bool))
    far.start += 1e12
    far.end += 1e12
    _same_findings(far)
