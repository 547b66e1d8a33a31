"""Event-driven alpha-beta execution of a schedule with congestion.

A schedule's own times are a plan; this module replays the plan on the fabric and says when
each transfer really runs. The model (resources as in ``choreo.resources``):

* every transfer lasts ``alpha + count * chunk_bytes / bandwidth`` of its link;
* each resource serves its transfers one at a time, first come first served in the order of
  the planned start times (ties by transfer index): a fractional share is its own resource
  (and reserves its slice of the port, so a circuit on that port waits for it); a circuit
  holds every physical link on its path;
* store-and-forward: a transfer waits for the transfers of the same tenant into its source
  that carry one of its chunks and were planned to end by its planned start.

Because every resource predecessor and every dependency is planned to start earlier, one pass
in planned start order computes all times; a plan that is itself feasible is never delayed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from choreo.resources import LinkModel, footprint, link_model, share_of_port
from choreo.schedule import Schedule

EPS = 1e-12  # same read-after-arrival tolerance as the verifier


@dataclass
class SimResult:
    """Simulated times; per-tenant arrays are indexed like ``schedule.demands``."""

    start: np.ndarray
    end: np.ndarray
    tenant_time: np.ndarray
    makespan: float
    algbw: np.ndarray
    busbw: np.ndarray
    link_utilization: np.ndarray  # per schedule.topology link: busy time / makespan
    fabric_utilization: np.ndarray  # per fabric link, fractional shares weighted by bandwidth

    def retimed(self, schedule: Schedule) -> Schedule:
        """The schedule with the simulated times (what actually ran)."""
        return replace(schedule, start=self.start.copy(), end=self.end.copy(),
                       meta=dict(schedule.meta))


def durations(schedule: Schedule) -> np.ndarray:
    """alpha + count * chunk_bytes / bandwidth for each transfer on its own link."""
    topo = schedule.topology
    alpha = np.array([lk.alpha for lk in topo.links])
    bw = np.array([lk.bandwidth for lk in topo.links])
    cb = np.array([d.chunk_bytes for d in schedule.demands])
    return alpha[schedule.link] + schedule.count * cb[schedule.tenant] / bw[schedule.link]


def simulate(schedule: Schedule) -> SimResult:
    """Run the schedule under contention and report times, bandwidths and utilizations."""
    s = schedule
    m = len(s)
    nt = len(s.demands)
    if m == 0:
        z = np.zeros(nt)
        return SimResult(np.zeros(0), np.zeros(0), z, 0.0, z.copy(), z.copy(),
                         np.zeros(len(s.topology.links)), np.zeros(len(s.fabric.links)))
    used = np.unique(s.link)
    model = link_model(s.topology, s.fabric, used)
    krow = np.searchsorted(used, s.link)
    dur = durations(s)
    waits, updates, nslots = _slots(model, len(s.topology.links), len(s.fabric.links))
    astart, aend = _run(s, dur, krow, waits, updates, nslots)

    tenant_time = np.zeros(nt)
    np.maximum.at(tenant_time, s.tenant, aend)
    makespan = float(aend.max())
    size = np.array([d.size for d in s.demands], dtype=float)
    factor = np.array([d.bus_factor() for d in s.demands])
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(tenant_time > 0, size / np.where(tenant_time > 0, tenant_time, 1), 0.0)
    busy = aend - astart
    span = makespan if makespan > 0 else 1.0
    link_util = np.bincount(s.link, weights=busy, minlength=len(s.topology.links)) / span
    share = share_of_port(s.topology, s.fabric, model)
    item, pos = footprint(model, krow)
    fab_util = np.zeros(len(s.fabric.links))
    np.add.at(fab_util, model.phys[pos], busy[item] * share[pos])
    return SimResult(astart, aend, tenant_time, makespan, algbw, algbw * factor,
                     link_util, fab_util / span)


def _slots(
    model: LinkModel, nl: int, nf: int
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]], int]:
    """Per model row: slots to wait for and slots to advance.

    Slot ``l`` is logical link l, ``nl + p`` the exclusive (circuit) use of fabric link p and
    ``nl + nf + p`` the latest end of any fractional share on p. Slots nobody advances are
    not waited for and slots nobody waits for are not advanced, so a schedule that uses only
    one kind of link pays for nothing else.
    """
    waits: list[list[int]] = []
    updates: list[list[int]] = []
    for j, li in enumerate(model.links.tolist()):
        phys = model.physical_of(j).tolist()
        if model.fractional[j]:
            waits.append([li] + [nl + p for p in phys])
            updates.append([li] + [nl + nf + p for p in phys])
        elif phys:
            waits.append([nl + p for p in phys] + [nl + nf + p for p in phys])
            updates.append([nl + p for p in phys])
        else:
            waits.append([li])
            updates.append([li])
    advanced = {u for us in updates for u in us}
    awaited = {w for ws in waits for w in ws}
    return (
        [tuple(w for w in ws if w in advanced) for ws in waits],
        [tuple(u for u in us if u in awaited) for us in updates],
        nl + 2 * nf,
    )


@dataclass
class Atoms:
    """Read and write rows (transfer, atom), one per *atom* a transfer touches, in chunk order.

    A node's atoms cut the tenants' chunk space at every range boundary read from or written
    to that node, so two chunks of one atom always travel together there and one key stands
    for all of them: a schedule of single chunks gets one atom per chunk copy, a range of many
    chunks only as many atoms as it has boundaries inside. Atom ``a`` holds the tenant-wide
    chunks ``first[a] .. first[a] + size[a] - 1`` of its node, ``node[a]``.
    """

    reads: tuple[np.ndarray, np.ndarray]
    writes: tuple[np.ndarray, np.ndarray]
    first: np.ndarray
    size: np.ndarray
    node: np.ndarray

    @property
    def count(self) -> int:
        return len(self.first)


def node_atoms(s: Schedule) -> Atoms:
    """The atoms of ``s`` (see ``Atoms``)."""
    m = len(s)
    off = np.zeros(len(s.demands) + 1, dtype=np.int64)
    off[1:] = np.cumsum([d.num_chunks for d in s.demands])
    span = int(off[-1]) + 1
    lo = off[s.tenant] + s.chunk
    src, dst = s.src.astype(np.int64), s.dst.astype(np.int64)
    every = np.arange(m, dtype=np.int64)
    if not s.ranged:  # an atom per (node, chunk) copy
        cuts, inv = np.unique(np.concatenate([src * span + lo, dst * span + lo]),
                              return_inverse=True)
        inv = inv.astype(np.int64)
        return Atoms((every, inv[:m]), (every, inv[m:]), cuts % span,
                     np.ones(len(cuts), dtype=np.int64), cuts // span)
    hi = lo + s.count
    cuts = np.unique(np.concatenate([src * span + lo, src * span + hi,
                                     dst * span + lo, dst * span + hi]))

    def rows(node: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        first = np.searchsorted(cuts, node * span + lo)
        n_atoms = np.searchsorted(cuts, node * span + hi) - first
        t = np.repeat(every, n_atoms)
        start = np.repeat(np.cumsum(n_atoms) - n_atoms, n_atoms)
        return t, np.repeat(first, n_atoms) + np.arange(len(t)) - start

    # the last cut of a node ends its atoms; no row refers to it, so its size is moot
    return Atoms(rows(src), rows(dst), cuts % span, np.diff(cuts, append=cuts[-1:]),
                 cuts // span)


def _run(
    s: Schedule,
    dur: np.ndarray,
    krow: np.ndarray,
    waits: list[tuple[int, ...]],
    updates: list[tuple[int, ...]],
    nslots: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The one sequential pass over read rows in planned start order; dependencies are prefix
    maxima over arrivals sorted by planned end, so each atom read costs O(1) amortized
    Python work, and a transfer is timed at its last read row."""
    m = len(s)
    atoms = node_atoms(s)
    (rt, kr), (wt, kw) = atoms.reads, atoms.writes
    nkeys = atoms.count
    thr = s.start + EPS
    times = np.unique(np.concatenate([s.end, thr]))
    big = len(times) + 1
    cw = kw * big + np.searchsorted(times, s.end)[wt]
    arr = np.argsort(cw, kind="stable")
    cw_sorted = cw[arr]
    hi = np.searchsorted(cw_sorted, kr * big + np.searchsorted(times, thr)[rt], side="right")
    ptr = np.searchsorted(cw_sorted, np.arange(nkeys, dtype=np.int64) * big).tolist()
    rmax = [0.0] * nkeys
    free = [0.0] * nslots
    aend = [0.0] * m
    astart = [0.0] * m
    writer = wt[arr].tolist()
    order = np.argsort(s.start, kind="stable")  # read rows, transfers in planned start order
    if s.ranged:
        rank = np.empty(m, dtype=np.int64)
        rank[order] = np.arange(m)
        order = np.argsort(rank[rt], kind="stable")
    closes = np.r_[rt[order][1:] != rt[order][:-1], True].tolist()
    kr_l, hi_l, dur_l = kr[order].tolist(), hi[order].tolist(), dur.tolist()
    krow_l = krow.tolist()
    ready = 0.0
    for t, key, h, last in zip(rt[order].tolist(), kr_l, hi_l, closes, strict=True):
        p = ptr[key]
        got = rmax[key]
        if p < h:
            while p < h:
                e = aend[writer[p]]
                if e > got:
                    got = e
                p += 1
            ptr[key] = p
            rmax[key] = got
        if got > ready:
            ready = got
        if not last:
            continue
        row = krow_l[t]
        for w in waits[row]:
            f = free[w]
            if f > ready:
                ready = f
        e = ready + dur_l[t]
        for u in updates[row]:
            if e > free[u]:
                free[u] = e
        astart[t] = ready
        aend[t] = e
        ready = 0.0
    return np.asarray(astart), np.asarray(aend)
