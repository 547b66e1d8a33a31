"""The verifier's data replay for ranged schedules, on runs of chunks instead of chunks.

A ranged schedule (transfers of ``count`` chunks, as the rail-hierarchical plan sends) moves
whole runs, so each node's state is a short list of runs with one value each: a set of
contributions as a bit mask (combining collectives) or held/absent. Replaying per run costs
per transfer what a chunk-level replay pays per chunk: a 1024-GPU AllReduce plan moves about
ten million chunk copies in 170,000 transfers.

The semantics are the chunk-level replay's (``choreo.verify``): a transfer reads its source
at ``start + EPS`` (arrivals that end by then count), and at its end COPY overwrites the
destination's runs with what it read while REDUCE adds it, which must not repeat a
contribution. Counts are in chunks, so both replays report the same numbers.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from choreo.collectives import Demand
from choreo.schedule import Op, Schedule

Piece = tuple[int, int, int]  # (first chunk, end chunk, value)


class Runs:
    """One node's chunks of one tenant: ``vals[i]`` on chunks ``bounds[i]..bounds[i+1]-1``."""

    __slots__ = ("bounds", "vals")

    def __init__(self, bounds: list[int], vals: list[int]) -> None:
        self.bounds, self.vals = bounds, vals

    def read(self, lo: int, hi: int) -> list[Piece]:
        b, v = self.bounds, self.vals
        i = bisect_right(b, lo) - 1
        out = []
        while b[i] < hi:
            out.append((max(b[i], lo), min(b[i + 1], hi), v[i]))
            i += 1
        return out

    def _cut(self, c: int) -> int:
        """Index of the run starting at chunk ``c``, splitting the run that holds it."""
        i = bisect_left(self.bounds, c)
        if self.bounds[i] != c:
            self.bounds.insert(i, c)
            self.vals.insert(i, self.vals[i - 1])
        return i

    def copy(self, lo: int, hi: int, pieces: list[Piece]) -> None:
        i, j = self._cut(lo), self._cut(hi)
        self.bounds[i:j] = [p[0] for p in pieces]
        self.vals[i:j] = [p[2] for p in pieces]
        self._merge(i - 1, i + len(pieces) + 1)

    def reduce(self, lo: int, hi: int, pieces: list[Piece]) -> list[tuple[int, int]]:
        """Add ``pieces``; returns (overlap mask, chunks) of every contribution repeated."""
        for p in pieces[1:]:
            self._cut(p[0])
        i, j = self._cut(lo), self._cut(hi)
        doubles = []
        k = 0
        for r in range(i, j):
            while pieces[k][1] <= self.bounds[r]:
                k += 1
            v = pieces[k][2]
            both = self.vals[r] & v
            if both:
                doubles.append((both, self.bounds[r + 1] - self.bounds[r]))
            self.vals[r] |= v
        self._merge(i - 1, j + 1)
        return doubles

    def _merge(self, i: int, j: int) -> None:
        """Join equal neighbours among runs ``i..j`` (clipped)."""
        b, v = self.bounds, self.vals
        r = min(j, len(v) - 1)
        while r > max(i, 0):
            if v[r] == v[r - 1]:
                del v[r], b[r]
            r -= 1


@dataclass
class Findings:
    """What the replay found, each in chunks like the chunk-level replay counts them."""

    causality: list[tuple[int, int]] = field(default_factory=list)  # (transfer, first chunk)
    causality_chunks: int = 0
    doubles: list[tuple[int, int]] = field(default_factory=list)  # (transfer, overlap)
    double_chunks: int = 0
    # (tenant, rank, first chunk, value held) per bad run of a destination
    postcondition: list[tuple[int, int, int, int]] = field(default_factory=list)
    postcondition_chunks: int = 0


def replay(s: Schedule, rows: np.ndarray, eps: float) -> Findings:
    """Replay transfers ``rows`` of ``s`` in time order (see the module docstring)."""
    state: dict[tuple[int, int], Runs] = {}
    initial = [_initial(d) for d in s.demands]

    def runs(t: int, v: int) -> Runs:
        key = (t, v)
        if key not in state:
            state[key] = initial[t](v)
        return state[key]

    found = Findings()
    snaps: dict[int, list[Piece]] = {}
    tenant, chunk, count = s.tenant.tolist(), s.chunk.tolist(), s.count.tolist()
    src, dst, op = s.src.tolist(), s.dst.tolist(), s.op.tolist()
    for read, i in _events(s, rows, eps):
        t, lo = tenant[i], chunk[i]
        hi = lo + count[i]
        if read:
            pieces = runs(t, src[i]).read(lo, hi)
            missing = [p for p in pieces if p[2] == 0]
            if missing:
                found.causality.append((i, missing[0][0]))
                found.causality_chunks += sum(p[1] - p[0] for p in missing)
            snaps[i] = pieces
            continue
        pieces = snaps.pop(i)
        target = runs(t, dst[i])
        if op[i] == Op.REDUCE:
            for overlap, n in target.reduce(lo, hi, pieces):
                found.doubles.append((i, overlap))
                found.double_chunks += n
        else:
            target.copy(lo, hi, pieces)
    for t, d in enumerate(s.demands):
        _postcondition(d, t, partial(runs, t), found)
    return found


def _events(s: Schedule, rows: np.ndarray, eps: float) -> list[tuple[bool, int]]:
    """(is read, transfer) in replay order: a read at ``start + eps`` comes after every write
    that ends by then; writes end at ``end`` (at least ``start + 2 eps``); ties stable."""
    rtime = s.start[rows] + eps
    wtime = np.maximum(s.end[rows], s.start[rows] + 2 * eps)
    r_ord = np.argsort(rtime, kind="stable")
    w_ord = np.argsort(wtime, kind="stable")
    m = len(rows)
    pos_r = np.arange(m) + np.searchsorted(wtime[w_ord], rtime[r_ord], side="right")
    pos_w = np.arange(m) + np.searchsorted(rtime[r_ord], wtime[w_ord], side="left")
    who = np.empty(2 * m, dtype=np.int64)
    kind = np.zeros(2 * m, dtype=bool)
    who[pos_r], who[pos_w] = rows[r_ord], rows[w_ord]
    kind[pos_r] = True
    return list(zip(kind.tolist(), who.tolist(), strict=True))


def _initial(d: Demand) -> Callable[[int], Runs]:
    """Node -> its runs before anything moves: its rank's bit on every chunk (combining), or
    held on the pieces it is the origin of."""
    rank_of = {v: r for r, v in enumerate(d.ranks)}
    nc = d.num_chunks
    if d.collective.combining:
        return lambda v: Runs([0, nc], [1 << rank_of[v] if v in rank_of else 0])
    per_chunk = d.single_origin
    assert per_chunk is not None  # every non-combining collective has one origin per chunk
    piece_starts = list(range(0, nc, d.chunks))
    origin = per_chunk[piece_starts].tolist()

    def build(v: int) -> Runs:
        r = rank_of.get(v, -1)
        bounds, vals = [0], [0]
        for c, o in zip(piece_starts, origin, strict=True):
            held = 1 if o == r else 0
            if held != vals[-1]:
                if bounds[-1] == c:
                    vals[-1] = held
                else:
                    bounds.append(c)
                    vals.append(held)
        bounds.append(nc)
        out = Runs(bounds, vals)
        out._merge(0, len(vals))
        return out

    return build


def _postcondition(d: Demand, t: int, runs: Callable[[int], Runs], found: Findings) -> None:
    full = (1 << d.n) - 1 if d.collective.combining else 1
    nc = d.num_chunks
    per_chunk = d.single_destination
    if per_chunk is None:
        wanted = {r: [(0, nc)] for r in range(d.n)}
    else:
        wanted = {}
        for c, r in enumerate(per_chunk.tolist()):
            spans = wanted.setdefault(r, [])
            if spans and spans[-1][1] == c:
                spans[-1] = (spans[-1][0], c + 1)
            else:
                spans.append((c, c + 1))
    for r, spans in wanted.items():
        held = runs(d.ranks[r])
        for lo, hi in spans:
            for a, b, v in held.read(lo, hi):
                if v != full:
                    found.postcondition.append((t, r, a, v))
                    found.postcondition_chunks += b - a
