"""The verifier accepts a correct hand-built schedule and names each kind of mistake."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from choreo.collectives import Collective, Demand
from choreo.schedule import COLUMNS, Op, Schedule
from choreo.simulate import simulate
from choreo.topology import Link, NodeKind, Topology, duplex
from choreo.verify import (
    VerificationError,
    check,
    destination_pairs,
    origin_rank,
    verify,
)

ALPHA, BW, SIZE = 1e-6, 1e9, 4000


def uniring(n: int) -> Topology:
    return Topology(f"uniring-{n}", (NodeKind.NPU,) * n,
                    tuple(Link(i, (i + 1) % n, ALPHA, BW) for i in range(n)))


def make(fabric: Topology, topo: Topology, demand: Demand, rows: list[tuple[Any, ...]]) -> Schedule:
    cols: dict[str, Any] = {
        name: np.array(col) for name, col in zip(COLUMNS, zip(*rows, strict=True), strict=False)
    }
    return Schedule(fabric, topo, (demand,), **cols)


def build(topo: Topology, demand: Demand, rows: list[tuple[Any, ...]]) -> Schedule:
    return make(topo, topo, demand, rows)


def ring_allgather(n: int = 4) -> Schedule:
    """Step s: rank r forwards piece (r - s) to r + 1 over link r."""
    topo = uniring(n)
    d = Demand(Collective.ALLGATHER, tuple(range(n)), SIZE)
    t = ALPHA + d.chunk_bytes / BW
    rows = [(0, (r - s) % n, r, (r + 1) % n, r, s * t, (s + 1) * t, Op.COPY)
            for s in range(n - 1) for r in range(n)]
    return build(topo, d, rows)


def ring_reducescatter(n: int = 4) -> Schedule:
    topo = uniring(n)
    d = Demand(Collective.REDUCESCATTER, tuple(range(n)), SIZE)
    t = ALPHA + d.chunk_bytes / BW
    rows = [(0, (r - s - 1) % n, r, (r + 1) % n, r, s * t, (s + 1) * t, Op.REDUCE)
            for s in range(n - 1) for r in range(n)]
    return build(topo, d, rows)


def edit(s: Schedule, i: int, **cols: float) -> Schedule:
    out = s.select(np.arange(len(s)))
    for name, value in cols.items():
        getattr(out, name)[i] = value
    return out


def only(verdict_counts: dict[str, int]) -> set[str]:
    return {k for k, v in verdict_counts.items() if v}


def test_ring_allgather_verifies_and_takes_n_minus_1_link_times() -> None:
    s = ring_allgather(6)
    v = verify(s)
    assert v.ok, v.errors
    t = ALPHA + s.demands[0].chunk_bytes / BW
    assert simulate(s).makespan == pytest.approx(5 * t)
    check(s)


def test_ring_reducescatter_verifies() -> None:
    assert verify(ring_reducescatter(5)).ok


def test_dropped_transfer_misses_postcondition() -> None:
    s = ring_allgather()
    v = verify(s.select(np.arange(len(s)) != len(s) - 1))
    assert only(v.counts) == {"postcondition"}
    assert "never arrives" in v.errors[0]


def test_duplicated_reduce_counts_contribution_twice() -> None:
    s = ring_reducescatter()
    t = float(s.end.max())
    dup = s.select(np.r_[np.arange(len(s)), 0])
    dup.start[-1], dup.end[-1] = t, 2 * t  # same send again, later, on the free link
    v = verify(dup)
    assert v.counts["double"] == 1
    assert "counted twice" in " ".join(v.errors)


def test_forward_before_arrival_is_causality_error() -> None:
    s = ring_allgather()
    t = float(s.end[0] - s.start[0])
    # transfer 4 (step 1, rank 0) forwards piece 3, which reaches rank 0 only at t
    late = edit(s, 4, start=t / 2, end=t / 2 + t)
    v = verify(late)
    assert v.counts["causality"] >= 1
    assert any("does not hold chunk 3 yet" in e for e in v.errors)


def test_overlap_on_one_link() -> None:
    s = ring_allgather()
    t = float(s.end[0] - s.start[0])
    v = verify(edit(s, 4, start=t * 1.5, end=t * 2.5))  # link 0 busy until 2t
    assert v.counts["overlap"] >= 1
    assert any("overlaps transfer" in e and "link 0" in e for e in v.errors)


def test_failed_npu_and_unhealthy_link() -> None:
    s = ring_allgather()
    topo = s.topology
    dead = replace(topo, failed=frozenset({2}))
    v = verify(replace(s, topology=dead, fabric=dead))
    assert v.counts["failed"] > 0 and v.counts["health"] > 0
    assert any("touches failed NPU npu2" in e for e in v.errors)
    links = list(topo.links)
    links[1] = replace(links[1], healthy=False)
    sick = topo.with_links(links)
    v = verify(replace(s, topology=sick, fabric=sick))
    assert only(v.counts) == {"health"}
    assert "link 1 is unhealthy" in v.errors[0]


def test_too_short_duration() -> None:
    s = ring_allgather()
    v = verify(edit(s, 0, end=float(s.end[0]) * 0.99))
    assert only(v.counts) == {"duration"}
    assert "needs" in v.errors[0]


def test_wrong_link_self_loop_and_reduce_in_allgather() -> None:
    s = ring_allgather()
    assert "link" in only(verify(edit(s, 0, link=1)).counts)
    assert "self" in only(verify(edit(s, 0, dst=0)).counts)
    v = verify(edit(s, 0, op=Op.REDUCE))
    assert only(v.counts) == {"op"}
    assert "does not combine" in v.errors[0]


def test_out_of_range_rows_reported_not_crashing() -> None:
    s = ring_allgather()
    v = verify(edit(s, 0, chunk=99))
    assert v.counts["index"] == 1 and not v.ok


def test_check_raises_with_messages() -> None:
    s = ring_allgather()
    with pytest.raises(VerificationError, match="postcondition"):
        check(s.select(np.arange(len(s)) > 0))


def test_error_list_is_capped_but_counts_everything() -> None:
    n = 12
    s = ring_allgather(n)
    v = verify(s.select(np.zeros(len(s), dtype=bool)))
    assert v.counts["postcondition"] == n * (n - 1)
    assert len(v.errors) <= 50


# ---- switches: circuits and fractional shares ------------------------------------------------
def star(n: int) -> Topology:
    """n NPUs on one switch (node n)."""
    links: list[Link] = []
    for v in range(n):
        links.extend(duplex(v, n, ALPHA / 2, BW))
    return Topology(f"switch-{n}", (NodeKind.NPU,) * n + (NodeKind.SWITCH,), tuple(links))


def up(v: int) -> int:
    return 2 * v


def down(v: int) -> int:
    return 2 * v + 1


def logical(fabric: Topology, pairs: list[tuple[int, int]], share: float) -> Topology:
    links = [Link(a, b, ALPHA, BW * share, via=(up(a), down(b))) for a, b in pairs]
    return Topology("logical", fabric.kinds, tuple(links))


def test_circuits_exclude_each_other_on_a_shared_port() -> None:
    fab = star(3)
    topo = logical(fab, [(0, 1), (0, 2)], 1.0)
    d = Demand(Collective.BROADCAST, (0, 1, 2), SIZE)
    t = ALPHA + SIZE / BW
    rows = [(0, 0, 0, 1, 0, 0.0, t, Op.COPY), (0, 0, 0, 2, 1, 0.0, t, Op.COPY)]
    s = make(fab, topo, d, rows)
    v = verify(s)
    assert only(v.counts) == {"overlap"}
    assert "fabric link 0" in v.errors[0]
    s.start[1], s.end[1] = t, 2 * t
    assert verify(s).ok
    assert simulate(s).makespan == pytest.approx(2 * t)


def test_fractional_shares_run_concurrently_within_capacity() -> None:
    fab = star(3)
    d = Demand(Collective.BROADCAST, (0, 1, 2), SIZE)
    half = logical(fab, [(0, 1), (0, 2)], 0.5)
    t = ALPHA + SIZE / (BW * 0.5)
    rows = [(0, 0, 0, 1, 0, 0.0, t, Op.COPY), (0, 0, 0, 2, 1, 0.0, t, Op.COPY)]
    assert verify(make(fab, half, d, rows)).ok
    over = logical(fab, [(0, 1), (0, 2)], 0.75)
    v = verify(make(fab, over, d, rows))
    assert only(v.counts) == {"capacity"}
    assert "fabric link 0" in v.errors[0]


def test_switch_cannot_hold_chunks() -> None:
    fab = star(2)
    d = Demand(Collective.BROADCAST, (0, 1), SIZE)
    t = ALPHA / 2 + SIZE / BW
    rows = [(0, 0, 0, 2, 0, 0.0, t, Op.COPY), (0, 0, 2, 1, 3, t, 2 * t, Op.COPY)]
    v = verify(make(fab, fab, d, rows))
    assert v.counts["switch"] == 2


# ---- vectorized conditions agree with Demand ---------------------------------------------------
@pytest.mark.parametrize("collective", list(Collective))
def test_conditions_match_demand(collective: Collective) -> None:
    d = Demand(collective, (5, 3, 9, 1), 1 << 12, chunks=2, root=2)
    chunks = list(range(d.num_chunks))
    if not collective.combining:
        assert origin_rank(d, np.array(chunks)).tolist() == [d.origins(c)[0] for c in chunks]
    pc, pr = destination_pairs(d)
    got = sorted(zip(pc.tolist(), pr.tolist(), strict=True))
    want = sorted((c, r) for c in chunks for r in d.destinations(c))
    assert got == want


def test_sorted_orders_by_start_then_end_and_returns_an_ordered_schedule_itself() -> None:
    s = ring_allgather(4)
    assert s.sorted() is s  # built step by step: already in order
    shuffled = s.select(np.random.default_rng(1).permutation(len(s)))
    again = shuffled.sorted()
    assert again is not shuffled
    assert np.array_equal(again.start, s.start) and np.array_equal(again.end, s.end)
    assert verify(again).ok
    late_first = edit(s, 0, end=s.end[0] * 3)  # ties on start: the later end goes after
    ordered = late_first.sorted()
    assert ordered is not late_first
    assert ordered.end[0] == s.end[1] and ordered.end[len(s) // 3 - 1] == s.end[0] * 3
