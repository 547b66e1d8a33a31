"""Lower one tenant of a Schedule to an MSCCL program.

Why it deadlocks never: every transfer becomes a send event (at its start) and a receive event
(at its end); all events are put in one global order ``L`` by time. Every wait the runtime can
perform — a receive on its send, a send on the receive ``FIFO_CHUNKS`` messages back on the
same connection, a ``depid``/``deps`` dependency — points to an earlier event in ``L``, and every
threadblock runs its steps in ``L`` order. So the unfinished step that is first in ``L`` can
always run. A receive is fused with the following send of the same value (``rcs``, ``rrs``,
``rrcs``) only if nothing else waits on the receive before that send.

Buffers: a chunk a rank must output lives in ``o`` at its output offset; a chunk it only relays
(or a partial sum it must not keep) lives in ``s``; the rank's own data is read from ``i`` until
it is first written, so one file serves in-place and out-of-place calls. Data hazards between
threadblocks of a rank (read after write, and for reductions write after read/write) become
dependencies; several dependencies of one step become a ``nop`` chain.

A transfer of several chunks (``Schedule.count``) becomes one step of that ``cnt``, cut into
consecutive steps of at most ``MAX_CNT`` chunks. Hazards are tracked per *atom*: the pieces a
rank's chunk space falls into at the boundaries of the ranges it sends and receives, so the
analysis costs per range, not per chunk.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from choreo.collectives import Collective
from choreo.errors import InputError
from choreo.msccl import layout
from choreo.msccl.layout import (
    FIFO_CHUNKS,
    MAX_CHANNELS,
    MAX_CNT,
    MAX_NODES,
    MAX_PEERS_PER_CHANNEL,
    MAX_STEPS,
    MAX_TBS,
    chunk_units,
    input_index,
    output_index,
)
from choreo.msccl.xmlmodel import Algo, Gpu, Step, Tb
from choreo.schedule import Op, Schedule
from choreo.simulate import node_atoms
from choreo.verify import destination_pairs

EPS = 1e-12  # seconds: an arrival this close after a send's start still feeds it (as verify)
Loc = tuple[str, int]
IndexFn = Callable[[Collective, int, int, int, int, int], "int | None"]


@dataclass
class _Op:
    type: str
    pos: int
    src: Loc
    dst: Loc
    deps: list[int]  # event ids
    events: tuple[int, ...]
    cnt: int = 1


@dataclass
class _TbPlan:
    send: int
    recv: int
    chan: int
    ops: list[_Op] = field(default_factory=list)


@dataclass
class Lowering:
    """The program before instances are applied, with the facts tests and the bench report."""

    algo: Algo
    epochs: int
    base_channels: int
    fused: int
    max_steps: int


def check_options(dialect: str, instances: int, proto: str, min_bytes: int,
                  max_bytes: int | None) -> None:
    if dialect not in layout.DIALECTS:
        raise InputError(f"dialect: {dialect!r} is not one of {', '.join(layout.DIALECTS)}")
    if proto not in layout.PROTOCOLS:
        raise InputError(f"proto: {proto!r} is not one of {', '.join(layout.PROTOCOLS)}")
    if not isinstance(instances, int) or not 1 <= instances <= MAX_CHANNELS:
        raise InputError(f"instances: must be in 1..{MAX_CHANNELS}, got {instances!r}")
    if min_bytes < 0:
        raise InputError(f"min_bytes: must be >= 0, got {min_bytes}")
    if max_bytes is not None and max_bytes < max(min_bytes, 1):
        raise InputError(f"max_bytes: must be >= max(min_bytes, 1), got {max_bytes}")


def lower(schedule: Schedule, tenant: int = 0, *, dialect: str = "executor", instances: int = 1,
          proto: str = "Simple", min_bytes: int = 0, max_bytes: int | None = None,
          name: str | None = None) -> Lowering:
    """Build the MSCCL program of ``tenant``; InputError if the runtime could not run it."""
    check_options(dialect, instances, proto, min_bytes, max_bytes)
    if not 0 <= tenant < len(schedule.demands):
        raise InputError(f"tenant: {tenant} is not in 0..{len(schedule.demands) - 1}")
    prog = _Program(schedule, tenant, dialect)
    if instances > 1 and prog.ranged:
        raise InputError(f"tenant {tenant}: transfers of several chunks need instances=1 "
                         f"(got {instances}); instances interleave the chunks")
    limit = MAX_STEPS[dialect]
    epochs = prog.first_epochs(limit)
    while True:
        if epochs > 1 and epochs * prog.base_channels * instances > MAX_CHANNELS:
            raise InputError(
                f"tenant {tenant}: the {dialect} runtime allows {limit} steps per threadblock; "
                f"this schedule would need {epochs * prog.base_channels * instances} channels "
                f"(> {MAX_CHANNELS}) to spill them; use fewer chunks or instances")
        tbs, max_steps = prog.assemble(epochs)
        if max_steps <= limit:
            break
        epochs = max(epochs + 1, math.ceil(epochs * max_steps / (0.8 * limit)))
    algo = prog.emit(tbs, instances, proto, min_bytes, max_bytes, name)
    return Lowering(algo, epochs, prog.base_channels, prog.fused, max_steps)


class _Program:
    """Per-tenant analysis that does not depend on the channel plan, then assembly per plan."""

    def __init__(self, schedule: Schedule, tenant: int, dialect: str) -> None:
        self.dialect = dialect
        self.tenant = tenant
        d = schedule.demands[tenant]
        self.demand = d
        self.coll: Collective = d.collective
        if not layout.supported(self.coll, dialect):
            raise InputError(f"tenant {tenant}: the legacy runtime has no {self.coll.value} "
                             "collective; use the executor dialect")
        self.n, self.C, self.root = d.n, d.chunks, d.root
        mask = schedule.tenant == tenant
        self.gid = np.flatnonzero(mask)
        if not len(self.gid):
            raise InputError(f"tenant {tenant}: the schedule has no transfers for it")
        mine = schedule.select(mask)
        self.count = mine.count.astype(np.int64)
        self.ranged = mine.ranged
        self._ranks(schedule, mask)
        self.start, self.end, self.op = mine.start, mine.end, mine.op
        self.T = len(self.gid)
        self._atoms(mine)
        if np.any(self.op == Op.REDUCE) and not self.coll.combining:
            x = int(np.flatnonzero(self.op == Op.REDUCE)[0])
            raise InputError(f"{self._name(x)}: REDUCE in a {self.coll.value}, which does not "
                             "combine")
        self._order()
        self._hazards()
        self._channels()

    # ---- analysis ----------------------------------------------------------------------
    def _name(self, x: int) -> str:
        return (f"transfer {int(self.gid[x])} (tenant {self.tenant}, chunk {int(self.chunk[x])}, "
                f"rank {int(self.src[x])} -> rank {int(self.dst[x])})")

    def _ranks(self, schedule: Schedule, mask: np.ndarray) -> None:
        d = self.demand
        src, dst = schedule.src[mask], schedule.dst[mask]
        size = int(max(src.max(), dst.max(), max(d.ranks))) + 1
        lut = np.full(size, -1, dtype=np.int64)
        lut[list(d.ranks)] = np.arange(d.n)
        sr, dr = lut[src], lut[dst]
        bad = np.flatnonzero((sr < 0) | (dr < 0))
        if len(bad):
            x = int(bad[0])
            npu = int(src[x]) if sr[x] < 0 else int(dst[x])
            raise InputError(
                f"transfer {int(self.gid[x])} (NPU {int(src[x])} -> NPU {int(dst[x])}) touches "
                f"NPU {npu}, which is not one of tenant {self.tenant}'s ranks; MSCCL can only "
                "use GPUs of the communicator (synthesize with relay=False)")
        self.src, self.dst = sr.astype(np.int64), dr.astype(np.int64)
        self.chunk = schedule.chunk[mask].astype(np.int64)
        bad = np.flatnonzero((self.chunk < 0) | (self.count < 1)
                             | (self.chunk + self.count > d.num_chunks))
        if len(bad):
            raise InputError(f"transfer {int(self.gid[bad[0]])}: chunks "
                             f"{int(self.chunk[bad[0]])}+{int(self.count[bad[0]])} are not in "
                             f"0..{d.num_chunks - 1}")

    def _atoms(self, mine: Schedule) -> None:
        """Per transfer, the atoms it reads at its source and writes at its destination (in
        chunk order), and per atom its first chunk and size (see ``simulate.Atoms``)."""
        atoms = node_atoms(mine)
        base = sum(d.num_chunks for d in mine.demands[: self.tenant])
        self.atom_lo = (atoms.first - base).tolist()
        self.atom_size = atoms.size.tolist()
        self.reads_of = _per_transfer(*atoms.reads, self.T)
        self.writes_of = _per_transfer(*atoms.writes, self.T)

    def _order(self) -> None:
        """The global event order L: sends at start, receives just before their end."""
        T = self.T
        if np.any(self.end - self.start <= 2 * EPS):
            x = int(np.flatnonzero(self.end - self.start <= 2 * EPS)[0])
            raise InputError(f"{self._name(x)} takes no time; cannot order it")
        time = np.concatenate([self.start, self.end - EPS])
        kind = np.concatenate([np.ones(T, dtype=np.int8), np.zeros(T, dtype=np.int8)])
        ids = np.arange(2 * T)
        self.L = np.lexsort((ids, kind, time))
        self.pos = np.empty(2 * T, dtype=np.int64)
        self.pos[self.L] = ids
        # Lanes: transfers of one pair that overlap in time need separate connections.
        lane = np.zeros(T, dtype=np.int64)
        ends: dict[tuple[int, int], list[float]] = defaultdict(list)
        for x in np.lexsort((self.end, self.start)).tolist():
            busy = ends[(int(self.src[x]), int(self.dst[x]))]
            s = float(self.start[x])
            for k, e in enumerate(busy):
                if e <= s + EPS:
                    busy[k] = float(self.end[x])
                    lane[x] = k
                    break
            else:
                lane[x] = len(busy)
                busy.append(float(self.end[x]))
        self.lane = lane

    def _hazards(self) -> None:
        """Walk L once: where each event reads and writes, and which events it must wait for."""
        T, n, combining = self.T, self.n, self.coll.combining
        src, dst, op = self.src.tolist(), self.dst.tolist(), self.op.tolist()
        alo, asize = self.atom_lo, self.atom_size
        reduce = int(Op.REDUCE)
        self.deps: list[list[int]] = [[] for _ in range(2 * T)]
        self.read_loc: list[Loc] = [("i", -1)] * T  # per send
        self.home: list[Loc] = [("o", -1)] * T  # per receive: where it stores
        self.operand: list[Loc] = [("i", -1)] * T  # per REDUCE receive: what it adds to
        self.readers: dict[int, list[int]] = {}
        self.next_write: dict[int, int] = {}
        homes: dict[int, Loc] = {}  # atom -> where it lives once received
        last: dict[int, int] = {}  # atom -> last receive event
        reads: dict[int, list[int]] = defaultdict(list)
        self.scratch = [0] * n

        def initial(x: int, g: int, a: int) -> Loc:
            idx = self._span(input_index, alo[a], asize[a], g)
            if idx is None:
                raise InputError(f"{self._name(x)}: rank {g} sends chunk {alo[a]} before it "
                                 "holds it")
            return ("i", idx)

        for e in self.L.tolist():
            if e < T:
                g = src[e]
                locs = []
                for a in self.reads_of[e]:
                    w = last.get(a)
                    if w is None:
                        locs.append(initial(e, g, a))
                    else:
                        locs.append(homes[a])
                        if w not in self.deps[e]:
                            self.deps[e].append(w)
                            self.readers[w].append(e)
                    reads[a].append(e)
                self.read_loc[e] = self._joined(e, locs, self.reads_of[e])
                continue
            x = e - T
            g = dst[x]
            atoms = self.writes_of[x]
            for a in atoms:
                if a not in homes:
                    out = self._span(output_index, alo[a], asize[a], g)
                    if out is None:
                        homes[a] = ("s", self.scratch[g])
                        self.scratch[g] += asize[a]
                    else:
                        homes[a] = ("o", out)
            self.home[x] = self._joined(x, [homes[a] for a in atoms], atoms)
            if op[x] == reduce:
                self.operand[x] = self._joined(
                    x, [initial(x, g, a) if a not in last else homes[a] for a in atoms], atoms)
            waits: list[int] = []
            for a in atoms:
                w = last.get(a)
                if w is not None:
                    if combining:
                        waits.append(w)
                    self.next_write[w] = max(self.next_write.get(w, op[x]), op[x])
                if combining:
                    waits.extend(reads[a])
                last[a] = e
                reads[a] = []
            self.deps[e].extend(dict.fromkeys(waits))
            self.readers[e] = []
        self.final_writes = set(last.values())
        self._finals()

    def _span(self, index_of: IndexFn, lo: int, size: int, g: int) -> int | None:
        """Where chunks ``lo..lo+size-1`` sit in ``g``'s input or output, if they sit together;
        None when they do not belong there."""
        first = index_of(self.coll, self.n, self.C, lo, g, self.root)
        if size == 1 or first is None or self.coll is Collective.ALLREDUCE:
            return first
        for j in range(1, size):
            if index_of(self.coll, self.n, self.C, lo + j, g, self.root) != first + j:
                raise InputError(f"tenant {self.tenant}: chunks {lo}..{lo + size - 1} are not "
                                 f"contiguous in rank {g}'s buffers; split the range")
        return first

    def _joined(self, x: int, locs: list[Loc], atoms: list[int]) -> Loc:
        """One buffer location for a transfer's atoms, which must lie back to back."""
        if len(locs) == 1:
            return locs[0]
        buf, off = locs[0]
        for (b, o), a in zip(locs, atoms, strict=True):
            if b != buf or o != off:
                raise InputError(f"{self._name(x)}: its chunks lie in different places on one "
                                 "rank; a range must be contiguous in one buffer")
            off += self.atom_size[a]
        return locs[0]

    def _finals(self) -> None:
        """Every destination ends with its chunk; a rank's own data is copied i -> o."""
        coll, n, C, root, d = self.coll, self.n, self.C, self.root, self.demand
        self.copies: dict[int, list[tuple[int, int]]] = defaultdict(list)
        span = d.num_chunks + 1
        recv_lo = self.dst * span + self.chunk
        edges = np.concatenate([recv_lo, recv_lo + self.count])
        step = np.concatenate([np.ones(self.T, dtype=np.int64), -np.ones(self.T, dtype=np.int64)])
        order = np.argsort(edges, kind="stable")
        edges, depth = edges[order], np.cumsum(step[order])
        chunks, ranks = destination_pairs(d)
        at = ranks * span + chunks
        pos = np.searchsorted(edges, at, side="right") - 1
        covered = (pos >= 0) & (depth[np.maximum(pos, 0)] > 0)
        for c, g in zip(chunks[~covered].tolist(), ranks[~covered].tolist(), strict=True):
            out = output_index(coll, n, C, c, g, root)
            idx = input_index(coll, n, C, c, g, root)
            if out is None:
                continue
            if idx is None or coll.combining:
                raise InputError(f"tenant {self.tenant}: chunk {c} never reaches rank {g} "
                                 f"(NPU {d.ranks[g]}); the schedule is incomplete")
            self.copies[g].append((idx, out))

    def _channels(self) -> None:
        """Base channel per connection: per rank at most 32 send and 32 receive peers each."""
        conn_of: dict[tuple[int, int, int], int] = {}
        ids = np.empty(self.T, dtype=np.int64)
        for x, key in enumerate(zip(self.src.tolist(), self.dst.tolist(), self.lane.tolist(),
                                    strict=True)):
            ids[x] = conn_of.setdefault(key, len(conn_of))
        outs: dict[tuple[int, int], int] = defaultdict(int)
        ins: dict[tuple[int, int], int] = defaultdict(int)
        pair_chans: dict[tuple[int, int], set[int]] = defaultdict(set)
        base = [0] * len(conn_of)
        for (s, d, _lane), k in sorted(conn_of.items(), key=lambda kv: kv[1]):
            ch = 0
            while (outs[(s, ch)] >= MAX_PEERS_PER_CHANNEL or ins[(d, ch)] >= MAX_PEERS_PER_CHANNEL
                   or ch in pair_chans[(s, d)]):
                ch += 1
            base[k] = ch
            outs[(s, ch)] += 1
            ins[(d, ch)] += 1
            pair_chans[(s, d)].add(ch)
        self.base = np.asarray(base, dtype=np.int64)[ids]
        self.base_channels = int(self.base.max()) + 1

    def first_epochs(self, limit: int) -> int:
        """Where the search for the epoch count starts: every send of one connection is a step
        of one threadblock, so a connection with more pieces than ``limit`` needs more epochs
        whatever the pairing. Starting there usually saves assembling a plan only to find it
        too long."""
        pieces = -(-self.count // MAX_CNT)
        _, conn = np.unique(np.stack([self.src, self.dst, self.base]), axis=1,
                            return_inverse=True)
        longest = float(np.bincount(conn.ravel(), weights=pieces).max())
        return max(1, math.ceil(longest / (0.8 * limit)))

    # ---- assembly for one channel plan ------------------------------------------------------
    def assemble(self, epochs: int) -> tuple[dict[int, list[_TbPlan]], int]:
        T, B = self.T, self.base_channels
        pos = self.pos
        epoch = np.minimum(epochs - 1, pos[:T] * epochs // (2 * T))
        chan = (epoch * B + self.base).tolist()
        src, dst, ops = self.src.tolist(), self.dst.tolist(), self.op.tolist()
        count = self.count.tolist()
        reduce = int(Op.REDUCE)
        # Pair each rank's receive peer with the send peer it forwards most to, per channel.
        weight: dict[tuple[int, int, int, int], int] = defaultdict(int)
        sends: dict[tuple[int, int], set[int]] = defaultdict(set)
        recvs: dict[tuple[int, int], set[int]] = defaultdict(set)
        for y in range(T):
            sends[(src[y], chan[y])].add(dst[y])
            recvs[(dst[y], chan[y])].add(src[y])
            for w in self.deps[y]:
                x = w - T
                if chan[x] == chan[y]:
                    weight[(src[y], chan[y], src[x], dst[y])] += 1
        tb_of: dict[tuple[int, int, str, int], tuple[int, int]] = {}
        tbs: dict[int, list[_TbPlan]] = defaultdict(list)

        def new_tb(g: int, send: int, recv: int, ch: int) -> None:
            tbs[g].append(_TbPlan(send, recv, ch))
            ref = (g, len(tbs[g]) - 1)
            if send >= 0:
                tb_of[(g, ch, "S", send)] = ref
            if recv >= 0:
                tb_of[(g, ch, "R", recv)] = ref

        for (g, ch, q, p), _w in sorted(weight.items(), key=lambda kv: (-kv[1], kv[0])):
            if (g, ch, "S", p) not in tb_of and (g, ch, "R", q) not in tb_of:
                new_tb(g, p, q, ch)
        for (g, ch), peers in sorted(sends.items()):
            for p in sorted(peers):
                if (g, ch, "S", p) not in tb_of:
                    new_tb(g, p, -1, ch)
        for (g, ch), peers in sorted(recvs.items()):
            for q in sorted(peers):
                if (g, ch, "R", q) not in tb_of:
                    new_tb(g, -1, q, ch)
        # Events into their threadblocks in L order; a rank's own-data copies go first.
        where: list[tuple[int, int]] = [(0, 0)] * (2 * T)
        for g, copies in self.copies.items():
            new_tb(g, -1, -1, 0)
            local = tbs[g][-1]
            local.ops.extend(_Op("cpy", -1, ("i", i), ("o", o), [], ()) for i, o in copies)
        for e in self.L.tolist():
            if e < T:
                ref = tb_of[(src[e], chan[e], "S", dst[e])]
                op = _Op("s", int(pos[e]), self.read_loc[e], self.home[e], list(self.deps[e]),
                         (e,), count[e])
            else:
                x = e - T
                ref = tb_of[(dst[x], chan[x], "R", src[x])]
                if ops[x] == reduce:
                    op = _Op("rrc", int(pos[e]), self.operand[x], self.home[x],
                             list(self.deps[e]), (e,), count[x])
                else:
                    op = _Op("r", int(pos[e]), self.home[x], self.home[x],
                             list(self.deps[e]), (e,), count[x])
            tbs[ref[0]][ref[1]].ops.append(op)
        self._fuse(tbs, chan)
        for plans in tbs.values():
            for t, plan in enumerate(plans):
                for k, o in enumerate(plan.ops):
                    for e in o.events:
                        where[e] = (t, k)
        return tbs, self._dependencies(tbs, where)

    def _fuse(self, tbs: dict[int, list[_TbPlan]], chan: list[int]) -> None:
        """Merge a receive with the next step of its threadblock when that sends the value,
        unless something else waits on the receive before that send would run."""
        T = self.T
        pos = self.pos.tolist()
        firsts: dict[int, list[tuple[int, int]]] = {}  # two earliest waiters, earliest first

        def waits_on(target: int, waiter: int) -> None:
            new = (pos[waiter], waiter)
            best = firsts.get(target)
            if best is None:
                firsts[target] = [new]
            elif len(best) == 1:
                best.insert(0 if new < best[0] else 1, new)
            elif new < best[1]:
                best[0:2] = [new, best[0]] if new < best[0] else [best[0], new]

        for e in range(2 * T):
            for w in self.deps[e]:
                waits_on(w, e)
        conns: dict[tuple[int, int, int], list[int]] = defaultdict(list)
        for x in self.L[self.L < T].tolist():
            conns[(int(self.src[x]), int(self.dst[x]), chan[x])].append(x)
        for seq in conns.values():
            for k in range(len(seq) - FIFO_CHUNKS):
                waits_on(T + seq[k], seq[k + FIFO_CHUNKS])
        self.fused = 0
        for plans in tbs.values():
            for plan in plans:
                if plan.send < 0 or plan.recv < 0:
                    continue
                ops: list[_Op] = []
                k = 0
                while k < len(plan.ops):
                    a = plan.ops[k]
                    b = plan.ops[k + 1] if k + 1 < len(plan.ops) else None
                    if b is not None and a.type in ("r", "rrc") and b.type == "s" \
                            and a.events[0] in b.deps and self._same_chunks(a, b):
                        r_ev, s_ev = a.events[0], b.events[0]
                        other = next((p for p, w in firsts.get(r_ev, ()) if w != s_ev),
                                     1 << 62)
                        if other > pos[s_ev]:
                            ops.append(self._fused(a, b, r_ev, s_ev))
                            self.fused += 1
                            k += 2
                            continue
                    ops.append(a)
                    k += 1
                plan.ops = ops

    def _same_chunks(self, a: _Op, b: _Op) -> bool:
        x, y = a.events[0] - self.T, b.events[0]
        return bool(self.chunk[x] == self.chunk[y] and self.count[x] == self.count[y])

    def _fused(self, a: _Op, b: _Op, r_ev: int, s_ev: int) -> _Op:
        deps = [w for w in a.deps] + [w for w in b.deps if w != r_ev]
        if a.type == "r":
            return _Op("rcs", b.pos, a.dst, a.dst, deps, (r_ev, s_ev), a.cnt)
        x = r_ev - self.T
        needed = (any(e != s_ev for e in self.readers.get(r_ev, ()))
                  or self.next_write.get(r_ev) == int(Op.REDUCE)
                  or (r_ev in self.final_writes and self.home[x][0] == "o"))
        return _Op("rrcs" if needed else "rrs", b.pos, a.src, a.dst, deps, (r_ev, s_ev), a.cnt)

    def _dependencies(self, tbs: dict[int, list[_TbPlan]], where: list[tuple[int, int]]) -> int:
        """Reduce each op's waits to one per other threadblock, minus those already implied;
        returns the longest threadblock in steps (each extra dependency costs a ``nop``)."""
        longest = 0
        self.waits: dict[tuple[int, int], list[list[tuple[int, int]]]] = {}
        for g, plans in tbs.items():
            for t, plan in enumerate(plans):
                seen: dict[int, int] = {}
                per_op: list[list[tuple[int, int]]] = []
                steps = 0
                for op in plan.ops:
                    need: dict[int, int] = {}
                    for e in op.deps:
                        tt, kk = where[e]
                        if tt == t:
                            continue
                        if kk > need.get(tt, -1):
                            need[tt] = kk
                    keep = [(tt, kk) for tt, kk in sorted(need.items()) if seen.get(tt, -1) < kk]
                    for tt, kk in keep:
                        seen[tt] = kk
                    per_op.append(keep)
                    steps += max(0, len(keep) - 1) + _pieces(op.cnt)
                self.waits[(g, t)] = per_op
                longest = max(longest, steps)
        return longest

    # ---- output ----------------------------------------------------------------------------
    def emit(self, tbs: dict[int, list[_TbPlan]], instances: int, proto: str, min_bytes: int,
             max_bytes: int | None, name: str | None) -> Algo:
        I = instances  # noqa: E741
        L0 = chunk_units(self.coll, self.n, self.C)
        units = layout.Units(self.coll, self.n, L0 * I)
        gpus: list[Gpu] = []
        nchannels = 1
        limit_tbs = MAX_TBS[self.dialect]
        for g in range(self.n):
            plans = tbs.get(g, [])
            # step index of each op's real step, after its nops
            s_of: list[list[int]] = []
            for t, plan in enumerate(plans):
                idx, cur = [], 0
                for keep, op in zip(self.waits[(g, t)], plan.ops, strict=True):
                    cur += max(0, len(keep) - 1) + _pieces(op.cnt)
                    idx.append(cur - 1)  # others wait for the op's last piece
                s_of.append(idx)
            hasdep: set[tuple[int, int]] = set()
            for t in range(len(plans)):
                for keep in self.waits[(g, t)]:
                    hasdep.update(keep)
            gpu = Gpu(g, units.in_units, units.out_units, self.scratch[g] * I)
            for t, plan in enumerate(plans):
                base_steps: list[Step] = []
                for k, op in enumerate(plan.ops):
                    keep = self.waits[(g, t)][k]
                    for tt, kk in keep[:-1]:
                        base_steps.append(Step(len(base_steps), "nop", "i", -1, "o", -1, 0,
                                               tt, s_of[tt][kk], 0))
                    dep, deps = (keep[-1][0], s_of[keep[-1][0]][keep[-1][1]]) if keep else (-1, -1)
                    dst = op.dst
                    if op.type == "s" and dst[0] == "s" and dst[1] >= self.scratch[g]:
                        # The runtime ignores where a send's data lands; name the receiver's
                        # slot only where this rank's parser accepts the offset.
                        dst = ("s", -1)
                    for j in range(_pieces(op.cnt)):
                        done = j * MAX_CNT
                        last = j == _pieces(op.cnt) - 1
                        base_steps.append(Step(
                            len(base_steps), op.type, op.src[0], _moved(op.src[1], done),
                            dst[0], _moved(dst[1], done), min(MAX_CNT, op.cnt - done),
                            dep if j == 0 else -1, deps if j == 0 else -1,
                            int(last and (t, k) in hasdep)))
                for u in range(I):
                    tb = Tb(t * I + u, plan.send, plan.recv, plan.chan * I + u)
                    nchannels = max(nchannels, tb.chan + 1)
                    gpu.tbs.append(tb)
                    if I == 1:
                        tb.steps = base_steps
                        continue
                    for st in base_steps:
                        tb.steps.append(Step(
                            st.s, st.type, st.srcbuf, _inst(st.srcoff, I, u), st.dstbuf,
                            _inst(st.dstoff, I, u), st.cnt,
                            st.depid * I + u if st.depid >= 0 else -1, st.deps, st.hasdep))
            if len(gpu.tbs) > limit_tbs:
                raise InputError(f"tenant {self.tenant}: rank {g} needs {len(gpu.tbs)} "
                                 f"threadblocks; the {self.dialect} runtime allows {limit_tbs}")
            nodes = 2 + len(gpu.tbs) + sum(len(tb.steps) for tb in gpu.tbs)
            if self.dialect == "executor" and nodes > MAX_NODES:
                raise InputError(f"tenant {self.tenant}: rank {g} needs {nodes} XML nodes; the "
                                 f"executor's parser stores {MAX_NODES}; use fewer chunks or "
                                 "instances")
            gpus.append(gpu)
        if nchannels > MAX_CHANNELS:
            raise InputError(f"tenant {self.tenant}: needs {nchannels} channels (> "
                             f"{MAX_CHANNELS}); use fewer instances")
        return Algo(self._header(units, nchannels, proto, min_bytes, max_bytes, name), gpus,
                    comment=self._comment(I))

    def _header(self, units: layout.Units, nchannels: int, proto: str, min_bytes: int,
                max_bytes: int | None, name: str | None) -> dict[str, str]:
        d, dialect = self.demand, self.dialect
        default = f"choreo-{self.coll.value}-{self.n}r-{self.C}c"
        algo_name = (name or (f"{d.name}-{default}" if d.name else default))
        if dialect == "legacy":
            algo_name = algo_name[: layout.MAX_LEGACY_NAME]
            top = layout.LEGACY_UNLIMITED if max_bytes is None else max_bytes + 1
        else:
            top = 0 if max_bytes is None else max_bytes
        return {
            "name": algo_name[: layout.MAX_ATTR_LEN],
            "proto": proto,
            "nchannels": str(nchannels),
            "nchunksperloop": str(units.L),
            "ngpus": str(self.n),
            "coll": layout.coll_spelling(self.coll, dialect),
            "inplace": str(int(layout.supports_inplace(self.coll))),
            "outofplace": "1",
            "minBytes": str(min_bytes),
            "maxBytes": str(top),
        }

    def _comment(self, instances: int) -> str:
        d = self.demand
        return (f"choreo msccl dialect={self.dialect} collective={self.coll.value} "
                f"ranks={self.n} chunks={self.C} instances={instances} root={self.root}"
                + (f" tenant={d.name}" if d.name and "--" not in d.name and " " not in d.name
                   else ""))


def _per_transfer(transfer: np.ndarray, atom: np.ndarray, T: int) -> list[list[int]]:
    """The atoms of each transfer, from (transfer, atom) pairs sorted by transfer."""
    cut = np.searchsorted(transfer, np.arange(T + 1)).tolist()
    atoms = atom.tolist()
    return [atoms[cut[x]:cut[x + 1]] for x in range(T)]


def _pieces(cnt: int) -> int:
    """Steps one op of ``cnt`` chunks needs (the parser takes at most MAX_CNT per step)."""
    return -(-cnt // MAX_CNT)


def _moved(off: int, by: int) -> int:
    return off + by if off >= 0 else off


def _inst(off: int, instances: int, u: int) -> int:
    return off * instances + u if off >= 0 else off
