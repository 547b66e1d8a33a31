"""Fixed collective algorithms to compare synthesized schedules against.

Each algorithm is written as rank-to-rank sends grouped in steps (the algorithm's own round
structure). The sends are routed on the fabric (``choreo.routing``), given the step index as
their planned time, and run through the congestion simulator; the returned schedule carries
the simulated times, so it is exactly what the algorithm achieves on this fabric and it passes
the verifier like any other schedule.

* ``ring``: rank order as the ring; pipelined chains for rooted collectives.
* ``direct``: every rank sends straight to every peer that needs its data.
* ``rhd``: recursive halving (reduce-scatter) and doubling (all-gather); a non-power-of-two
  count folds the extra ranks ``p..n-1`` into ranks ``0..n-p-1`` first and back last.
* ``dbt``: NCCL's double binary tree, half the chunks on each tree, pipelined per chunk.
* ``hierarchical``: ring phases along each dimension of ``topology.dims`` (or hosts from node
  names ``host/...``): reduce-scatter fastest dimension first, all-gather in reverse.

A report needs only a baseline's time (``baseline_makespan``): the same plan, routes and
simulation, but routed and timed as columns (paths per rank pair, the compiled simulator
pass), so a thousand-rank fabric's million circuits never become ``Link`` objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from choreo.bounds import min_transfers_bytes
from choreo.collectives import Collective, Demand
from choreo.errors import ChoreoError, InputError
from choreo.resources import circuit_lanes
from choreo.routing import Router, timed_plan
from choreo.schedule import Op, Schedule
from choreo.simulate import replay_exclusive, simulate
from choreo.topology import Topology

C = Collective
ALL = tuple(Collective)
SUPPORT: dict[str, tuple[Collective, ...]] = {
    "ring": ALL,
    "direct": ALL,
    "rhd": (C.ALLGATHER, C.REDUCESCATTER, C.ALLREDUCE),
    "dbt": (C.ALLREDUCE, C.BROADCAST, C.REDUCE),
    "hierarchical": (C.ALLGATHER, C.REDUCESCATTER, C.ALLREDUCE),
}
BASELINES = tuple(SUPPORT)


# Sends a baseline is timed with at most: each costs about 150 bytes on the way (its columns,
# its route and its replay), so this keeps a baseline within about 3 GiB. A textbook ring
# AllGather on 16,384 GPUs would take 268 M sends and grew past 15 GiB.
MAX_SENDS = 20_000_000


class BaselineUnavailable(ChoreoError):
    """The algorithm does not apply to this collective or fabric; the message says why."""


def baselines_for(demand: Demand, fabric: Topology | None = None) -> list[str]:
    """Baselines defined for the demand's collective (and, given a fabric, usable on it)."""
    return [
        name for name in BASELINES
        if demand.collective in SUPPORT[name]
        and (fabric is None or unavailable_reason(name, fabric, demand) is None)
    ]


def unavailable_reason(name: str, fabric: Topology, demand: Demand) -> str | None:
    """Why ``name`` cannot run here, or None."""
    if name not in SUPPORT:
        return f"unknown baseline {name!r} (known: {', '.join(BASELINES)})"
    if demand.collective not in SUPPORT[name]:
        return f"{name} is not defined for {demand.collective.value}"
    if name == "hierarchical":
        grid = _grid(fabric, demand)
        if isinstance(grid, str):
            return grid
    return None


def run_baseline(name: str, fabric: Topology, demand: Demand) -> Schedule:
    """The baseline's schedule on ``fabric``, timed by the simulator."""
    return _schedule(name, fabric, demand, _plan(name, fabric, demand))


def baseline_makespan(
    name: str, fabric: Topology, demand: Demand, paths: BaselinePaths | None = None
) -> float:
    """The time the baseline takes on ``fabric``: ``simulate(run_baseline(...)).makespan``,
    computed without building the schedule's routed topology. Sends are grouped by rank
    pair; each pair's route is the one ``choreo.routing.route`` takes (the same ``Router``),
    held as a circuit (a single link is a circuit of one; on a link with lanes, its lane),
    and the plan runs
    through the simulator's own pass. ``paths`` shares the routes between the baselines
    of one demand."""
    plan = _plan(name, fabric, demand)
    if any(lk.via for lk in fabric.links):  # links that ride on others: the general path
        return simulate(_schedule(name, fabric, demand, plan)).makespan
    step, src_r, dst_r, chunk, op = plan.columns()
    if not len(step):
        return 0.0
    if paths is None or not paths.serves(fabric, demand):
        paths = BaselinePaths(fabric, demand)
    ranks = np.asarray(demand.ranks, dtype=np.int64)
    src, dst = ranks[src_r], ranks[dst_r]
    del src_r, dst_r
    nodes = fabric.num_nodes
    pairs, row = np.unique(src * nodes + dst, return_inverse=True)
    ptr, links, alpha, bandwidth = paths.circuits(pairs // nodes, pairs % nodes)
    duration = alpha[row] + demand.chunk_bytes / bandwidth[row]
    nf = len(fabric.links)
    lane, width = circuit_lanes(ptr, links, np.ones(len(pairs), dtype=bool), bandwidth,
                                pairs // nodes, pairs % nodes, fabric)
    _, end = replay_exclusive(demand, step, src, dst, chunk, duration, row, ptr,
                              links + nf * lane, nf * int(width.max(initial=1)),
                              op == Op.REDUCE)
    return float(end.max())


class BaselinePaths:
    """Routes between a demand's ranks on a fabric, exactly as ``choreo.routing.route``
    chooses them for the demand's chunk size: one shortest-path search per source rank, run
    when first needed and kept, so every baseline of the demand shares them."""

    def __init__(self, fabric: Topology, demand: Demand) -> None:
        self.fabric = fabric
        self.nbytes = demand.chunk_bytes
        self.targets = set(demand.ranks)
        self.router = Router(fabric, self.nbytes)
        links = fabric.links
        self.link_src = np.array([lk.src for lk in links], dtype=np.int64)
        self.alpha = np.array([lk.alpha for lk in links], dtype=np.float64)
        self.bandwidth = np.array([lk.bandwidth for lk in links], dtype=np.float64)
        self._pred: dict[int, np.ndarray] = {}

    def serves(self, fabric: Topology, demand: Demand) -> bool:
        return (fabric is self.fabric and demand.chunk_bytes == self.nbytes
                and self.targets.issuperset(demand.ranks))

    def pred(self, source: int) -> np.ndarray:
        """Per node, the link it is reached by from ``source`` (-1: none). A search settles
        nodes in the same order however many targets it has, and a settled node's link is
        final, so one search to every rank serves every route from ``source``."""
        got = self._pred.get(source)
        if got is None:
            pred, _ = self.router.search(source, self.targets)
            got = self._pred[source] = np.asarray(pred, dtype=np.int32)
        return got

    def circuits(
        self, src: np.ndarray, dst: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For NPU pairs (``src`` != ``dst``): the fabric links of each path as CSR
        (``ptr``, ``links``, first hop first), and each path's alpha (summed hop by hop, as
        ``route`` sums it) and bandwidth (its slowest hop)."""
        sources, sidx = np.unique(src, return_inverse=True)
        pred = np.stack([self.pred(int(v)) for v in sources])
        m = len(src)

        def walk(visit: Callable[[np.ndarray, np.ndarray], None]) -> None:
            """Follow every path back from its destination, one hop per round for all."""
            cur = dst.astype(np.int64)
            act = np.arange(m)
            for _ in range(self.fabric.num_nodes):
                if not len(act):
                    return
                lk = pred[sidx[act], cur[act]]
                if (lk < 0).any():
                    bad = int(act[np.argmax(lk < 0)])
                    raise InputError(
                        f"{self.fabric.name}: no usable path from "
                        f"{self.fabric.node_name(int(src[bad]))} to "
                        f"{self.fabric.node_name(int(dst[bad]))}"
                    )
                visit(act, lk)
                cur[act] = self.link_src[lk]
                act = act[cur[act] != src[act]]
            raise InputError(f"{self.fabric.name}: routes do not end")  # a corrupt search

        length = np.zeros(m, dtype=np.int64)

        def count(act: np.ndarray, _lk: np.ndarray) -> None:
            length[act] += 1

        walk(count)
        ptr = np.zeros(m + 1, dtype=np.int64)
        ptr[1:] = np.cumsum(length)
        links = np.empty(int(ptr[-1]), dtype=np.int64)
        pos = ptr[1:] - 1

        def place(act: np.ndarray, lk: np.ndarray) -> None:
            links[pos[act]] = lk
            pos[act] -= 1

        walk(place)
        alpha = np.zeros(m)
        for hop in range(int(length.max()) if m else 0):
            on = np.nonzero(length > hop)[0]
            alpha[on] += self.alpha[links[ptr[on] + hop]]
        bandwidth = (np.minimum.reduceat(self.bandwidth[links], ptr[:-1]) if m
                     else np.zeros(0))
        return ptr, links, alpha, bandwidth


def _plan(name: str, fabric: Topology, demand: Demand) -> _Plan:
    """The baseline's sends in rank space, after checking it applies."""
    reason = unavailable_reason(name, fabric, demand)
    if reason:
        raise BaselineUnavailable(f"baseline {name}: {reason}")
    sends = round(min_transfers_bytes(demand) / demand.chunk_bytes) if demand.size else 0
    if sends > MAX_SENDS:
        raise BaselineUnavailable(
            f"baseline {name}: every chunk landing on every rank that needs it takes "
            f"{sends:,} sends, above the {MAX_SENDS:,} the baselines are timed for")
    fabric.check_connected(list(demand.ranks), where=f"baseline {name}")
    plan = _Plan(demand)
    if name == "ring":
        _ring(plan)
    elif name == "direct":
        _direct(plan)
    elif name == "rhd":
        _rhd(plan)
    elif name == "dbt":
        _dbt(plan)
    else:
        grid = _grid(fabric, demand)
        assert not isinstance(grid, str)
        _hierarchical(plan, grid)
    return plan


# ---- sends in rank space -------------------------------------------------------------------
class _Plan:
    """Rank-to-rank sends of chunks, each tagged with its algorithm step."""

    def __init__(self, demand: Demand) -> None:
        self.d = demand
        self.parts: list[tuple[np.ndarray, ...]] = []

    def send(self, step: object, src: object, dst: object, chunk: object, op: object) -> None:
        """Sends broadcast from the arguments, in row-major order; ``op`` an ``Op`` or one
        per send."""
        st, s, d, c, o = np.broadcast_arrays(
            np.asarray(step, dtype=np.int64), np.asarray(src, dtype=np.int64),
            np.asarray(dst, dtype=np.int64), np.asarray(chunk, dtype=np.int64),
            np.asarray(op, dtype=np.int8),
        )
        self.parts.append(tuple(np.ravel(x) for x in (st, s, d, c, o)))

    def pieces(self, step: object, src: object, dst: object, piece: object, op: Op) -> None:
        """Send whole rank pieces (``chunks`` consecutive chunks each)."""
        k = self.d.chunks
        st, s, d, p = np.broadcast_arrays(
            np.asarray(step, dtype=np.int64), np.asarray(src, dtype=np.int64),
            np.asarray(dst, dtype=np.int64), np.asarray(piece, dtype=np.int64),
        )
        sub = np.arange(k, dtype=np.int64)
        self.send(st[..., None], s[..., None], d[..., None], p[..., None] * k + sub, op)

    def columns(self) -> tuple[np.ndarray, ...]:
        if not self.parts:
            z = np.zeros(0, dtype=np.int64)
            return z, z, z, z, z.astype(np.int8)
        return tuple(np.concatenate(col) for col in zip(*self.parts, strict=True))


def _schedule(name: str, fabric: Topology, demand: Demand, plan: _Plan) -> Schedule:
    step, src_r, dst_r, chunk, op = plan.columns()
    ranks = np.asarray(demand.ranks, dtype=np.int64)
    return timed_plan(fabric, fabric, (demand,), demand.chunk_bytes, np.zeros(len(step)), step,
                      ranks[src_r], ranks[dst_r], chunk, op, engine=name,
                      meta={"baseline": name})


def _all_chunks(d: Demand) -> np.ndarray:
    return np.arange(d.num_chunks, dtype=np.int64)


# ---- ring ----------------------------------------------------------------------------------
def _ring(plan: _Plan) -> None:
    d = plan.d
    n, k, root = d.n, d.chunks, d.root
    r = np.arange(n)
    nxt = (r + 1) % n
    c = d.collective
    if c in (C.REDUCESCATTER, C.ALLREDUCE):
        for s in range(n - 1):
            plan.pieces(s, r, nxt, (r - s - 1) % n, Op.REDUCE)
    if c in (C.ALLGATHER, C.ALLREDUCE):
        base = n - 1 if c is C.ALLREDUCE else 0
        for s in range(n - 1):
            plan.pieces(base + s, r, nxt, (r - s) % n, Op.COPY)
    if c in (C.BROADCAST, C.REDUCE):
        h = np.arange(n - 1)
        first = 0 if c is C.BROADCAST else 1  # reduce: root+1 -> ... -> root
        op = Op.COPY if c is C.BROADCAST else Op.REDUCE
        for j in range(k):
            plan.send(h + j, (root + first + h) % n, (root + first + h + 1) % n, j, op)
    if c is C.GATHER:  # piece of relative rank i walks i -> i+1 -> ... -> n (= root)
        for i in range(1, n):
            hops = np.arange(i, n)
            plan.pieces(hops - i, (root + hops) % n, (root + hops + 1) % n, (root + i) % n,
                        Op.COPY)
    if c is C.SCATTER:  # farthest piece first, each walks 0 -> 1 -> ... -> i
        for i in range(1, n):
            hops = np.arange(i)
            plan.pieces(n - 1 - i + hops, (root + hops) % n, (root + hops + 1) % n,
                        (root + i) % n, Op.COPY)
    if c is C.ALLTOALL:  # chunk a->b takes (b - a) mod n hops along the ring
        for hop in range(1, n):
            a, dist = np.meshgrid(r, np.arange(hop, n), indexing="ij")
            b = (a + dist) % n
            at = (a + hop - 1) % n
            plan.send(hop - 1, at[..., None], ((at + 1) % n)[..., None],
                      ((a * n + b) * k)[..., None] + np.arange(k), Op.COPY)


# ---- direct --------------------------------------------------------------------------------
def _direct(plan: _Plan) -> None:
    d = plan.d
    n, k, root = d.n, d.chunks, d.root
    r = np.arange(n)
    c = d.collective
    for j in range(1, n):
        peer = (r + j) % n
        if c in (C.REDUCESCATTER, C.ALLREDUCE):
            plan.pieces(j - 1, r, peer, peer, Op.REDUCE)
        if c in (C.ALLGATHER, C.ALLREDUCE):
            plan.pieces(j - 1 + (n - 1 if c is C.ALLREDUCE else 0), r, peer, r, Op.COPY)
        other = (root + j) % n
        if c is C.BROADCAST:
            plan.send(j - 1, root, other, _all_chunks(d), Op.COPY)
        if c is C.REDUCE:
            plan.send(j - 1, other, root, _all_chunks(d), Op.REDUCE)
        if c is C.GATHER:
            plan.pieces(j - 1, other, root, other, Op.COPY)
        if c is C.SCATTER:
            plan.pieces(j - 1, root, other, other, Op.COPY)
        if c is C.ALLTOALL:
            plan.send(j - 1, r[:, None], peer[:, None],
                      ((r * n + peer) * k)[:, None] + np.arange(k), Op.COPY)


# ---- recursive halving / doubling ----------------------------------------------------------
def _rhd(plan: _Plan) -> None:
    d = plan.d
    n = d.n
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    c = d.collective
    levels = p.bit_length() - 1
    # what virtual rank v < p stands for: itself, then its folded extra rank p + v
    held = 1 + (np.arange(p) < extra)
    at = np.zeros(p + 1, dtype=np.int64)
    at[1:] = np.cumsum(held)
    owned = np.empty(n, dtype=np.int64)
    owned[at[:-1]] = np.arange(p)
    owned[at[:extra] + 1] = p + np.arange(extra)

    def blocks(step: int, dist: int, lead: np.ndarray, op: Op) -> None:
        """Every rank i < p sends its partner i ^ dist the pieces of the ``dist`` virtual
        ranks from ``lead[i]`` on, in order."""
        i = np.arange(p)
        lo, hi = at[lead], at[lead + dist]
        size = hi - lo
        first = np.repeat(np.cumsum(size) - size, size)
        pieces = owned[np.repeat(lo, size) + np.arange(int(size.sum())) - first]
        plan.pieces(step, np.repeat(i, size), np.repeat(i ^ dist, size), pieces, op)

    step = 0
    ext = np.arange(extra)
    if extra:  # fold: extra rank p+i hands its data to rank i
        if c is C.ALLGATHER:
            plan.pieces(step, p + ext, ext, p + ext, Op.COPY)
        else:
            plan.send(step, (p + ext)[:, None], ext[:, None], _all_chunks(d)[None, :], Op.REDUCE)
        step += 1
    if c in (C.REDUCESCATTER, C.ALLREDUCE):
        for lvl in reversed(range(levels)):
            dist = 1 << lvl
            blocks(step, dist, (np.arange(p) ^ dist) & ~(dist - 1), Op.REDUCE)
            step += 1
    if c in (C.ALLGATHER, C.ALLREDUCE):
        for lvl in range(levels):
            dist = 1 << lvl
            blocks(step, dist, np.arange(p) & ~(dist - 1), Op.COPY)
            step += 1
    if extra:  # unfold: rank i returns what rank p+i must end with
        if c is C.REDUCESCATTER:
            plan.pieces(step, ext, p + ext, p + ext, Op.COPY)
        elif c is C.ALLGATHER:  # every piece but p+i's own, in order
            x = np.arange(n - 1)[None, :]
            plan.pieces(step, ext[:, None], (p + ext)[:, None], x + (x >= (p + ext)[:, None]),
                        Op.COPY)
        else:
            plan.pieces(step, ext[:, None], (p + ext)[:, None], np.arange(n)[None, :], Op.COPY)


# ---- double binary tree --------------------------------------------------------------------
def btree_parents(n: int) -> list[int]:
    """NCCL's binary tree over ranks 0..n-1 (``ncclGetBtree``): parent per rank, -1 at 0."""
    parent = [-1] * n
    for rank in range(1, n):
        bit = 1
        while bit < n and not bit & rank:
            bit <<= 1
        up = (rank ^ bit) | (bit << 1)
        if up >= n:
            up = rank ^ bit
        parent[rank] = up
    return parent


def dtree_parents(n: int) -> tuple[list[int], list[int]]:
    """NCCL's two complementary trees: the second is the first mirrored (even n) or shifted
    by one (odd n), so most leaves of one are inner nodes of the other."""
    t0 = btree_parents(n)
    if n % 2:
        t1 = [-1 if t0[(r - 1) % n] < 0 else (t0[(r - 1) % n] + 1) % n for r in range(n)]
    else:
        t1 = [-1 if t0[n - 1 - r] < 0 else n - 1 - t0[n - 1 - r] for r in range(n)]
    return t0, t1


def _shape(parent: Sequence[int]) -> tuple[int, list[int], list[int]]:
    """Root, height above the deepest leaf below, and depth of every node."""
    n = len(parent)
    root = parent.index(-1)
    children: list[list[int]] = [[] for _ in range(n)]
    for v, u in enumerate(parent):
        if u >= 0:
            children[u].append(v)
    depth = [0] * n
    order = [root]
    for v in order:
        for w in children[v]:
            depth[w] = depth[v] + 1
            order.append(w)
    height = [0] * n
    for v in reversed(order):
        for w in children[v]:
            height[v] = max(height[v], height[w] + 1)
    return root, height, depth


def _dbt(plan: _Plan) -> None:
    """Per chunk, in chunk order, the sends of its tree (even chunks on the first, odd on
    the second), ``chunk // 2`` steps after the previous chunk of that tree."""
    d = plan.d
    n, root = d.n, d.root
    c = d.collective
    shift = 0 if c is C.ALLREDUCE else root  # rooted collectives: tree 0 rooted at ``root``
    templates = []  # per tree: step offset, src, dst, op of one chunk's sends
    for par in dtree_parents(n):
        rel = [par[(v - shift) % n] for v in range(n)]  # parent in relative labels
        parent = [-1 if u < 0 else (u + shift) % n for u in rel]
        troot, height, depth = _shape(parent)
        up, h, dep = np.asarray(parent), np.asarray(height), np.asarray(depth)
        kids = np.nonzero(up >= 0)[0]
        top = height[troot]
        sends: list[tuple[object, object, object, Op]] = []
        if c in (C.ALLREDUCE, C.REDUCE):
            sends.append((h[kids], kids, up[kids], Op.REDUCE))
        if c is C.ALLREDUCE:
            sends.append((top + dep[kids] - 1, up[kids], kids, Op.COPY))
        if c is C.REDUCE and troot != root:
            sends.append((top, troot, root, Op.COPY))
        if c is C.BROADCAST:
            lead = 0
            if troot != root:
                sends.append((0, root, troot, Op.COPY))
                lead = 1
            down = kids[kids != root]
            sends.append((lead + dep[down] - 1, up[down], down, Op.COPY))
        cols = [np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (st, s, t, int(o))))
                for st, s, t, o in sends]
        templates.append([np.concatenate([np.ravel(col[k]) for col in cols]) for k in range(4)])
    size = np.array([len(t[0]) for t in templates], dtype=np.int64)
    chunk = np.arange(d.num_chunks, dtype=np.int64)
    per = size[chunk % 2]
    ch = np.repeat(chunk, per)
    row = np.repeat((chunk % 2) * size[0] - (np.cumsum(per) - per), per) + np.arange(len(ch))
    offset, src, dst, op = (np.concatenate([t[k] for t in templates]) for k in range(4))
    plan.send(offset[row] + ch // 2, src[row], dst[row], ch, op[row])


# ---- hierarchical --------------------------------------------------------------------------
def _grid(fabric: Topology, demand: Demand) -> np.ndarray | str:
    """Coordinates (n x dims) of the demand's ranks on a full grid, or why there is none."""
    ranks = list(demand.ranks)
    npus = fabric.all_npus
    if fabric.dims and int(np.prod(fabric.dims)) == len(npus):
        pos = {v: i for i, v in enumerate(npus)}
        idx = np.array([pos[v] for v in ranks], dtype=np.int64)
        cols = []
        for size in fabric.dims:
            cols.append(idx % size)
            idx = idx // size
        coords = np.stack(cols, axis=1)
        source = "dims"
    elif fabric.names and all("/" in fabric.names[v] for v in ranks):
        hosts: dict[str, list[int]] = {}
        for v in ranks:
            hosts.setdefault(fabric.names[v].split("/", 1)[0], []).append(v)
        local = {v: i for members in hosts.values() for i, v in enumerate(sorted(members))}
        host_of = {v: h for h, members in enumerate(hosts.values()) for v in members}
        coords = np.array([[local[v], host_of[v]] for v in ranks], dtype=np.int64)
        source = "host names"
    else:
        return f"fabric {fabric.name} has no dims and no host/ node names to form levels"
    sizes = []
    for k in range(coords.shape[1]):
        _, coords[:, k] = np.unique(coords[:, k], return_inverse=True)
        sizes.append(int(coords[:, k].max()) + 1)
    keep = [k for k, sz in enumerate(sizes) if sz > 1]
    coords = coords[:, keep]
    full = int(np.prod([sizes[k] for k in keep])) if keep else 1
    if not keep or full != len(ranks) or len({tuple(x) for x in coords.tolist()}) != len(ranks):
        return (
            f"the tenant's ranks do not fill a grid of the fabric's {source} "
            f"({len(ranks)} ranks)"
        )
    return coords


def _hierarchical(plan: _Plan, coords: np.ndarray) -> None:
    d = plan.d
    n, ndim = d.n, coords.shape[1]
    sizes = [int(coords[:, k].max()) + 1 for k in range(ndim)]
    flat = np.zeros(n, dtype=np.int64)  # rank of each coordinate tuple, dimension 0 fastest
    for k in reversed(range(ndim)):
        flat = flat * sizes[k] + coords[:, k]
    rank_at = np.empty(n, dtype=np.int64)
    rank_at[flat] = np.arange(n)
    strides = np.cumprod([1, *sizes[:-1]])

    def phase(k: int, step: int, reduce: bool) -> int:
        """Ring along dimension k over blocks: block b of a line holds the pieces whose
        owners agree with the line on dimensions < k and have coordinate b on k."""
        size = sizes[k]
        prefix = flat % strides[k]  # coordinates on dimensions < k
        key = prefix * size + coords[:, k]
        table = np.argsort(key, kind="stable").reshape(strides[k] * size, -1)
        nxt = rank_at[flat + (((coords[:, k] + 1) % size) - coords[:, k]) * strides[k]]
        i = coords[:, k]
        for s in range(size - 1):
            b = (i - s - 1) % size if reduce else (i - s) % size
            plan.pieces(step + s, np.arange(n)[:, None], nxt[:, None], table[prefix * size + b],
                        Op.REDUCE if reduce else Op.COPY)
        return step + size - 1

    step = 0
    c = d.collective
    if c in (C.REDUCESCATTER, C.ALLREDUCE):
        for k in range(ndim):
            step = phase(k, step, True)
    if c in (C.ALLGATHER, C.ALLREDUCE):
        for k in reversed(range(ndim)):
            step = phase(k, step, False)
