"""The lowering's view of which destinations no transfer writes (their final chunk is a copy
of the rank's own input, or missing) matches a chunk-by-chunk count on whole and broken
schedules of every collective."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from choreo.collectives import Collective, Demand
from choreo.errors import ChoreoError
from choreo.generators import build
from choreo.hierarchy import hierarchical
from choreo.msccl.lower import _Program, check_options
from choreo.schedule import Schedule
from choreo.synth import SynthOptions, synthesize
from choreo.transforms import fail_npus
from choreo.verify import destination_pairs

_CACHE: dict[tuple[object, ...], Schedule] = {}


def _schedule(kind: str, collective: Collective, chunks: int) -> Schedule:
    key = (kind, collective, chunks)
    if key not in _CACHE:
        if kind == "greedy":
            fabric = build("dgx-h100-1")
            d = Demand(collective, tuple(fabric.npus[:5]), 1 << 20, chunks, root=1)
            _CACHE[key] = synthesize(fabric, [d], SynthOptions(restarts=1))
        else:
            fabric = fail_npus(build("dgx-h100-3"), ["node1/gpu3"])
            d = Demand(Collective.ALLREDUCE, tuple(fabric.npus), 64 << 20, chunks)
            _CACHE[key] = hierarchical(fabric, [d])
    return _CACHE[key]


def _by_chunk(s: Schedule) -> list[tuple[int, int]]:
    """(chunk, rank) destination pairs no transfer writes, by chunk then rank."""
    d = s.demands[0]
    rank_of = {v: r for r, v in enumerate(d.ranks)}
    written = {(c, rank_of[int(v)]) for v, lo, k in zip(s.dst, s.chunk, s.count, strict=True)
               for c in range(int(lo), int(lo + k))}
    chunks, ranks = destination_pairs(d)
    return sorted((int(c), int(r)) for c, r in zip(chunks, ranks, strict=True)
                  if (int(c), int(r)) not in written)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["greedy", "hierarchical"]),
       collective=st.sampled_from(list(Collective)), chunks=st.integers(1, 3),
       keep=st.floats(0.5, 1.0), seed=st.integers(0, 2**16))
def test_destinations_not_written_match_a_chunk_count(kind: str, collective: Collective,
                                                       chunks: int, keep: float,
                                                       seed: int) -> None:
    s = _schedule(kind, collective, chunks)
    rng = np.random.default_rng(seed)
    s = s.select(rng.random(len(s)) < keep)
    try:
        program = _Program(s, 0, check_options("executor", 1, "Simple", 0, None))
    except ChoreoError:
        return  # a schedule the lowering refuses before it looks at destinations
    c, r = program._not_received()
    assert list(zip(c.tolist(), r.tolist(), strict=True)) == _by_chunk(s)
