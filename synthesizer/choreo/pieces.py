"""Cut a schedule's first and last transfers into pieces, so its pipeline fills and drains
sooner.

A schedule moves its chunks through every level of the fabric, and a chunk must arrive
before it is passed on. So at the start the bottleneck links wait for a whole chunk's first
hop (a ReduceScatter's first reductions), and at the end the last chunk to arrive must still
be passed on whole (an AllGather's last copies into a group). Finer chunks everywhere shorten
both but pay a link's alpha on every transfer; on dragonfly-8x9 the best uniform count
(3 per shard) loses 2% to alphas and 2% to the drain. Cutting only the transfers near either
end into ``k`` pieces of ``1 / k`` chunk shortens fill and drain ``k`` times for a few more
alphas.

The pieces keep their transfer's place: piece ``i`` is planned in the ``i``-th ``1 / k`` of
the transfer's planned window, so every piece comes after the piece it reads and before
everything that came after the whole transfer, and the simulator (which runs each transfer
as soon as its link and its data allow, in planned order) lets piece ``i`` of the next hop
start when piece ``i`` has arrived. The demands are refined ``k`` times (chunk ``j`` becomes
chunks ``j k .. j k + k - 1``), and transfers left whole carry all ``k``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace

import numpy as np

from choreo.schedule import Schedule
from choreo.simulate import durations, simulate

PIECES = (4, 2, 8)  # pieces per cut transfer, tried in this order
WINDOWS = (0.5, 1.0, 1.5, 2.0)  # how far from either end a transfer is cut, in longest transfers
MIN_GAIN = 0.001  # a variant (a cut; the portfolio's chunk counts) must be this much faster


@dataclass(frozen=True)
class Cut:
    """Transfers that start within ``head`` seconds of the start or end within ``tail``
    seconds of the end are cut into ``pieces`` (a negative window cuts nothing there)."""

    pieces: int
    head: float
    tail: float

    def label(self) -> str:
        ends = [f"{side} {w * 1e6:.1f} us" for side, w in (("first", self.head),
                                                              ("last", self.tail)) if w >= 0]
        return f"ends in {self.pieces} pieces ({', '.join(ends)})"


def cut_ends(schedule: Schedule, cut: Cut) -> Schedule:
    """``schedule`` with the transfers ``cut`` names in pieces, timed by the simulator."""
    s, k = schedule, cut.pieces
    if k < 2 or not len(s):
        raise ValueError(f"pieces: need at least 2 pieces of a non-empty schedule, got {k}")
    chosen = _alike_into_each_rank(s, (s.start <= cut.head) | (s.end >= s.makespan - cut.tail))
    reps = np.where(chosen, k, 1)
    row = np.repeat(np.arange(len(s)), reps)
    piece = np.arange(len(row)) - np.repeat(np.cumsum(reps) - reps, reps)
    fine = chosen[row]
    count = s.count[row].astype(np.int64)
    chunk = s.chunk[row].astype(np.int64) * k + np.where(fine, piece * count, 0)
    first, last = s.start[row], s.end[row]
    share = np.where(fine, (last - first) / k, 0.0)
    planned = Schedule(
        s.fabric, s.topology, tuple(replace(d, chunks=d.chunks * k) for d in s.demands),
        s.tenant[row], chunk, s.src[row], s.dst[row], s.link[row],
        np.where(fine, first + piece * share, first),
        np.where(fine, first + (piece + 1) * share, last), s.op[row], engine=s.engine,
        meta={**s.meta, "pieces": asdict(cut)},
        count=np.where(fine, count, count * k))
    return simulate(planned).retimed(planned)


def _alike_into_each_rank(s: Schedule, chosen: np.ndarray) -> np.ndarray:
    """``chosen`` and every transfer into the same rank that moves one of their chunks:
    what a rank receives of a chunk arrives all cut or all whole. A REDUCE adds what arrives
    to what the rank holds, which must lie in one place: with pieces of an earlier arrival
    in scratch and the rest still in the input buffer, a whole transfer would have no one
    place to add to."""
    row, chunk = s.expanded()
    span = int(chunk.max()) + 1
    key = (s.tenant[row].astype(np.int64) * (int(s.dst.max()) + 1) + s.dst[row]) * span + chunk
    while True:
        into = np.zeros(len(s), dtype=bool)
        into[row[np.isin(key, key[chosen[row]])]] = True
        if (into == chosen).all():
            return chosen
        chosen = into


def best_cut(schedule: Schedule, until: float, simulated: float | None = None
             ) -> tuple[Schedule, Cut] | None:
    """The fastest cut found before the monotonic time ``until``, where one is at least
    ``MIN_GAIN`` faster than ``schedule`` (``simulated``: its simulated time, where known);
    None otherwise. It tries the tail's windows, then the head's, at the first count of
    pieces, then both ends at their best windows together, then the other counts (one
    simulation each, while one more fits)."""
    if not len(schedule) or time.monotonic() >= until:
        return None
    longest = float(durations(schedule).max())
    if simulated is None:
        simulated = float(simulate(schedule).makespan)
    base = simulated * (1 - MIN_GAIN)
    fastest: tuple[float, Schedule | None, Cut | None] = (base, None, None)
    took = 0.0

    def attempt(cut: Cut) -> float:
        """The cut's simulated time (inf where it did not fit in the time left)."""
        nonlocal took, fastest
        if time.monotonic() + took > until:
            return float("inf")
        t0 = time.monotonic()
        cand = cut_ends(schedule, cut)
        took = max(took, time.monotonic() - t0)
        if cand.makespan < fastest[0]:
            fastest = (cand.makespan, cand, cut)
        return cand.makespan

    k = PIECES[0]
    ends: dict[str, float] = {}
    for side in ("tail", "head"):
        times = {w: attempt(Cut(k, w * longest if side == "head" else -1.0,
                                w * longest if side == "tail" else -1.0)) for w in WINDOWS}
        w = min(times, key=lambda x: times[x])
        if times[w] < base:
            ends[side] = w * longest
    if len(ends) == 2:
        attempt(Cut(k, ends["head"], ends["tail"]))
    at = fastest[2]  # the best so far; set wherever some end gained
    if at is not None:
        for other in PIECES[1:]:
            attempt(replace(at, pieces=other))
    _, won, how = fastest
    return None if won is None or how is None else (won, how)
