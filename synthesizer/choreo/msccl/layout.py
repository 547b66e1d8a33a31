"""What each collective means in MSCCL buffer units: sizes, spellings, aliasing, postcondition.

The XML talks in *units*: ``nchunksperloop`` units make up one loop of the buffer, and every
collective fixes how many units the input (``i``) and output (``o``) hold per rank. The lowering
and the interpreter both read this module, so the definition of a collective lives in one place;
the interpreter derives everything it checks from the ``<algo>`` header alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from choreo.collectives import Collective, Demand
from choreo.schedule import Schedule

PROTOCOLS = ("Simple", "LL", "LL128")

EXECUTOR_COLL = {c: c.value for c in Collective}
LEGACY_COLL = {
    Collective.ALLREDUCE: "allreduce",
    Collective.ALLGATHER: "allgather",
    Collective.REDUCE: "reduce",
    Collective.BROADCAST: "broadcast",
    Collective.ALLTOALL: "alltoall",
    Collective.REDUCESCATTER: "reduce_scatter",
}
# Every spelling either runtime's parser accepts, including ones choreo never writes.
EXECUTOR_SPELLINGS = frozenset(
    ["reduce", "broadcast", "allreduce", "reducescatter", "allgather", "send", "recv",
     "gather", "scatter", "alltoall", "alltoallv"])
LEGACY_SPELLINGS = frozenset(
    ["allreduce", "allgather", "reduce", "broadcast", "alltoall", "reduce_scatter", "custom"])

# Per-connection FIFO depth in chunk messages: NCCL_STEPS (8) / MSCCL_CHUNKSTEPS (4) for the
# Simple protocol, the smallest of the three, so a file that completes with it completes always.
FIFO_CHUNKS = 2

MAX_PEERS_PER_CHANNEL = 32
MAX_CNT = 71
MAX_CHILDREN = 1024
MAX_ATTRS = 16
MAX_ATTR_LEN = 255
MAX_LEGACY_NAME = 63
MAX_LEGACY_ALGOS = 4
LEGACY_DEFAULT_MAX_BYTES = 1 << 27
# Legacy maxBytes is exclusive and 0 means "never"; a file without scratch that serves every
# size up from its minimum is written with this upper end.
LEGACY_UNLIMITED = 1 << 40
# The legacy runtime allocates maxBytes * s_chunks / nchunksperloop bytes of scratch per rank
# when the communicator is created, whatever the calls' sizes: a file's range is capped so
# that this stays small (larger calls fall back to NCCL).
LEGACY_SCRATCH_CAP = 1 << 30


@dataclass(frozen=True)
class Runtime:
    """One MSCCL runtime as its loader counts: which XML ``format`` it reads (``executor`` or
    ``legacy`` spelling and attribute rules) and the limits past which it fails to load or
    mis-stores a file. Every number is read from that runtime's parser or kernel."""

    name: str
    format: str
    max_steps: int  # steps per threadblock: ``s`` < this
    max_tbs: int  # threadblocks per GPU
    max_channels: int  # ``nchannels``
    max_nodes: int = 4095  # XML nodes stored per rank; the parser fails on the 4096th
    max_depid: int = 127  # ``depid`` is stored in an int8_t

    @property
    def legacy(self) -> bool:
        return self.format == "legacy"


RUNTIMES = {
    # Azure/msccl-executor-nccl (NCCL 2.23 fork)
    "executor": Runtime("executor", "executor", max_steps=64, max_tbs=1024, max_channels=32),
    # the same executor inside RCCL (ROCm)
    "rccl": Runtime("rccl", "executor", max_steps=64, max_tbs=64, max_channels=128),
    # microsoft/msccl (NCCL 2.12 fork)
    "legacy": Runtime("legacy", "legacy", max_steps=256, max_tbs=216, max_channels=32),
}
DIALECTS = tuple(RUNTIMES)
CALLS = ("both", "in-place", "out-of-place")


def runtime(dialect: str) -> Runtime:
    """The runtime profile a dialect name stands for (the name must be one of ``DIALECTS``)."""
    return RUNTIMES[dialect]


def file_kinds(coll: Collective, dialect: str) -> tuple[str, ...]:
    """The kinds of call (``CALLS``) one file per kind must serve so that both in-place and
    out-of-place calls of ``coll`` run choreo's schedule. The executor reads ``inplace`` and
    ``outofplace`` as two switches, so one file serves both; legacy compares ``inplace`` with
    the call's kind, so it needs one file for each. AllToAll runs out of place only."""
    if not supports_inplace(coll):
        return ("out-of-place",)
    return ("in-place", "out-of-place") if runtime(dialect).legacy else ("both",)


def stored_depid(depid: int) -> int:
    """The threadblock a ``depid`` names once the runtimes store it in an int8_t."""
    return (depid + 128) % 256 - 128


def file_suffix(kind: str) -> str:
    """What a file's name adds for its kind of call: only legacy's in-place twin differs."""
    return "-inplace" if kind == "in-place" else ""


def max_buckets(coll: Collective, dialect: str) -> int | None:
    """Size buckets one collective may have in ``dialect`` (legacy loads at most 4 files)."""
    if not runtime(dialect).legacy:
        return None
    return MAX_LEGACY_ALGOS // len(file_kinds(coll, dialect))


def coll_spelling(coll: Collective, dialect: str) -> str:
    """The ``coll`` attribute for ``dialect``; None-safe callers check support first."""
    table = LEGACY_COLL if runtime(dialect).legacy else EXECUTOR_COLL
    return table[coll]


def parse_coll(text: str) -> Collective | None:
    """The collective named by either dialect's spelling, or None (send, recv, custom, ...)."""
    if text == "reduce_scatter":
        return Collective.REDUCESCATTER
    try:
        return Collective(text)
    except ValueError:
        return None


def supported(coll: Collective, dialect: str) -> bool:
    return not runtime(dialect).legacy or coll in LEGACY_COLL


@dataclass(frozen=True)
class Units:
    """Buffer sizes of one collective in units, with ``L`` = nchunksperloop and ``n`` ranks."""

    coll: Collective
    n: int
    L: int

    @property
    def piece(self) -> int:
        """Units of one rank's piece (allgather input, reducescatter output, ...)."""
        return self.L // self.n

    @property
    def in_units(self) -> int:
        return self.piece if self.coll in (Collective.ALLGATHER, Collective.GATHER) else self.L

    @property
    def out_units(self) -> int:
        return self.piece if self.coll in (Collective.REDUCESCATTER, Collective.SCATTER) \
            else self.L

    @property
    def needs_piece_divisible(self) -> bool:
        return self.coll in (Collective.ALLGATHER, Collective.GATHER, Collective.REDUCESCATTER,
                             Collective.SCATTER, Collective.ALLTOALL)

    def inplace_alias(self, rank: int, root: int) -> dict[int, int]:
        """In-place calls: input unit -> output unit occupying the same memory."""
        c, p = self.coll, self.piece
        if c in (Collective.ALLREDUCE, Collective.BROADCAST, Collective.REDUCE,
                 Collective.ALLTOALL):
            return {k: k for k in range(self.L)}
        if c is Collective.ALLGATHER or (c is Collective.GATHER and rank == root):
            return {j: rank * p + j for j in range(p)}
        if c is Collective.REDUCESCATTER or (c is Collective.SCATTER and rank == root):
            return {rank * p + j: j for j in range(p)}
        return {}

    def has_input(self, rank: int, root: int) -> bool:
        return self.coll not in (Collective.BROADCAST, Collective.SCATTER) or rank == root

    def expected(self, rank: int, root: int) -> dict[int, tuple[int, int]]:
        """Output unit -> (origin rank, input unit) for data collectives, or (-1, reduced unit)
        for combining ones (every rank's contribution to that unit, exactly once)."""
        c, p, n = self.coll, self.piece, self.n
        if c is Collective.ALLREDUCE:
            return {k: (-1, k) for k in range(self.L)}
        if c is Collective.REDUCESCATTER:
            return {j: (-1, rank * p + j) for j in range(p)}
        if c is Collective.REDUCE:
            return {k: (-1, k) for k in range(self.L)} if rank == root else {}
        if c is Collective.ALLGATHER or (c is Collective.GATHER and rank == root):
            return {k: (k // p, k % p) for k in range(self.L)}
        if c is Collective.BROADCAST:
            return {k: (root, k) for k in range(self.L)}
        if c is Collective.SCATTER:
            return {j: (root, rank * p + j) for j in range(p)}
        if c is Collective.ALLTOALL:
            return {s * p + j: (s, rank * p + j) for s in range(n) for j in range(p)}
        return {}


def chunk_units(coll: Collective, n: int, chunks: int) -> int:
    """nchunksperloop before instances: one unit per schedule chunk in a rank's largest buffer."""
    if coll in (Collective.BROADCAST, Collective.REDUCE):
        return chunks
    return n * chunks


def input_index(coll: Collective, n: int, chunks: int, k: np.ndarray, rank: np.ndarray,
                root: int) -> np.ndarray:
    """Where schedule chunk ``k[j]`` starts in ``rank[j]``'s input (chunk units), or -1."""
    k, rank = np.asarray(k, dtype=np.int64), np.asarray(rank, dtype=np.int64)
    if coll in (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.REDUCE):
        return k + 0 * rank
    if coll in (Collective.ALLGATHER, Collective.GATHER):
        return np.where(k // chunks == rank, k % chunks, -1)
    if coll in (Collective.BROADCAST, Collective.SCATTER):
        return np.where(rank == root, k, -1)
    # alltoall: chunk k leaves rank k // (n*chunks) from its block for the destination
    return np.where(k // (n * chunks) == rank, k % (n * chunks), -1)


def output_index(coll: Collective, n: int, chunks: int, k: np.ndarray, rank: np.ndarray,
                 root: int) -> np.ndarray:
    """Where schedule chunk ``k[j]`` must end in ``rank[j]``'s output (chunk units), or -1."""
    k, rank = np.asarray(k, dtype=np.int64), np.asarray(rank, dtype=np.int64)
    if coll in (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.BROADCAST):
        return k + 0 * rank
    if coll in (Collective.REDUCE, Collective.GATHER):
        return np.where(rank == root, k, -1)
    if coll in (Collective.REDUCESCATTER, Collective.SCATTER):
        return np.where(k // chunks == rank, k % chunks, -1)
    src, dst = k // (n * chunks), (k // chunks) % n
    return np.where(dst == rank, src * chunks + k % chunks, -1)


def linear_block(coll: Collective, n: int, chunks: int, output: bool) -> int | None:
    """The size of the aligned blocks of schedule chunks within which ``output_index``
    (``output``) or ``input_index`` of one rank is linear or absent throughout: a range
    that lies in one block and starts where the rank holds it is back to back there, and
    one that crosses a block edge is not (the next block belongs to another rank or peer).
    None: linear everywhere (the index is the chunk itself, or absent for the whole rank)."""
    if output:
        if coll in (Collective.REDUCESCATTER, Collective.SCATTER, Collective.ALLTOALL):
            return chunks
        return None
    if coll in (Collective.ALLGATHER, Collective.GATHER):
        return chunks
    if coll is Collective.ALLTOALL:
        return n * chunks
    return None


def supports_inplace(coll: Collective) -> bool:
    """AllToAll in place would overwrite input blocks before they are sent."""
    return coll is not Collective.ALLTOALL


def own_apart(mine: Schedule, demand: Demand) -> tuple[Schedule, np.ndarray]:
    """``mine`` (one tenant's transfers) with each transfer whose range crosses an edge of
    its sender's input shard (AllGather, Gather) or its receiver's output shard
    (ReduceScatter, Scatter) cut there into consecutive transfers, each taking its share of
    the time: those chunks sit in another buffer than the rest, and a step moves one
    contiguous range. (A rail plan's round of blocks sends all of a host's shards, the
    sender's own among them, in one transfer.) Returns the transfers and, per transfer, the
    one it came from."""
    kept = np.arange(len(mine))
    if not len(mine):
        return mine, kept
    if demand.collective in (Collective.ALLGATHER, Collective.GATHER):
        side = mine.src
    elif demand.collective in (Collective.REDUCESCATTER, Collective.SCATTER):
        side = mine.dst
    else:
        return mine, kept
    lut = np.full(int(max(side.max(), max(demand.ranks))) + 1, -1, dtype=np.int64)
    lut[list(demand.ranks)] = np.arange(demand.n)
    rank = lut[side]
    lo = mine.chunk.astype(np.int64)
    hi = lo + mine.count
    edges = [rank * demand.chunks, (rank + 1) * demand.chunks]
    cuts = [(rank >= 0) & (lo < e) & (e < hi) for e in edges]
    pieces = 1 + cuts[0] + cuts[1]
    if int(pieces.max()) == 1:
        return mine, kept
    origin = np.repeat(kept, pieces)
    # per transfer its piece edges: lo, the shard's edges it crosses, hi
    inner = np.where(cuts[0], edges[0], edges[1])
    j = np.arange(len(origin)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    p = pieces[origin]
    first = np.where(j == 0, lo[origin], np.where(j == 1, inner[origin], edges[1][origin]))
    last = np.where(j == p - 1, hi[origin],
                    np.where(j == 0, inner[origin], edges[1][origin]))
    start, took = mine.start[origin], (mine.end - mine.start)[origin]
    share = took / mine.count[origin]
    cols = {name: getattr(mine, name)[origin] for name in ("tenant", "src", "dst", "link", "op")}
    return Schedule(mine.fabric, mine.topology, mine.demands, engine=mine.engine,
                    meta=dict(mine.meta), chunk=first, count=last - first,
                    start=start + share * (first - lo[origin]),
                    end=np.where(j == p - 1, mine.end[origin],
                                 start + share * (last - lo[origin])), **cols), origin
