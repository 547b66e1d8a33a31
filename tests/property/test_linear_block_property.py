"""A range of chunks is back to back in a rank's buffer exactly where ``layout.linear_block``
says: the lowering's check of ranged atoms (``SPLIT``) without visiting every chunk, against
the chunk-by-chunk offsets of ``input_index`` and ``output_index``."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from choreo.collectives import Collective, Demand
from choreo.msccl.layout import input_index, linear_block, output_index


@st.composite
def _ranges(draw: st.DrawFn) -> tuple[Collective, int, int, int, int, int, int]:
    """A collective, its ranks and chunks per rank, and one range on one rank."""
    coll = draw(st.sampled_from(list(Collective)))
    n = draw(st.integers(2, 5))
    chunks = draw(st.integers(1, 4))
    root = draw(st.integers(0, n - 1))
    total = Demand(coll, tuple(range(n)), 1 << 20, chunks, root=root).num_chunks
    lo = draw(st.integers(0, total - 1))
    size = draw(st.integers(1, total - lo))
    rank = draw(st.integers(0, n - 1))
    return coll, n, chunks, root, lo, size, rank


@settings(max_examples=400, deadline=None)
@given(_ranges(), st.booleans())
def test_a_range_is_back_to_back_exactly_where_it_stays_in_one_block(
        case: tuple[Collective, int, int, int, int, int, int], output: bool) -> None:
    coll, n, chunks, root, lo, size, rank = case
    index_of = output_index if output else input_index
    k = np.arange(lo, lo + size)
    at = index_of(coll, n, chunks, k, np.full(size, rank), root)
    if at[0] < 0:  # not held there: nothing to check
        return
    back_to_back = bool((at == at[0] + np.arange(size)).all())
    block = linear_block(coll, n, chunks, output)
    one_block = block is None or lo // block == (lo + size - 1) // block
    assert back_to_back == one_block
