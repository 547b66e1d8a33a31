"""NCCL's ring channels as a real choreo ``Schedule``: a cross-check of the analytic model.

The model (``loads``) adds up bytes per link instead of simulating chunks, which is what
makes 1024 GPUs cheap. On small fabrics the same rings can be written out as transfers,
routed like every baseline (``choreo.routing.timed_plan``), timed by the congestion
simulator and checked by the verifier; the simulated time must then agree with the model's
bandwidth term. Each channel's share of every rank's buffer is one chunk.
"""

from __future__ import annotations

import numpy as np

from choreo.collectives import Collective, Demand
from choreo.errors import InputError
from choreo.nccl.channels import build, search
from choreo.nccl.fabric import describe
from choreo.routing import timed_plan
from choreo.schedule import Op, Schedule
from choreo.topology import Topology

MAX_RANKS = 32


def ring_schedule(fabric: Topology, demand: Demand) -> Schedule:
    """NCCL's ring AllReduce / AllGather / ReduceScatter on all its channels, simulated.

    ``demand.chunks`` is replaced by the channel count (chunk ``piece * C + channel``)."""
    if demand.collective not in (Collective.ALLREDUCE, Collective.ALLGATHER,
                                 Collective.REDUCESCATTER):
        raise InputError(f"collective: the ring cross-check covers allreduce, allgather and "
                         f"reducescatter, not {demand.collective.value}")
    if demand.n > MAX_RANKS:
        raise InputError(f"ranks: the cross-check simulates every chunk, so at most "
                         f"{MAX_RANKS} ranks, got {demand.n}")
    fab = describe(fabric, demand.ranks)
    ch = build(fab, search(fab))
    n_ch = ch.n_channels
    d = Demand(demand.collective, demand.ranks, demand.size, n_ch, demand.root, demand.weight,
               demand.name)
    pos = {g: i for i, g in enumerate(d.ranks)}
    n = d.n
    cols: list[list[int]] = [[], [], [], [], []]
    i = np.arange(n)
    for c, order in enumerate(ch.rings):
        o = np.array([pos[g] for g in order])  # rank index at each ring position
        nxt = np.roll(o, -1)
        phases = []
        if d.collective is not Collective.ALLGATHER:
            phases.append((0, 1, Op.REDUCE))
        if d.collective is not Collective.REDUCESCATTER:
            phases.append((n - 1 if d.collective is Collective.ALLREDUCE else 0, 0, Op.COPY))
        for base, shift, kind in phases:
            for s in range(n - 1):
                piece = o[(i - s - shift) % n]
                for col, val in zip(cols, (np.full(n, base + s), o, nxt, piece * n_ch + c,
                                           np.full(n, int(kind))), strict=True):
                    col.extend(val.tolist())
    step, src, dst, chunk, ops = (np.asarray(x, dtype=np.int64) for x in cols)
    ranks = np.asarray(d.ranks, dtype=np.int64)
    return timed_plan(fabric, fabric, (d,), d.chunk_bytes, np.zeros(len(step)), step,
                      ranks[src], ranks[dst], chunk, ops.astype(np.int8), engine="nccl-ring",
                      meta={"baseline": "nccl-ring", "channels": n_ch})
