"""Independent schedule checker: replays a schedule's data movement and resource use.

It trusts nothing an engine computed; it only reads the transfer columns, the topologies and
the demands, and checks the contract every engine shares:

* **data**: each tenant/NPU/chunk holds a set of contributions (combining collectives) or is
  present/absent. A transfer of ``count`` chunks is that many chunk moves. It reads its
  source at ``start`` (arrivals with ``end <= start +
  1e-12`` count) and the source must hold the chunk; at ``end`` COPY overwrites the
  destination with that snapshot and REDUCE adds it, which must not repeat a contribution.
  At the end every destination holds its chunk, for combining collectives with every rank's
  contribution exactly once.
* **links**: the link exists, joins the transfer's NPUs, is healthy with live ends, its
  physical ``via`` links exist and are usable, and the transfer lasts at least
  ``alpha + count * chunk_bytes / bandwidth``.
* **resources** (see ``choreo.resources``): no two transfers overlap on one link; a circuit
  also excludes every other transfer on its physical links (on the lane it holds, where a
  link has several); fractional shares of a physical link never add up to more than its
  bandwidth. Failed NPUs are never touched.

Everything is vectorized with numpy except the replay of data, which walks the time-sorted
events in batches that contain no read-after-write on one chunk copy, so a schedule with
millions of transfers is checked in seconds. A ranged schedule replays on runs of chunks
instead (``choreo.rangeflow``): same semantics and counts, per transfer instead of per chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from choreo import rangeflow
from choreo.arrays import concat_ranges, unique_sorted
from choreo.collectives import Collective, Demand
from choreo.errors import ChoreoError
from choreo.resources import LinkModel, link_model
from choreo.schedule import Op, Schedule

EPS = 1e-12  # seconds: an arrival this close after a read still counts (float round-off)
DURATION_RTOL = 1e-12
MAX_ERRORS = 50

CHECKS = (
    "index",  # tenant, chunk, node, link or op out of range; bad times
    "self",  # src == dst
    "switch",  # a switch as source or destination: only NPUs hold chunks
    "link",  # link ends differ from the transfer's NPUs
    "health",  # unusable link, or a missing/unusable via link
    "failed",  # touches a failed NPU
    "duration",  # shorter than alpha + count * chunk_bytes / bandwidth
    "op",  # REDUCE in a collective that does not combine
    "capacity",  # fractional shares exceed a physical link
    "overlap",  # two transfers on one exclusive resource at once
    "causality",  # the source does not hold the chunk when the transfer starts
    "double",  # a REDUCE repeats a contribution the destination already holds
    "postcondition",  # a destination ends without (all of) its chunk
)


@dataclass
class Verdict:
    """``errors`` holds the first ``MAX_ERRORS`` messages; ``counts`` counts every violation."""

    ok: bool
    errors: list[str]
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        if self.ok:
            return "schedule verified"
        parts = ", ".join(f"{k} {v}" for k, v in self.counts.items() if v)
        return f"{self.total} violation(s) ({parts})"


class VerificationError(ChoreoError):
    """A schedule broke the contract; carries the full verdict."""

    def __init__(self, verdict: Verdict, shown: int = 5) -> None:
        self.verdict = verdict
        lines = "\n  ".join(verdict.errors[:shown])
        more = verdict.total - min(shown, len(verdict.errors))
        tail = f"\n  ... and {more} more" if more > 0 else ""
        super().__init__(f"invalid schedule: {verdict.summary()}\n  {lines}{tail}")


def check(schedule: Schedule) -> Verdict:
    """Verify and raise ``VerificationError`` unless the schedule is valid."""
    verdict = verify(schedule)
    if not verdict.ok:
        raise VerificationError(verdict)
    return verdict


def verify(schedule: Schedule, *, by_chunk: bool = False) -> Verdict:
    """Check a schedule against its demands, topology and fabric (see the module docstring).
    Ranged schedules replay on runs of chunks unless ``by_chunk`` (the reference replay)."""
    return _Verifier(schedule, by_chunk).run()


# ---- vectorized pre/postconditions (tests compare them with Demand.origins/destinations) ----
def origin_rank(d: Demand, chunks: np.ndarray) -> np.ndarray:
    """The single origin rank of each chunk of a non-combining collective."""
    c = d.collective
    if c in (Collective.BROADCAST, Collective.SCATTER):
        return np.full(len(chunks), d.root, dtype=np.int64)
    if c is Collective.ALLTOALL:
        return chunks // (d.n * d.chunks)
    return chunks // d.chunks


def destination_pairs(d: Demand) -> tuple[np.ndarray, np.ndarray]:
    """All (chunk, rank) pairs that must hold the final chunk."""
    nc, n, c = d.num_chunks, d.n, d.collective
    chunks = np.arange(nc, dtype=np.int64)
    if c in (Collective.ALLGATHER, Collective.ALLREDUCE, Collective.BROADCAST):
        return np.repeat(chunks, n), np.tile(np.arange(n, dtype=np.int64), nc)
    if c in (Collective.REDUCE, Collective.GATHER):
        return chunks, np.full(nc, d.root, dtype=np.int64)
    if c is Collective.ALLTOALL:
        return chunks, (chunks // d.chunks) % n
    return chunks, chunks // d.chunks


# ---- the checker -----------------------------------------------------------------------------
class _Verifier:
    def __init__(self, s: Schedule, by_chunk: bool = False) -> None:
        self.s = s
        self.by_chunk = by_chunk
        self.topo = s.topology
        self.counts = dict.fromkeys(CHECKS, 0)
        self.errors: list[str] = []

    # reporting
    def _report(self, check: str, idx: np.ndarray, what: Callable[[int], str]) -> None:
        idx = np.asarray(idx, dtype=np.int64)
        self.counts[check] += len(idx)
        room = MAX_ERRORS - len(self.errors)
        for i in idx[: max(room, 0)].tolist():
            self.errors.append(f"{self._where(i)}: {what(i)}")

    def _note(self, check: str, message: str) -> None:
        self.counts[check] += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(message)

    def _name(self, v: int) -> str:
        return self.topo.node_name(v) if 0 <= v < self.topo.num_nodes else f"node{v}"

    def _where(self, i: int) -> str:
        s = self.s
        return (
            f"transfer {i} (tenant {int(s.tenant[i])}, chunk {int(s.chunk[i])}, "
            f"{self._name(int(s.src[i]))}->{self._name(int(s.dst[i]))}, "
            f"t={float(s.start[i]):.9g}s)"
        )

    def run(self) -> Verdict:
        if len(self.s):
            valid = self._indices()
            self._links(valid)
            self._dataflow(valid)
        else:
            self._dataflow(np.zeros(0, dtype=bool))
        ok = not any(self.counts.values())
        return Verdict(ok, self.errors, self.counts)

    # index and time sanity: later checks only look at rows that pass
    def _indices(self) -> np.ndarray:
        s, topo = self.s, self.topo
        nt, nn, nl = len(s.demands), topo.num_nodes, len(topo.links)
        tenant_ok = (s.tenant >= 0) & (s.tenant < nt)
        nchunks = np.array([d.num_chunks for d in s.demands] + [0], dtype=np.int64)
        limit = nchunks[np.where(tenant_ok, s.tenant, nt)]
        chunk_ok = tenant_ok & (s.chunk >= 0) & (s.count >= 1) & (s.chunk + s.count <= limit)
        node_ok = (s.src >= 0) & (s.src < nn) & (s.dst >= 0) & (s.dst < nn)
        link_ok = (s.link >= 0) & (s.link < nl)
        op_ok = (s.op == Op.COPY) | (s.op == Op.REDUCE)
        time_ok = np.isfinite(s.start) & np.isfinite(s.end) & (s.start >= 0)
        valid = tenant_ok & chunk_ok & node_ok & link_ok & op_ok & time_ok
        bad = np.flatnonzero(~valid)

        def what(i: int) -> str:
            if not tenant_ok[i]:
                return f"tenant {int(s.tenant[i])} does not exist ({nt} demand(s))"
            if not chunk_ok[i]:
                last = int(s.chunk[i]) + int(s.count[i]) - 1
                shown = f"chunk {int(s.chunk[i])}" + (f"..{last}" if last != s.chunk[i] else "")
                return f"{shown} is out of range 0..{nchunks[s.tenant[i]] - 1}"
            if not node_ok[i]:
                return f"node out of range 0..{nn - 1}"
            if not link_ok[i]:
                return f"link {int(s.link[i])} does not exist in {topo.name} ({nl} links)"
            if not op_ok[i]:
                return f"unknown operation {int(s.op[i])}"
            return f"bad times [{float(s.start[i])}, {float(s.end[i])}]"

        self._report("index", bad, what)
        self._report("self", np.flatnonzero(valid & (s.src == s.dst)), lambda i: "src == dst")
        npu = np.array([topo.is_npu(v) for v in range(nn)], dtype=bool)
        sw = valid & ~(npu[np.where(node_ok, s.src, 0)] & npu[np.where(node_ok, s.dst, 0)])
        self._report(
            "switch",
            np.flatnonzero(sw),
            lambda i: "only NPUs hold chunks, but "
            + self._name(int(s.src[i]) if not npu[s.src[i]] else int(s.dst[i]))
            + " is a switch",
        )
        return valid

    # links, health, durations, capacity, exclusivity
    def _links(self, valid: np.ndarray) -> None:
        s, topo, fabric = self.s, self.topo, self.s.fabric
        rows = np.flatnonzero(valid)
        if not len(rows):
            return
        used = unique_sorted(s.link[rows])
        model = link_model(topo, fabric, used)
        k = np.searchsorted(used, s.link[rows])
        lks = [topo.links[i] for i in used.tolist()]
        lsrc = np.array([lk.src for lk in lks])[k]
        ldst = np.array([lk.dst for lk in lks])[k]
        alpha = np.array([lk.alpha for lk in lks])[k]
        bw = np.array([lk.bandwidth for lk in lks])[k]
        usable = np.array([topo.usable(i) for i in used.tolist()])[k]
        viabad = np.array([bool(b) for b in model.bad])[k]

        self._report(
            "link",
            rows[(lsrc != s.src[rows]) | (ldst != s.dst[rows])],
            lambda i: (
                f"link {int(s.link[i])} joins {self._name(topo.links[s.link[i]].src)}->"
                f"{self._name(topo.links[s.link[i]].dst)}, not the transfer's NPUs"
            ),
        )

        def health(i: int) -> str:
            li = int(s.link[i])
            lk = topo.links[li]
            if not lk.healthy:
                return f"link {li} is unhealthy"
            if not topo.usable(li):
                return f"link {li} has a failed end"
            return f"link {li}: {model.bad[model.row(li)]}"

        self._report("health", rows[~usable | viabad], health)

        failed = np.array(
            sorted(
                set(topo.failed) | {v for v in fabric.failed if fabric.is_npu(v)}
            ),
            dtype=np.int64,
        )
        if len(failed):
            touch = np.isin(s.src[rows], failed) | np.isin(s.dst[rows], failed)
            self._report(
                "failed",
                rows[touch],
                lambda i: "touches failed NPU "
                + self._name(int(s.src[i]) if int(s.src[i]) in set(failed.tolist())
                             else int(s.dst[i])),
            )

        cbytes = np.array([d.chunk_bytes for d in s.demands])[s.tenant[rows]]
        need = alpha + s.count[rows] * cbytes / bw
        dur = s.end[rows] - s.start[rows]
        slack = need * DURATION_RTOL + 4 * np.spacing(np.maximum(np.abs(s.end[rows]), 1.0e-300))
        short = dur < need - slack
        needed = dict(zip(rows[short].tolist(), need[short].tolist(), strict=True))
        self._report(
            "duration",
            rows[short],
            lambda i: (
                f"lasts {float(s.end[i] - s.start[i]):.9g}s, link {int(s.link[i])} needs "
                f"{needed[i]:.9g}s (alpha + count * chunk_bytes / bandwidth)"
            ),
        )

        combining = np.array([d.collective.combining for d in s.demands])[s.tenant[rows]]
        self._report(
            "op",
            rows[(s.op[rows] == Op.REDUCE) & ~combining],
            lambda i: f"REDUCE in {s.demands[s.tenant[i]].collective.value}, which does not "
            "combine",
        )

        self._capacity(model)
        self._exclusive(rows, k, model)

    def _capacity(self, model: LinkModel) -> None:
        fabric, topo = self.s.fabric, self.topo
        if not model.fractional.any() or not len(model.phys):
            return
        nf = len(fabric.links)
        load = np.zeros(nf)
        for k in np.flatnonzero(model.fractional).tolist():
            bw = topo.links[int(model.links[k])].bandwidth
            np.add.at(load, model.physical_of(k), bw)
        cap = np.array([lk.bandwidth for lk in fabric.links])
        for p in np.flatnonzero(load > cap * (1 + 1e-9)).tolist():
            f = fabric.links[p]
            self._note(
                "capacity",
                f"fabric link {p} ({fabric.node_name(f.src)}->{fabric.node_name(f.dst)}): "
                f"fractional shares in use total {load[p]:.6g} B/s, more than its "
                f"{f.bandwidth:.6g} B/s",
            )

    def _exclusive(self, rows: np.ndarray, k: np.ndarray, model: LinkModel) -> None:
        """Sweep every resource in start order with two running maxima of earlier ends:
        over all users and over exclusive users. An exclusive user must start after both;
        a shared user (a fractional share on its port) only after the exclusive ones."""
        s, topo = self.s, self.topo
        nl = len(topo.links)
        # per model row, as CSR: its resource ids and whether each use is exclusive. A
        # share holds itself exclusively and its ports shared; a circuit its ports
        # exclusively; a purely logical link itself.
        plen = np.diff(model.ptr)
        own = model.fractional | (plen == 0)
        rp = np.zeros(len(model.links) + 1, dtype=np.int64)
        np.cumsum(own + plen, out=rp[1:])
        res_a = np.empty(int(rp[-1]), dtype=np.int64)
        exc_a = np.empty(int(rp[-1]), dtype=bool)
        res_a[rp[:-1][own]] = model.links[own]
        exc_a[rp[:-1][own]] = True
        ports = concat_ranges(rp[:-1] + own, plen)
        res_a[ports] = nl + model.resource(len(s.fabric.links))
        exc_a[ports] = np.repeat(~model.fractional, plen)
        cnt = (rp[1:] - rp[:-1])[k]
        tid = np.repeat(rows, cnt)
        first = np.repeat(rp[k], cnt)
        offs = np.arange(len(tid)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        res = res_a[first + offs]
        exc = exc_a[first + offs]
        start, end = s.start[tid], s.end[tid]
        order = np.lexsort((end, start, res))
        res, exc, start, end, tid = res[order], exc[order], start[order], end[order], tid[order]
        gid = np.cumsum(np.r_[True, res[1:] != res[:-1]]).astype(np.int64)
        times = unique_sorted(end)
        erank = np.searchsorted(times, end).astype(np.int64) + 1
        thr = np.searchsorted(times, start + EPS, side="right").astype(np.int64)
        mask = (1 << 32) - 1
        any_max = np.maximum.accumulate((gid << 32) | erank)
        exc_max = np.maximum.accumulate((gid << 32) | np.where(exc, erank, 0))

        def previous(cm: np.ndarray) -> np.ndarray:
            prev = np.r_[0, cm[:-1]]
            return np.where((prev >> 32) == gid, prev & mask, 0)

        prev_any, prev_exc = previous(any_max), previous(exc_max)
        clash = np.where(exc, prev_any > thr, prev_exc > thr)
        hits = np.flatnonzero(clash)
        self.counts["overlap"] += len(hits)
        for h in hits[: max(MAX_ERRORS - len(self.errors), 0)].tolist():
            j = h - 1
            while j >= 0 and gid[j] == gid[h] and not (
                end[j] > start[h] + EPS and (exc[h] or exc[j])
            ):
                j -= 1
            other = f"transfer {int(tid[j])}" if j >= 0 and gid[j] == gid[h] else "another"
            r = int(res[h])
            if r < nl:
                lk = topo.links[r]
                on = f"link {r} ({self._name(lk.src)}->{self._name(lk.dst)})"
            else:
                lane, p = divmod(r - nl, len(s.fabric.links))
                f = s.fabric.links[p]
                on = (
                    f"fabric link {p} ({s.fabric.node_name(f.src)}->"
                    f"{s.fabric.node_name(f.dst)})" + (f", lane {lane}" if lane else "")
                )
            self.errors.append(
                f"{self._where(int(tid[h]))}: overlaps {other} on {on} "
                f"(ends at {float(end[j]) if j >= 0 else float('nan'):.9g}s)"
            )

    # data: replay reads and writes in time order
    def _dataflow(self, valid: np.ndarray) -> None:
        s, nn = self.s, self.topo.num_nodes
        if s.ranged and not self.by_chunk:
            self._rangeflow(np.flatnonzero(valid))
            return
        demands = s.demands
        off = np.zeros(len(demands) + 1, dtype=np.int64)
        off[1:] = np.cumsum([d.num_chunks for d in demands])
        rows = np.flatnonzero(valid)
        chunk = s.chunk[rows].astype(np.int64)
        if s.ranged:  # one row per chunk moved
            picked, chunk = s.select(valid).expanded()
            rows = rows[picked]
        g = off[s.tenant[rows]] + chunk
        rkey_raw = g * nn + s.src[rows]
        wkey_raw = g * nn + s.dst[rows]
        dpairs = [destination_pairs(d) for d in demands]
        dkey_raw = [
            (off[t] + c) * nn + np.asarray(d.ranks, dtype=np.int64)[r]
            for t, (d, (c, r)) in enumerate(zip(demands, dpairs, strict=True))
        ]
        space = int(off[-1]) * nn
        allkeys = np.concatenate([rkey_raw, wkey_raw, *dkey_raw])
        if space <= max(1 << 22, 2 * len(allkeys)):
            keys = np.arange(space, dtype=np.int64)
            rk, wk = rkey_raw, wkey_raw
            dk = dkey_raw
        else:
            keys = unique_sorted(allkeys)
            rk = np.searchsorted(keys, rkey_raw)
            wk = np.searchsorted(keys, wkey_raw)
            dk = [np.searchsorted(keys, x) for x in dkey_raw]
        state = self._initial(keys, off, nn)
        snap = np.empty(len(rows), dtype=object)
        snap[:] = 0
        doubles = self._replay(rows, rk, wk, state, snap)

        empty = np.flatnonzero(snap == 0)
        absent = dict(zip(rows[empty][::-1].tolist(), chunk[empty][::-1].tolist(), strict=True))
        self._report(
            "causality",
            rows[empty],
            lambda i: f"{self._name(int(s.src[i]))} does not hold chunk {absent[i]} yet",
        )
        self.counts["double"] += len(doubles)
        for i, overlap in doubles[: max(MAX_ERRORS - len(self.errors), 0)]:
            self.errors.append(
                f"{self._where(i)}: REDUCE brings contributions of ranks {_ranks(overlap)} that "
                f"{self._name(int(s.dst[i]))} already holds (contribution counted twice)"
            )
        for t, d in enumerate(demands):
            full = (1 << d.n) - 1 if d.collective.combining else 1
            final = state[dk[t]]
            bad = np.flatnonzero(final != full)
            self.counts["postcondition"] += len(bad)
            chunks, ranks = dpairs[t]
            for b in bad[: max(MAX_ERRORS - len(self.errors), 0)].tolist():
                c, r = int(chunks[b]), int(ranks[b])
                head = (
                    f"tenant {t} ({d.collective.value}): rank {r} ({self._name(d.ranks[r])}) "
                    f"chunk {c}"
                )
                got = int(final[b])
                if not d.collective.combining or got == 0:
                    self.errors.append(f"{head}: never arrives")
                else:
                    missing = full & ~got
                    self.errors.append(
                        f"{head}: ends with {got.bit_count()}/{d.n} contributions "
                        f"(missing ranks {_ranks(missing)})"
                    )

    def _rangeflow(self, rows: np.ndarray) -> None:
        """The same replay on runs of chunks (``choreo.rangeflow``), for ranged schedules."""
        s = self.s
        found = rangeflow.replay(s, rows, EPS)
        for i, c in found.causality[: max(MAX_ERRORS - len(self.errors), 0)]:
            self.errors.append(f"{self._where(i)}: {self._name(int(s.src[i]))} does not hold "
                               f"chunk {c} yet")
        self.counts["causality"] += found.causality_chunks
        for i, overlap in found.doubles[: max(MAX_ERRORS - len(self.errors), 0)]:
            self.errors.append(
                f"{self._where(i)}: REDUCE brings contributions of ranks {_ranks(overlap)} that "
                f"{self._name(int(s.dst[i]))} already holds (contribution counted twice)")
        self.counts["double"] += found.double_chunks
        for t, r, c, got in found.postcondition[: max(MAX_ERRORS - len(self.errors), 0)]:
            d = s.demands[t]
            head = (f"tenant {t} ({d.collective.value}): rank {r} ({self._name(d.ranks[r])}) "
                    f"chunk {c}")
            if not d.collective.combining or got == 0:
                self.errors.append(f"{head}: never arrives")
            else:
                missing = ((1 << d.n) - 1) & ~got
                self.errors.append(f"{head}: ends with {got.bit_count()}/{d.n} contributions "
                                   f"(missing ranks {_ranks(missing)})")
        self.counts["postcondition"] += found.postcondition_chunks

    def _initial(self, keys: np.ndarray, off: np.ndarray, nn: int) -> np.ndarray:
        """Initial state per key: rank bit for combining, 1 at the origin otherwise."""
        state = np.empty(len(keys), dtype=object)
        state[:] = 0
        gch = keys // nn
        node = keys % nn
        tenant = np.searchsorted(off, gch, side="right") - 1
        for t, d in enumerate(self.s.demands):
            lo, hi = np.searchsorted(tenant, [t, t + 1])
            if lo == hi:
                continue
            rank_of = np.full(nn, -1, dtype=np.int64)
            rank_of[np.asarray(d.ranks, dtype=np.int64)] = np.arange(d.n)
            r = rank_of[node[lo:hi]]
            if d.collective.combining:
                bits = np.empty(d.n + 1, dtype=object)
                bits[:] = [1 << i for i in range(d.n)] + [0]
                state[lo:hi] = bits[r]
            else:
                chunk = gch[lo:hi] - off[t]
                held = (r >= 0) & (r == origin_rank(d, chunk))
                state[lo:hi] = np.where(held, 1, 0).astype(object)
        return state

    def _replay(
        self,
        rows: np.ndarray,
        rk: np.ndarray,
        wk: np.ndarray,
        state: np.ndarray,
        snap: np.ndarray,
    ) -> list[tuple[int, int]]:
        """Apply reads (at start + EPS) and writes (at end) in time order.

        Events are cut into batches in which no read follows a write to the same key; inside
        a batch all reads see the state before the batch, which is exactly what sequential
        replay would show them, so each batch is a handful of numpy operations.
        """
        s = self.s
        m = len(rows)
        if m == 0:
            return []
        ev_read, ev_t = rangeflow.event_order(s.start[rows], s.end[rows], EPS)
        n_ev = 2 * m
        ev_key = np.where(ev_read, rk[ev_t], wk[ev_t])
        # last write to the same key before each read (grouped running max of positions)
        by_key = np.argsort(ev_key, kind="stable")
        kk = ev_key[by_key]
        grp = np.cumsum(np.r_[True, kk[1:] != kk[:-1]]).astype(np.int64)
        wpos = np.where(ev_read[by_key], 0, by_key + 1)
        big = n_ev + 1
        last = np.maximum.accumulate(grp * big + wpos) - grp * big - 1
        lw = np.full(n_ev, -1, dtype=np.int64)
        lw[by_key] = np.where(ev_read[by_key], last, -1)

        op = s.op[rows]
        doubles: list[tuple[int, int]] = []
        b, window = 0, 256
        while b < n_ev:
            e = n_ev
            w = window
            while True:
                hit = np.flatnonzero(lw[b : b + w] >= b)
                if len(hit):
                    e = b + int(hit[0])
                    break
                if b + w >= n_ev:
                    break
                w *= 2
            window = max(256, 2 * (e - b))
            tids = ev_t[b:e]
            reads = ev_read[b:e]
            rt = tids[reads]
            if len(rt):
                snap[rt] = state[rk[rt]]
            wt = tids[~reads]
            if len(wt):
                self._writes(wt, wk, op, state, snap, rows, doubles)
            b = e
        return doubles

    @staticmethod
    def _writes(
        wt: np.ndarray,
        wk: np.ndarray,
        op: np.ndarray,
        state: np.ndarray,
        snap: np.ndarray,
        rows: np.ndarray,
        doubles: list[tuple[int, int]],
    ) -> None:
        """Apply writes in event order; repeated keys go in successive rounds."""
        keys = wk[wt]
        if len(unique_sorted(keys)) == len(keys):
            rounds = [np.arange(len(wt))]
        else:
            order = np.argsort(keys, kind="stable")
            ks = keys[order]
            starts = np.r_[True, ks[1:] != ks[:-1]]
            idx = np.arange(len(ks))
            seq = idx - np.maximum.accumulate(np.where(starts, idx, 0))
            occ = np.empty(len(ks), dtype=np.int64)
            occ[order] = seq
            rounds = [np.flatnonzero(occ == j) for j in range(int(occ.max()) + 1)]
        for sel in rounds:
            t = wt[sel]
            k = keys[sel]
            red = op[t] == Op.REDUCE
            if red.any():
                tr, kr = t[red], k[red]
                cur, val = state[kr], snap[tr]
                both = cur & val
                clash = np.flatnonzero(both != 0)
                doubles.extend((int(rows[tr[c]]), int(both[c])) for c in clash.tolist())
                state[kr] = cur | val
            cp = ~red
            if cp.any():
                state[k[cp]] = snap[t[cp]]


def _ranks(bits: int, limit: int = 8) -> str:
    out: list[int] = []
    i = 0
    while bits and len(out) <= limit:
        if bits & 1:
            out.append(i)
        bits >>= 1
        i += 1
    shown = ", ".join(map(str, out[:limit]))
    return f"[{shown}{', ...' if len(out) > limit else ''}]"
