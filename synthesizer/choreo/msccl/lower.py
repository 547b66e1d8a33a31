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

The per-event passes (hazards, threadblocks, fusion, dependencies, the ``<gpu>`` text) run in
the compiled engine (``choreo_engine.lower_tenant``); this module prepares their arrays and
words their errors.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from choreo.collectives import Collective
from choreo.errors import InputError
from choreo.msccl import layout
from choreo.msccl.layout import (
    FIFO_CHUNKS,
    MAX_CNT,
    MAX_PEERS_PER_CHANNEL,
    Runtime,
    chunk_units,
    input_index,
    output_index,
    own_apart,
)
from choreo.msccl.packed import ZSTD_LEVEL, Codec, inflate, pack_members, pack_xml
from choreo.msccl.split import TAIL, rank_nodes
from choreo.msccl.xmlmodel import Algo, head_text
from choreo.schedule import Op, Schedule
from choreo.simulate import node_atoms
from choreo.verify import destination_pairs
from choreo_engine import lower_tenant

EPS = 1e-12  # seconds: an arrival this close after a send's start still feeds it (as verify)
ABSENT, SPLIT = -1, -2  # an atom's offset: not in that buffer; its chunks apart in that buffer


@dataclass(frozen=True)
class Pack:
    """Have the compiled pass compress the ``<gpu>`` elements where it writes them, one zstd
    frame per part (``part_ends``: rank counts, as ``Lowering.packed`` takes them; empty:
    per rank), once they reach ``from_bytes``: a 1,024-GPU file's 68 MB are then never
    joined into one buffer, nor handed to Python to be compressed."""

    part_ends: tuple[int, ...] = ()
    from_bytes: int = 0


@dataclass
class Lowering:
    """The program as XML, with the facts tests and the bench report. Its ``<gpu>``
    elements stay the bytes the compiled pass wrote (ASCII) until the text is asked for: a
    1,024-GPU file is 60 MB, which the service only compresses (``packed``), or, lowered
    with a ``Pack``, they come compressed already (``members``; ``gpus`` is then empty)."""

    head: str  # the leading comment and the <algo> start tag
    gpus: bytes  # every rank's <gpu> element, in rank order
    gpu_ends: tuple[int, ...]  # where each rank's element ends in the elements joined
    epochs: int
    base_channels: int
    fused: int
    max_steps: int
    max_bytes: int | None  # the inclusive upper end the file serves (None: unlimited)
    members: tuple[bytes, ...] = ()  # the elements compressed (zstd) per part of ``pack``
    pack: Pack | None = None

    @property
    def size(self) -> int:
        """Bytes of the ``<gpu>`` elements (however they are held)."""
        return self.gpu_ends[-1] if self.gpu_ends else 0

    @cached_property
    def text(self) -> str:
        gpus = inflate(b"".join(self.members)) if self.members else self.gpus
        return f"{self.head}\n{gpus.decode('ascii')}{TAIL}"

    def packed(self, codec: Codec, part_ends: Sequence[int] = ()) -> tuple[bytes, list[int]]:
        """The file compressed one member per part (``packed.pack_members``): its head, the
        ranks' elements up to each of ``part_ends`` (exclusive; default: one per rank), its
        tail. The elements are compressed from the bytes as they are, never decoded; where
        the compiled pass compressed them for these parts, its frames are the members."""
        if (self.members and codec == "zstd" and self.pack is not None
                and tuple(part_ends) == self.pack.part_ends):
            members = [pack_xml(f"{self.head}\n", codec), *self.members, pack_xml(TAIL, codec)]
            return b"".join(members), list(itertools.accumulate(len(m) for m in members))
        elements = inflate(b"".join(self.members)) if self.members else self.gpus
        ends = [self.gpu_ends[e - 1] for e in part_ends] if part_ends else self.gpu_ends
        gpus = memoryview(elements)
        return pack_members([f"{self.head}\n".encode(),
                             *(gpus[a:b] for a, b in itertools.pairwise([0, *ends])),
                             TAIL.encode()], codec)

    @cached_property
    def algo(self) -> Algo:
        from choreo.msccl.parse import parse

        algo = parse(self.text).algo
        assert algo is not None, "the lowering wrote a file its parser rejects"
        return algo


def check_options(dialect: str, instances: int, proto: str, min_bytes: int,
                  max_bytes: int | None) -> Runtime:
    """The runtime profile of ``dialect``, once every option is known to be usable."""
    if dialect not in layout.RUNTIMES:
        raise InputError(f"dialect: {dialect!r} is not one of {', '.join(layout.DIALECTS)}")
    rt = layout.runtime(dialect)
    if proto not in layout.PROTOCOLS:
        raise InputError(f"proto: {proto!r} is not one of {', '.join(layout.PROTOCOLS)}")
    if not isinstance(instances, int) or not 1 <= instances <= rt.max_channels:
        raise InputError(f"instances: must be in 1..{rt.max_channels}, got {instances!r}")
    if min_bytes < 0:
        raise InputError(f"min_bytes: must be >= 0, got {min_bytes}")
    if max_bytes is not None and max_bytes < max(min_bytes, 1):
        raise InputError(f"max_bytes: must be >= max(min_bytes, 1), got {max_bytes}")
    return rt


def check_calls(calls: str | None, coll: Collective, rt: Runtime) -> str:
    """The kind of call a file serves: as asked, or by default the last of ``file_kinds``
    (both where one file can, else out of place)."""
    kinds = layout.file_kinds(coll, rt.name)
    if calls is None:
        return kinds[-1]
    if calls not in layout.CALLS:
        raise InputError(f"calls: {calls!r} is not one of {', '.join(layout.CALLS)}")
    if calls == "both" and rt.legacy:
        raise InputError("calls: the legacy runtime uses a file only for calls whose kind "
                         "equals its inplace attribute; write one file with calls='in-place' "
                         "and one with calls='out-of-place' (bucket_files does)")
    if calls != "out-of-place" and not layout.supports_inplace(coll):
        raise InputError(f"calls: {coll.value} runs out of place only; got {calls!r}")
    return calls


def lower(schedule: Schedule, tenant: int = 0, *, dialect: str = "executor", instances: int = 1,
          proto: str = "Simple", min_bytes: int = 0, max_bytes: int | None = None,
          name: str | None = None, calls: str | None = None,
          file_gpus: int | None = None, pack: Pack | None = None) -> Lowering:
    """Build the MSCCL program of ``tenant``; InputError if the runtime could not run it.

    ``calls``: the kind of call the file serves (``layout.CALLS``; see ``check_calls``).
    ``file_gpus``: the most ``<gpu>`` elements a file that reaches a rank holds, where the
    program is delivered split per node (``split.split_per_node``); the runtime's parser
    stores those, not all of the whole file's (default: the whole file). ``pack``: the
    elements compressed as they are written (see ``Pack``)."""
    rt = check_options(dialect, instances, proto, min_bytes, max_bytes)
    if not 0 <= tenant < len(schedule.demands):
        raise InputError(f"tenant: {tenant} is not in 0..{len(schedule.demands) - 1}")
    n = schedule.demands[tenant].n
    if file_gpus is not None and not 1 <= file_gpus <= n:
        raise InputError(f"file_gpus: must be 1..{n} (the tenant's ranks), got {file_gpus}")
    kind = check_calls(calls, schedule.demands[tenant].collective, rt)
    prog = _Program(schedule, tenant, rt, file_gpus)
    if instances > 1 and prog.ranged:
        raise InputError(f"tenant {tenant}: transfers of several chunks need instances=1 "
                         f"(got {instances}); instances interleave the chunks")
    return prog.run(instances, proto, min_bytes, max_bytes, name, kind, pack)


def lowerable(schedule: Schedule, *, dialect: str = "executor", instances: int = 1,
              proto: str = "Simple") -> str:
    """Why some tenant's program would not run on the dialect's runtime, or "" where every
    tenant's lowers (a portfolio's ``accept``: more chunks are more steps), as it ships:
    split per node where it has more ranks than one file can hold (``node_file_gpus``)."""
    for t in range(len(schedule.demands)):
        try:
            lower(schedule, t, dialect=dialect, instances=instances, proto=proto,
                  file_gpus=node_file_gpus(schedule, t))
        except InputError as err:
            return f"tenant {t}: {err}"
    return ""


def node_file_gpus(schedule: Schedule, tenant: int) -> int | None:
    """The ``<gpu>`` elements of the file a rank loads, where the tenant has more ranks than
    the runtime's parser keeps under one ``<algo>``: such a program runs only split per node
    (``split.split_per_node``; ``host/`` NPU names), so it is lowered for its largest node's
    file. None where the whole file can run."""
    d = schedule.demands[tenant]
    names = schedule.fabric.names
    if d.n <= layout.MAX_CHILDREN or not names:
        return None
    return max(Counter(rank_nodes(names, d.ranks)).values())


class _Program:
    """Per-tenant analysis that does not depend on the channel plan, then assembly per plan."""

    def __init__(self, schedule: Schedule, tenant: int, rt: Runtime,
                 file_gpus: int | None = None) -> None:
        self.rt = rt
        self.dialect = rt.name
        self.tenant = tenant
        d = schedule.demands[tenant]
        self.demand = d
        self.coll: Collective = d.collective
        if not layout.supported(self.coll, rt.name):
            raise InputError(f"tenant {tenant}: the legacy runtime has no {self.coll.value} "
                             "collective; use the executor dialect")
        self.n, self.C, self.root = d.n, d.chunks, d.root
        self.file_gpus = d.n if file_gpus is None else file_gpus
        mask = schedule.tenant == tenant
        if not mask.any():
            raise InputError(f"tenant {tenant}: the schedule has no transfers for it")
        mine, origin = own_apart(schedule.select(mask), d)
        self.gid = np.flatnonzero(mask)[origin]
        self.count = mine.count.astype(np.int64)
        self.ranged = mine.ranged
        self._ranks(mine)
        self.start, self.end, self.op = mine.start, mine.end, mine.op
        self.T = len(self.gid)
        self._atoms(mine)
        if np.any(self.op == Op.REDUCE) and not self.coll.combining:
            x = int(np.flatnonzero(self.op == Op.REDUCE)[0])
            raise InputError(f"{self._name(x)}: REDUCE in a {self.coll.value}, which does not "
                             "combine")
        self._order()
        self._offsets()
        self._finals()
        self._channels()

    # ---- analysis ----------------------------------------------------------------------
    def _name(self, x: int) -> str:
        return (f"transfer {int(self.gid[x])} (tenant {self.tenant}, chunk {int(self.chunk[x])}, "
                f"rank {int(self.src[x])} -> rank {int(self.dst[x])})")

    def _ranks(self, mine: Schedule) -> None:
        d = self.demand
        src, dst = mine.src, mine.dst
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
        self.rank_of = lut
        self.chunk = mine.chunk.astype(np.int64)
        bad = np.flatnonzero((self.chunk < 0) | (self.count < 1)
                             | (self.chunk + self.count > d.num_chunks))
        if len(bad):
            raise InputError(f"transfer {int(self.gid[bad[0]])}: chunks "
                             f"{int(self.chunk[bad[0]])}+{int(self.count[bad[0]])} are not in "
                             f"0..{d.num_chunks - 1}")

    def _atoms(self, mine: Schedule) -> None:
        """Per transfer, the atoms it reads at its source and writes at its destination (in
        chunk order, as offsets into one array per side), and per atom its node, first chunk
        and size (see ``simulate.Atoms``)."""
        atoms = node_atoms(mine)
        base = sum(d.num_chunks for d in mine.demands[: self.tenant])
        self.atom_lo = atoms.first - base
        self.atom_size = atoms.size
        self.atom_node = self.rank_of[atoms.node]  # every atom's node is one of the ranks
        bounds = np.arange(self.T + 1)
        (rt, self.reads_atom), (wt, self.writes_atom) = atoms.reads, atoms.writes
        self.reads_ptr = np.searchsorted(rt, bounds)
        self.writes_ptr = np.searchsorted(wt, bounds)

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
        self.lane = self._lanes()

    def _lanes(self) -> np.ndarray:
        """Per transfer its connection among those of its pair: transfers of one pair that
        overlap in time need separate connections, each taking the first lane free by its
        start (in start order). Where no two of a pair overlap, which is the usual case, every
        lane is 0 without walking the transfers one by one."""
        order = np.lexsort((self.end, self.start))
        pair = (self.src * self.n + self.dst)[order]
        by_pair = np.argsort(pair, kind="stable")  # start order within each pair
        pair, grouped = pair[by_pair], order[by_pair]
        same = pair[1:] == pair[:-1]
        earlier, later = grouped[:-1], grouped[1:]
        if not np.any(same & (self.end[earlier] > self.start[later] + EPS)):
            return np.zeros(self.T, dtype=np.int64)
        lane = [0] * self.T
        ends: dict[tuple[int, int], list[float]] = defaultdict(list)
        src, dst = self.src.tolist(), self.dst.tolist()
        start, end = self.start.tolist(), self.end.tolist()
        for x in order.tolist():
            busy = ends[(src[x], dst[x])]
            for k, e in enumerate(busy):
                if e <= start[x] + EPS:
                    busy[k] = end[x]
                    lane[x] = k
                    break
            else:
                lane[x] = len(busy)
                busy.append(end[x])
        return np.asarray(lane, dtype=np.int64)

    def _offsets(self) -> None:
        """Where each atom's chunks sit in its node's input and output (ABSENT if they do not
        belong there; SPLIT if they are not back to back, which the range must not be: a
        ranged atom that starts where its node holds it and crosses an edge of the index's
        linear blocks, ``layout.linear_block``)."""
        lo, size, node = self.atom_lo, self.atom_size, self.atom_node
        args = (self.coll, self.n, self.C)
        self.atom_in = input_index(*args, lo, node, self.root)
        self.atom_out = output_index(*args, lo, node, self.root)
        last = lo + size - 1
        for output, first in ((False, self.atom_in), (True, self.atom_out)):
            block = layout.linear_block(*args, output)
            if block is not None:
                first[(first >= 0) & (lo // block != last // block)] = SPLIT

    def _finals(self) -> None:
        """Every destination ends with its chunk; a rank's own data is copied i -> o. A chunk
        that never arrives is kept as ``self.missing`` and raised after the hazard errors."""
        coll, n, C, root, d = self.coll, self.n, self.C, self.root, self.demand
        c, g = self._not_received()
        out = output_index(coll, n, C, c, g, root)
        idx = input_index(coll, n, C, c, g, root)
        keep = out >= 0
        bad = np.flatnonzero(keep & ((idx < 0) | coll.combining))
        self.missing = ""
        if len(bad):
            b = int(bad[0])
            self.missing = (f"tenant {self.tenant}: chunk {int(c[b])} never reaches rank "
                            f"{int(g[b])} (NPU {d.ranks[int(g[b])]}); the schedule is incomplete")
        self.copies = (g[keep], idx[keep], out[keep])

    def _not_received(self) -> tuple[np.ndarray, np.ndarray]:
        """The (chunk, rank) destination pairs no transfer writes, by chunk then rank.

        Received ranges are merged per rank (keys ``rank * span + chunk``); where every rank
        wants every chunk (AllReduce, AllGather, Broadcast) the gaps are cut out of whole
        ranks rather than looking up each of the ``ranks x chunks`` pairs, millions at 1024
        GPUs."""
        d = self.demand
        span = d.num_chunks + 1
        recv_lo = self.dst * span + self.chunk
        edges = np.concatenate([recv_lo, recv_lo + self.count])
        step = np.concatenate([np.ones(self.T, dtype=np.int64), -np.ones(self.T, dtype=np.int64)])
        order = np.argsort(edges, kind="stable")
        edges, depth = edges[order], np.cumsum(step[order])
        if d.single_destination is not None:
            chunks, ranks = destination_pairs(d)
            pos = np.searchsorted(edges, ranks * span + chunks, side="right") - 1
            covered = (pos >= 0) & (depth[np.maximum(pos, 0)] > 0)
            return chunks[~covered], ranks[~covered]
        # Gaps: before the first edge, [edges[k], edges[k+1]) where depth[k] == 0, and after
        # the last edge; rank r wants the keys [r * span, r * span + num_chunks).
        if len(edges):
            zero = depth[:-1] == 0
            gap_lo = np.concatenate([[0], edges[:-1][zero], edges[-1:]])
            gap_hi = np.concatenate([edges[:1], edges[1:][zero], [d.n * span]])
        else:
            gap_lo, gap_hi = np.zeros(1, dtype=np.int64), np.full(1, d.n * span)
        # A gap may cross ranks: one piece per rank it touches.
        first = gap_lo // span
        gap, rank = _spread(first, np.maximum(gap_hi - 1, gap_lo) // span - first + 1)
        lo = np.maximum(gap_lo[gap] - rank * span, 0)
        hi = np.minimum(gap_hi[gap] - rank * span, d.num_chunks)
        whole = (hi > lo) & (rank < d.n)
        piece, chunks = _spread(lo[whole], hi[whole] - lo[whole])
        ranks = rank[whole][piece]
        order = np.lexsort((ranks, chunks))
        return chunks[order], ranks[order]

    def _channels(self) -> None:
        """Base channel per connection: per rank at most 32 send and 32 receive peers each."""
        # Connections (src, dst, lane) numbered in order of their first transfer.
        key = (self.src * self.n + self.dst) * (int(self.lane.max()) + 1) + self.lane
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        by_first = np.argsort(first)
        number = np.empty_like(by_first)
        number[by_first] = np.arange(len(by_first))
        ids = number[inverse.ravel()]
        at = first[by_first]
        src, dst = self.src[at], self.dst[at]
        if (len(at) and len(np.unique(src * self.n + dst)) == len(at)
                and np.bincount(src).max() <= MAX_PEERS_PER_CHANNEL
                and np.bincount(dst).max() <= MAX_PEERS_PER_CHANNEL):
            # one connection a pair, few peers a rank: every connection on channel 0, as
            # the greedy below would put it (a 1,024-GPU plan's 16 K connections: 0.05 s)
            self.base = np.zeros(len(self.src), dtype=np.int64)
            self.base_channels = 1
            return
        outs: dict[tuple[int, int], int] = defaultdict(int)
        ins: dict[tuple[int, int], int] = defaultdict(int)
        pair_chans: dict[tuple[int, int], set[int]] = defaultdict(set)
        base = [0] * len(at)
        for k, (s, d) in enumerate(zip(self.src[at].tolist(), self.dst[at].tolist(),
                                       strict=True)):
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
        # One integer per (src, dst, channel): a 1-D unique sorts integers, where a unique over
        # the stacked columns would compare rows as opaque bytes, an order of magnitude slower.
        key = (self.src * self.n + self.dst) * self.base_channels + self.base
        _, conn = np.unique(key, return_inverse=True)
        longest = float(np.bincount(conn.ravel(), weights=pieces).max())
        return max(1, math.ceil(longest / (0.8 * limit)))

    # ---- the compiled passes ------------------------------------------------------------
    def run(self, instances: int, proto: str, min_bytes: int, max_bytes: int | None,
            name: str | None, calls: str, pack: Pack | None = None) -> Lowering:
        rt = self.rt
        units = layout.Units(self.coll, self.n, chunk_units(self.coll, self.n, self.C) * instances)
        L = np.asarray(self.L, dtype=np.int64)
        out = lower_tenant(
            self.n, self.src, self.dst, self.op == Op.REDUCE, self.count, self.chunk, L,
            self.pos, self.base, self.base_channels, self.reads_ptr, self.reads_atom,
            self.writes_ptr, self.writes_atom, self.atom_size, self.atom_in, self.atom_out,
            self.coll.combining, *self.copies, self.first_epochs(rt.max_steps), instances,
            # the compiled pass counts every <gpu> of the whole file; a rank's file holds
            # ``file_gpus`` of them
            rt.max_steps, rt.max_channels, rt.max_tbs, rt.max_nodes + self.n - self.file_gpus,
            rt.max_depid + 1,
            FIFO_CHUNKS, MAX_CNT, units.in_units, units.out_units,
            list(pack.part_ends) if pack else [], ZSTD_LEVEL if pack else 0,
            pack.from_bytes if pack else 0)
        error = out.get("error")
        if error in ("not_held", "split", "scattered"):
            raise InputError(self._error(error, out["at"]))
        if self.missing:
            raise InputError(self.missing)
        if error is not None:
            raise InputError(self._error(error, out["at"]))
        served = self._served(min_bytes, max_bytes, out["scratch"], units.L)
        head = head_text(self._header(units, out["nchannels"], proto, min_bytes, served, name,
                                      calls), self._comment(instances))
        members = tuple(out.get("members", ()))
        return Lowering(head, out.get("text", b""), tuple(out["gpu_ends"]), out["epochs"],
                        self.base_channels, out["fused"], out["max_steps"], served, members,
                        pack if members else None)

    def _served(self, min_bytes: int, max_bytes: int | None, scratch: int, L: int) -> int | None:
        """The upper end the file can serve. Legacy allocates ``maxBytes * s_chunks / L`` of
        scratch per rank at communicator creation, so its range stops where that would pass
        ``LEGACY_SCRATCH_CAP`` (larger calls run NCCL); it must still serve ``min_bytes``."""
        if not self.rt.legacy:
            return max_bytes
        top = layout.LEGACY_UNLIMITED if max_bytes is None else max_bytes + 1  # exclusive
        if scratch:
            top = min(top, layout.LEGACY_SCRATCH_CAP * L // scratch)
        if top <= min_bytes:
            raise InputError(
                f"tenant {self.tenant}: the legacy runtime allocates maxBytes * s_chunks / "
                f"nchunksperloop of scratch per rank at communicator creation; with "
                f"s_chunks={scratch} of nchunksperloop={L} even the range's first size "
                f"{min_bytes} B would need more than {layout.LEGACY_SCRATCH_CAP >> 20} MiB; "
                "use the executor dialect")
        return top - 1

    def _error(self, kind: str, at: list[int]) -> str:
        t, rt = self.tenant, self.rt
        if kind == "not_held":
            x, g, a = at
            return (f"{self._name(x)}: rank {g} sends chunk {int(self.atom_lo[a])} before it "
                    "holds it")
        if kind == "split":
            a, g = at
            lo, size = int(self.atom_lo[a]), int(self.atom_size[a])
            return (f"tenant {t}: chunks {lo}..{lo + size - 1} are not contiguous in rank {g}'s "
                    "buffers; split the range")
        if kind == "scattered":
            return (f"{self._name(at[0])}: its chunks lie in different places on one rank; a "
                    "range must be contiguous in one buffer")
        if kind == "channels":
            return (f"tenant {t}: the {rt.name} runtime allows {rt.max_steps} steps per "
                    f"threadblock; this schedule would need {at[0]} channels "
                    f"(> {rt.max_channels}) to spill them; use fewer chunks or instances")
        if kind == "threadblocks":
            return (f"tenant {t}: rank {at[0]} needs {at[1]} threadblocks; the {rt.name} "
                    f"runtime allows {rt.max_tbs}")
        if kind == "nodes":
            held = (f"all {self.n}" if self.file_gpus == self.n
                    else f"the {self.file_gpus} of its file's")
            return (f"tenant {t}: rank {at[0]} needs {at[1] - self.n + self.file_gpus} XML "
                    f"nodes (the <algo>, {held} <gpu> elements, its threadblocks and steps); "
                    f"the {rt.name} runtime's parser stores {rt.max_nodes}; use fewer chunks "
                    "or instances")
        if kind == "dep_targets":
            return (f"tenant {t}: rank {at[0]} has {at[1]} threadblocks that others wait on; "
                    f"the {rt.name} runtime stores depid in an int8_t (at most "
                    f"{rt.max_depid + 1} targets); use fewer instances or chunks")
        return (f"tenant {t}: needs {at[0]} channels (> {rt.max_channels}); use fewer "
                "instances")

    def _header(self, units: layout.Units, nchannels: int, proto: str, min_bytes: int,
                max_bytes: int | None, name: str | None, calls: str) -> dict[str, str]:
        d, rt = self.demand, self.rt
        default = f"choreo-{self.coll.value}-{self.n}r-{self.C}c"
        algo_name = (name or (f"{d.name}-{default}" if d.name else default))
        if rt.legacy:
            assert max_bytes is not None, "_served bounds every legacy range"
            algo_name = algo_name[: layout.MAX_LEGACY_NAME]
            top = max_bytes + 1
        else:
            top = 0 if max_bytes is None else max_bytes
        return {
            "name": algo_name[: layout.MAX_ATTR_LEN],
            "proto": proto,
            "nchannels": str(nchannels),
            "nchunksperloop": str(units.L),
            "ngpus": str(self.n),
            "coll": layout.coll_spelling(self.coll, rt.name),
            "inplace": str(int(calls != "out-of-place")),
            "outofplace": str(int(calls != "in-place")),
            "minBytes": str(min_bytes),
            "maxBytes": str(top),
        }

    def _comment(self, instances: int) -> str:
        d = self.demand
        return (f"choreo msccl dialect={self.dialect} collective={self.coll.value} "
                f"ranks={self.n} chunks={self.C} instances={instances} root={self.root}"
                + (f" tenant={d.name}" if d.name and "--" not in d.name and " " not in d.name
                   else ""))


def _spread(first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranges ``first[i] .. first[i] + count[i] - 1`` laid end to end: (i, value) per item."""
    which = np.repeat(np.arange(len(first)), count)
    offset = np.arange(len(which)) - np.repeat(np.cumsum(count) - count, count)
    return which, first[which] + offset
