"""Rail-aligned hierarchical AllReduce for tenants too large for chunk-by-chunk matching.

A tenant of hundreds of GPUs has ``n`` pieces that each of its ``n`` ranks must receive, so a
chunk-level schedule has ``n**2`` transfers and its MSCCL program outgrows the runtime's step
and node limits. Multi-GPU hosts with one NIC per GPU (rails) give the structure to avoid
that (as NCCL's and TACCL's hierarchical AllReduce do):

1. inside each host, reduce-scatter the buffer into one *part* per GPU slot: the GPU at slot
   ``s`` collects part ``s`` from its host mates (a host missing that GPU hands the part to
   another of its GPUs);
2. across hosts, the owners of part ``s`` run recursive halving/doubling on it (its rail),
   so each owner sends ``O(log hosts)`` ranges; extra hosts beyond a power of two fold in;
3. inside each host, the owners all-gather their reduced parts.

Every send moves a contiguous chunk range (``Schedule.count``), so the schedule has
``O(n log n)`` transfers. The sends are routed on the fabric and timed by the congestion
simulator, like the fixed baselines, and the result is checked by the verifier as usual.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from choreo.collectives import Collective, Demand
from choreo.errors import InputError
from choreo.routing import timed_plan
from choreo.schedule import Op, Schedule
from choreo.topology import Topology
from choreo.transforms import restrict

ENGINE = "rail-hierarchical"
LARGE_TENANT = 256  # ranks; larger AllReduce tenants on multi-GPU hosts use this plan
MAX_SLICE_RANKS = 1024  # slices * ranks: bounds the MSCCL program (and its lowering time)


def slices_for(size: int, n: int) -> int:
    """Pipelined slices: overlap helps once transfers are bandwidth-bound, and costs an extra
    round of latency per slice below that (measured on dgx-h100-16/18, docs/engines.md)."""
    wanted = 1 if size < 8 << 20 else 2 if size < 64 << 20 else 4
    return max(1, min(wanted, MAX_SLICE_RANKS // max(n, 1)))


def hosts_of(fabric: Topology, ranks: Sequence[int]) -> list[list[tuple[int, int]]] | None:
    """Per host (in order of first rank), its ranks as (slot, rank index) sorted by slot; the
    slot is the GPU's position among all of its host's NPUs (``host/...`` names), failed ones
    included, so slot ``s`` is the same rail on every host. None without host names."""
    if not fabric.names or not all("/" in fabric.names[v] for v in ranks):
        return None
    members: dict[str, list[int]] = {}
    for v in fabric.all_npus:
        name = fabric.names[v]
        if "/" in name:
            members.setdefault(name.split("/", 1)[0], []).append(v)
    slot = {v: i for vs in members.values() for i, v in enumerate(vs)}
    groups: dict[str, list[tuple[int, int]]] = {}
    for i, v in enumerate(ranks):
        groups.setdefault(fabric.names[v].split("/", 1)[0], []).append((slot[v], i))
    return [sorted(g) for g in groups.values()]


def applies(fabric: Topology, demand: Demand, large: int = LARGE_TENANT) -> bool:
    """Whether ``demand`` gets the hierarchical plan: a large AllReduce over several hosts."""
    if demand.collective is not Collective.ALLREDUCE or demand.n <= large:
        return False
    hosts = hosts_of(fabric, demand.ranks)
    return hosts is not None and len(hosts) > 1


class _Sends:
    """Rank-to-rank sends of chunk ranges, each tagged with its algorithm step."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int, int, int, int]] = []

    def add(self, step: int, src: int, dst: int, lo: int, hi: int, op: Op) -> None:
        if hi > lo:
            self.rows.append((step, src, dst, lo, hi - lo, int(op)))


def plan(demand: Demand, hosts: list[list[tuple[int, int]]], slices: int = 1) -> _Sends:
    """The three phases in rank space (see the module docstring), on ``slices`` consecutive
    slices of the buffer whose phases overlap: slice j starts one host phase after j - 1, so
    its reduce-scatter inside hosts runs while j - 1 is on the rails."""
    slots = sorted({s for host in hosts for s, _ in host})
    index = {s: k for k, s in enumerate(slots)}  # slot -> part
    owners = []  # owners[h][k]: the rank index holding part k on host h
    for host in hosts:
        by_slot = dict(host)
        local = [r for _, r in host]
        owners.append([by_slot.get(s, local[k % len(local)]) for k, s in enumerate(slots)])
    out = _Sends()
    total, parts = demand.num_chunks, len(slots)
    for j in range(slices):
        lo, hi = j * total // slices, (j + 1) * total // slices
        bounds = [lo + k * (hi - lo) // parts for k in range(parts + 1)]
        _slice(out, j * (parts - 1), hosts, owners, index, bounds)
    return out


def _slice(out: _Sends, step: int, hosts: list[list[tuple[int, int]]],
           owners: list[list[int]], index: dict[int, int], bounds: list[int]) -> None:
    parts = len(bounds) - 1
    for h, host in enumerate(hosts):  # 1: reduce-scatter inside each host
        for s, r in host:
            for k in range(parts):
                if owners[h][k] != r:
                    out.add(step + (k - index[s] - 1) % parts, r, owners[h][k], bounds[k],
                            bounds[k + 1], Op.REDUCE)
    step += parts - 1
    last = step
    for k in range(parts):  # 2: recursive halving / doubling across hosts, per part
        last = _rhd(out, step, [o[k] for o in owners], bounds[k], bounds[k + 1])
    for h, host in enumerate(hosts):  # 3: all-gather inside each host
        for s, r in host:
            for k in range(parts):
                if owners[h][k] != r:
                    out.add(last + (index[s] - k - 1) % parts, owners[h][k], r, bounds[k],
                            bounds[k + 1], Op.COPY)


def _rhd(out: _Sends, step: int, members: list[int], lo: int, hi: int) -> int:
    """AllReduce of chunks ``lo..hi-1`` among ``members``; returns the next free step."""
    m = len(members)
    p = 1 << (m.bit_length() - 1)
    extra = m - p
    levels = p.bit_length() - 1

    def cut(b: int) -> int:
        return lo + b * (hi - lo) // p

    if extra:
        for i in range(extra):
            out.add(step, members[p + i], members[i], lo, hi, Op.REDUCE)
        step += 1
    for lvl in reversed(range(levels)):
        dist = 1 << lvl
        for i in range(p):
            first = (i ^ dist) & ~(dist - 1)
            out.add(step, members[i], members[i ^ dist], cut(first), cut(first + dist),
                    Op.REDUCE)
        step += 1
    for lvl in range(levels):
        dist = 1 << lvl
        for i in range(p):
            first = i & ~(dist - 1)
            out.add(step, members[i], members[i ^ dist], cut(first), cut(first + dist), Op.COPY)
        step += 1
    if extra:
        for i in range(extra):
            out.add(step, members[i], members[p + i], lo, hi, Op.COPY)
        step += 1
    return step


def hierarchical(fabric: Topology, demands: Sequence[Demand], relay: bool = False) -> Schedule:
    """Every demand's hierarchical AllReduce, routed on ``fabric`` and simulated jointly
    (tenants that share links delay each other exactly as the simulator says). A demand is
    cut into ``min(chunks, slices_for(size, n))`` pipelined slices."""
    demands = tuple(demands)
    cols: list[np.ndarray] = []
    for t, d in enumerate(demands):
        hosts = hosts_of(fabric, d.ranks)
        if hosts is None or d.collective is not Collective.ALLREDUCE:
            raise InputError(f"tenants[{t}]: the hierarchical plan needs an AllReduce over "
                             "hosts with host/ names")
        sends = plan(d, hosts, min(d.chunks, slices_for(d.size, d.n)))
        rows = np.asarray(sends.rows, dtype=np.int64).reshape(-1, 6)
        ranks = np.asarray(d.ranks, dtype=np.int64)
        rows[:, 1], rows[:, 2] = ranks[rows[:, 1]], ranks[rows[:, 2]]
        cols.append(np.column_stack([np.full(len(rows), t), rows]))
    table = np.concatenate(cols)
    tenant, step, src, dst, chunk, count, op = table.T
    view = restrict(fabric, {r for d in demands for r in d.ranks}, relay)
    part_bytes = max(d.size for d in demands) / 8  # routes are chosen for a part's range
    return timed_plan(fabric, view, demands, part_bytes, tenant, step, src, dst, chunk, op,
                      count, engine=ENGINE, meta={"engine": ENGINE})
