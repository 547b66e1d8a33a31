"""The verifier's data replay for ranged schedules, on runs of chunks instead of chunks.

A ranged schedule (transfers of ``count`` chunks, as the rail-hierarchical plan sends) moves
whole runs, so each node's state is a short list of runs with one value each: a set of
contributions as a bit mask (combining collectives) or held/absent. Replaying per run costs
per transfer what a chunk-level replay pays per chunk: a 1024-GPU AllReduce plan moves about
ten million chunk copies in 170,000 transfers.

The semantics are the chunk-level replay's (``choreo.verify``): a transfer reads its source
at ``start + EPS`` (arrivals that end by then count), and at its end COPY overwrites the
destination's runs with what it read while REDUCE adds it, which must not repeat a
contribution. Counts are in chunks, so both replays report the same numbers. Python orders
the events and states the demands; the replay itself is compiled (``choreo_engine``,
``rangeflow.rs``), and shares nothing with the synthesizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from choreo.collectives import Demand
from choreo.schedule import Op, Schedule
from choreo_engine import rangeflow_replay

KEEP = 64  # findings of each kind listed (all are counted); the verifier reports fewer


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
    read, who = _events(s, rows, eps)
    demands = [_demand(d) for d in s.demands]

    def csr(k: int) -> tuple[np.ndarray, np.ndarray]:
        cols = [np.asarray(d[k], dtype=np.int64) for d in demands]
        ptr = np.zeros(len(cols) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(c) for c in cols])
        return ptr, np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)

    i64 = np.int64
    (rank_ptr, rank_node), (origin_ptr, origin) = csr(0), csr(1)
    span_ptr, span_rank = csr(2)
    span_lo, span_hi = csr(3)[1], csr(4)[1]
    causality, c_chunks, doubles, d_chunks, post, p_chunks = rangeflow_replay(
        s.tenant.astype(i64), s.chunk.astype(i64), s.count.astype(i64), s.src.astype(i64),
        s.dst.astype(i64), s.op == Op.REDUCE, read, who, rank_ptr, rank_node,
        np.array([d.collective.combining for d in s.demands], dtype=bool),
        np.array([d.num_chunks for d in s.demands], dtype=i64),
        np.array([d.chunks for d in s.demands], dtype=i64), origin_ptr, origin, span_ptr,
        span_rank, span_lo, span_hi, KEEP)
    return Findings(causality, c_chunks, [(i, _int(w)) for i, w in doubles], d_chunks,
                    [(t, r, c, _int(w)) for t, r, c, w in post], p_chunks)


def _int(words: list[int]) -> int:
    """A bit set from its little-endian 64-bit words."""
    return int.from_bytes(np.asarray(words, dtype="<u8").tobytes(), "little")


def _demand(d: Demand) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """What the replay needs of a demand: its ranks' nodes, each origin piece's rank (not
    combining), and the spans (rank, first, end) every destination must hold in full."""
    nc = d.num_chunks
    origin: list[int] = []
    if not d.collective.combining:
        per_chunk = d.single_origin
        assert per_chunk is not None  # every non-combining collective has one origin per chunk
        origin = per_chunk[0:nc:d.chunks].tolist()
    per_dest = d.single_destination
    if per_dest is None:
        spans = [(r, 0, nc) for r in range(d.n)]
    else:
        wanted: dict[int, list[tuple[int, int]]] = {}
        for c, r in enumerate(per_dest.tolist()):
            mine = wanted.setdefault(r, [])
            if mine and mine[-1][1] == c:
                mine[-1] = (mine[-1][0], c + 1)
            else:
                mine.append((c, c + 1))
        spans = [(r, lo, hi) for r, rs in wanted.items() for lo, hi in rs]
    return (list(d.ranks), origin, [x[0] for x in spans], [x[1] for x in spans],
            [x[2] for x in spans])


def event_order(start: np.ndarray, end: np.ndarray, eps: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per event in replay order, whether it is a read and the position of its transfer in
    ``start``/``end`` (both replays of the verifier use it): a read at ``start + eps`` comes
    after every write that ends by then; writes end at ``end`` (at least ``start + 2 eps``,
    and strictly after their own read even where the start dwarfs eps: at 1e12 s, start plus
    microseconds is start again); ties stable."""
    rtime = start + eps
    wtime = np.maximum(np.maximum(end, start + 2 * eps), np.nextafter(rtime, np.inf))
    r_ord = np.argsort(rtime, kind="stable")
    w_ord = np.argsort(wtime, kind="stable")
    m = len(start)
    pos_r = np.arange(m) + np.searchsorted(wtime[w_ord], rtime[r_ord], side="right")
    pos_w = np.arange(m) + np.searchsorted(rtime[r_ord], wtime[w_ord], side="left")
    at = np.empty(2 * m, dtype=np.int64)
    kind = np.zeros(2 * m, dtype=bool)
    at[pos_r], at[pos_w] = r_ord, w_ord
    kind[pos_r] = True
    return kind, at


def _events(s: Schedule, rows: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``event_order`` of transfers ``rows``, naming each event's transfer."""
    kind, at = event_order(s.start[rows], s.end[rows], eps)
    return kind, rows[at]
