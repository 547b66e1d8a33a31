"""The MILP engine: any set of demands as copy problems, solved optimally or in rounds.

Non-combining collectives are solved directly (AllGather, Broadcast; Gather, Scatter and
AllToAll too, though the LP scales better for those). Combining ones are solved as their
non-combining inverse on reversed links and inverted in time, as the greedy engine does:
ReduceScatter from AllGather, Reduce from Broadcast; AllReduce is that ReduceScatter followed
by an AllGather. The pruned copy tree becomes a reduction tree in which every rank's
contribution arrives exactly once. Each candidate (switch unwinding degree x epoch length)
is solved within the time limit and the fastest schedule is kept; the result is compacted by
replaying it as soon as possible and checked by the independent verifier.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from choreo.bounds import lower_bound
from choreo.collectives import Collective, Demand
from choreo.errors import InfeasibleError, InputError
from choreo.schedule import Op, Schedule
from choreo.simulate import simulate
from choreo.synth import check_demands
from choreo.teccl.epochs import epoch_candidates, epochs_for, make_grid
from choreo.teccl.milp import Spread
from choreo.teccl.network import Net, make_net, views
from choreo.teccl.plan import list_times, prune
from choreo.teccl.search import Budget, Plan, complete, rounds, window_size
from choreo.topology import Topology
from choreo.verify import check, verify

# Epochs of the fastest transfer that one transfer on a link may span for the link to be in
# the model: the grid's arrays grow with it.
MAX_SPREAD = 4096

@dataclass(frozen=True)
class MilpOptions:
    """``time_limit`` covers the whole synthesis; ``gap`` is HiGHS' relative MIP gap target.

    ``round_epochs`` forces A*-style rounds of that many epochs; otherwise rounds are used
    only when a complete window would need more than ``max_binaries`` binaries.
    ``pipelined_alpha`` plans under TE-CCL's cost model (see ``choreo.teccl.epochs``);
    ``polish=False`` keeps the first feasible plan at the best epoch count instead of
    re-solving it for the fewest transfers (silly flows are pruned either way).
    """

    time_limit: float = 30.0
    gap: float = 0.0
    threads: int = 1
    relay: bool = True
    degrees: tuple[int, ...] | None = None
    epoch_scales: tuple[float, ...] = (1.0,)
    round_epochs: int | None = None
    max_binaries: int = 40_000
    max_epochs: int = 256
    pipelined_alpha: bool = False
    polish: bool = True


@dataclass
class _Phase:
    """One copy problem: commodity ``i`` is chunk ``chunk[i]`` of tenant ``spread.tenant[i]``."""

    chunk: np.ndarray
    spread: Spread
    reverse: bool
    demands: list[Demand]


def _phases(topology: Topology, demands: tuple[Demand, ...]) -> list[_Phase]:
    n_nodes = topology.num_nodes
    rev: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    fwd: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    for t, d in enumerate(demands):
        ranks = np.asarray(d.ranks, dtype=np.int64)
        k = d.num_chunks
        chunks = np.arange(k)
        every = np.zeros((k, n_nodes), dtype=bool)
        every[:, ranks] = True
        if d.collective is Collective.ALLREDUCE:
            owner = _one_hot(k, n_nodes, ranks[chunks // d.chunks])
            rev.append((t, chunks, owner, every))
            fwd.append((t, chunks, owner, every))
        elif d.collective.combining:
            sd = d.single_destination
            assert sd is not None
            rev.append((t, chunks, _one_hot(k, n_nodes, ranks[sd]), every))
        else:
            so, sd = d.single_origin, d.single_destination
            assert so is not None
            want = every if sd is None else _one_hot(k, n_nodes, ranks[sd])
            fwd.append((t, chunks, _one_hot(k, n_nodes, ranks[so]), want))
    out = []
    for parts, reverse in ((rev, True), (fwd, False)):
        if parts:
            tenant = np.concatenate([np.full(len(p[1]), p[0]) for p in parts])
            out.append(_Phase(np.concatenate([p[1] for p in parts]),
                              Spread(tenant, np.vstack([p[2] for p in parts]),
                                     np.vstack([p[3] for p in parts])),
                              reverse, [demands[p[0]] for p in parts]))
    return out


def _one_hot(k: int, n: int, nodes: np.ndarray) -> np.ndarray:
    out = np.zeros((k, n), dtype=bool)
    out[np.arange(k), nodes] = True
    return out


def synthesize_milp(fabric: Topology, demands: Sequence[Demand],
                    options: MilpOptions | None = None) -> Schedule:
    """The fastest verified MILP schedule over the candidate views and epoch lengths."""
    opts = options or MilpOptions()
    demands = tuple(demands)
    check_demands(fabric, demands, opts.relay)
    started = time.monotonic()
    deadline = started + opts.time_limit
    cands = views(fabric, demands, opts.relay, opts.degrees)
    best: Schedule | None = None
    errors: list[str] = []
    too_large: InputError | None = None
    jobs = [(v, s) for v in cands for s in opts.epoch_scales]
    for i, (view, scale) in enumerate(jobs):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        share = left / (len(jobs) - i)  # an even split of what is left
        try:
            sched = _solve_view(fabric, view, demands, scale, opts,
                                Budget(time.monotonic() + 0.9 * share, opts.gap, opts.threads))
        except InfeasibleError as err:
            errors.append(f"{view.name} x{scale}: {err}")
            continue
        except InputError as err:  # too large on this view; a sparser one may fit
            too_large = too_large or err
            continue
        if best is None or sched.makespan < best.makespan:
            best = sched
    if best is None and too_large is not None:
        raise too_large
    if best is None:
        raise InfeasibleError("MILP found no schedule: " + "; ".join(errors[:3]))
    best.meta["synthesis_seconds"] = time.monotonic() - started
    return best


def _solve_view(fabric: Topology, view: Topology, demands: tuple[Demand, ...], scale: float,
                opts: MilpOptions, budget: Budget) -> Schedule:
    parts: list[Schedule] = []
    infos: list[dict[str, object]] = []
    offset = 0.0
    for phase in _phases(view, demands):
        net = make_net(view, demands)
        if not net.num_links:
            raise InfeasibleError("no usable link")
        if phase.reverse:
            net = net.reversed()
        tau = epoch_candidates(net, (scale,), opts.pipelined_alpha)[0]
        net = _within_spread(net, tau)
        grid = make_grid(net, tau, net.alpha, opts.pipelined_alpha)
        lower = 0
        if not opts.pipelined_alpha:
            for d in phase.demands:
                lower = max(lower, epochs_for(lower_bound(fabric, d).value_s * (1 - 1e-9), tau))
        # Past max_epochs the complete search cannot end: rounds, without sizing a window
        # of the bound's epochs first.
        use_rounds = opts.round_epochs is not None or lower > opts.max_epochs
        if not use_rounds:
            from choreo.teccl.network import hop_epochs

            dist = hop_epochs(net, grid.delay.min(axis=0))
            guess = max(lower, 1) + 2
            use_rounds = window_size(net, grid, phase.spread, guess, dist) > opts.max_binaries
        if use_rounds:
            plan = rounds(net, grid, phase.spread, opts.round_epochs or 2 * grid.max_delay,
                          budget)
        else:
            plan = complete(net, grid, phase.spread, lower, budget, opts.max_epochs, opts.polish)
        part = _to_schedule(fabric, view, demands, net, grid, phase, plan)
        if phase.reverse:
            span = part.makespan
            part.start, part.end = span - part.end, span - part.start
        part.start, part.end = part.start + offset, part.end + offset
        offset = part.makespan
        parts.append(part)
        info = dict(plan.info)
        info.update({"tau": tau, "reverse": phase.reverse, "model_time": plan.epochs * tau})
        infos.append(info)
    sched = Schedule.concat(parts, engine="milp").sorted()
    sched = _compact(sched)
    sched.meta.update({"view": view.name, "epoch_scale": scale, "phases": infos,
                       "pipelined_alpha": opts.pipelined_alpha})
    return sched


def _within_spread(net: Net, tau: float) -> Net:
    """The links on which one chunk spans at most ``MAX_SPREAD`` epochs of ``tau``: a slower
    one would stretch the grid past memory (a 1 B/s link beside 1e18 B/s ones asked for
    1.5 EiB) for a link that carries next to nothing; greedy still weighs it."""
    keep = net.time.max(axis=0) <= MAX_SPREAD * tau
    if keep.all():
        return net
    if not keep.any():
        raise InfeasibleError("no link within the epoch model's spread")
    return replace(net, link=net.link[keep], src=net.src[keep], dst=net.dst[keep],
                   alpha=net.alpha[keep], time=net.time[:, keep])


def _to_schedule(fabric: Topology, view: Topology, demands: tuple[Demand, ...], net: Net,
                 grid: object, phase: _Phase, plan: Plan) -> Schedule:
    from choreo.teccl.epochs import Grid

    assert isinstance(grid, Grid)
    keep = prune(net, grid, phase.spread, plan.c, plan.e, plan.k)
    c, e, k = plan.c[keep], plan.e[keep], plan.k[keep]
    start, end = list_times(net, phase.spread, c, e, k)
    src, dst = net.src[e], net.dst[e]
    if phase.reverse:  # the transfers run the other way once inverted in time
        src, dst = dst, src
    op = Op.REDUCE if phase.reverse else Op.COPY
    return Schedule(fabric, view, demands, tenant=phase.spread.tenant[c], chunk=phase.chunk[c],
                    src=src, dst=dst, link=net.link[e], start=start, end=end,
                    op=np.full(len(c), int(op), dtype=np.int8), engine="milp")


def _compact(sched: Schedule) -> Schedule:
    """Replay as soon as possible (the simulator keeps each link's order); keep the plan if
    the replay is not both valid and no slower."""
    check(sched)
    sim = simulate(sched)
    fast = sim.retimed(sched)
    if sim.makespan <= sched.makespan * (1 + 1e-12) and verify(fast).ok:
        return fast.sorted()
    return sched


def time_of(sched: Schedule) -> float:
    """Simulated time of a schedule, the measure every engine is compared by."""
    return float(simulate(sched).makespan)


__all__ = ["MilpOptions", "synthesize_milp", "time_of"]
