"""Size buckets: one schedule cannot be best from 1 MiB to 1 GiB, a few cover the range.

A collective's size range is cut at geometric steps into contiguous buckets; each is
synthesized at its representative (geometric-mean) size, with the chunk count
``auto_chunks`` picks there unless the client fixed one. Small sizes are latency-bound and
large ones bandwidth-bound, so the buckets get different schedules even at equal chunk counts.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class SizeBucket:
    """Sizes ``lo..hi`` bytes inclusive, served by a schedule made for ``size`` bytes."""

    lo: int
    hi: int
    size: int
    chunks: int


def representative(lo: int, hi: int) -> int:
    return max(lo, min(hi, round(math.sqrt(lo * hi))))


def plan_buckets(lo: int, hi: int, max_buckets: int,
                 chunks_at: Callable[[int], int]) -> list[SizeBucket]:
    """At most ``max_buckets`` contiguous buckets covering ``lo..hi`` inclusive."""
    count = max(1, min(max_buckets, hi - lo + 1))
    inner = {round(lo * (hi / lo) ** (k / count)) for k in range(1, count)}
    edges = sorted({lo, hi + 1} | {e for e in inner if lo < e <= hi})
    buckets = []
    for a, b in itertools.pairwise(edges):
        size = representative(a, b - 1)
        buckets.append(SizeBucket(a, b - 1, size, chunks_at(size)))
    return buckets
