"""``engine=auto``: run several engines and keep the best verified schedule by simulated time.

The greedy engine runs first with the caller's settings (the result auto can never be worse
than), then with other seeds and a search over chunk counts while the deadline allows; each
greedy run already tries several switch-unwinding degrees. ``accept`` keeps a candidate the
caller cannot use (one too large for MSCCL) from winning. Where the instance is small enough
to solve in the time left, the exact engines join: the LP for copy-free collectives
(AllToAll, Scatter, Gather), the MILP for the rest. Last, the fastest so far with its
first and last transfers cut into pieces (``choreo.pieces``). Every candidate is verified and
simulated; the winner records in ``meta["portfolio"]`` which engine won, every candidate's
time and the gap to the lower bound.

Deadline: a candidate starts only if its expected duration (measured on the first greedy
run, or the solver's own time limit, which the exact engines honor) fits in what is left.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from choreo.bounds import lower_bound
from choreo.collectives import Demand
from choreo.errors import ChoreoError, InputError
from choreo.pieces import MIN_GAIN, best_cut
from choreo.schedule import Schedule
from choreo.simulate import simulate
from choreo.synth import SynthOptions, check_demands, synthesize
from choreo.topology import Topology
from choreo.verify import verify

ENGINES = ("greedy", "milp", "lp", "auto")
SAFETY = 0.7  # share of the time left an exact solver may use (model build, checks)
MILP_BINARIES = 20_000  # above this a complete MILP rarely closes within seconds
LP_VARIABLES = 400_000
MAX_SEARCH_CHUNKS = 64  # chunks per piece the chunk search goes up to


@dataclass(frozen=True)
class PortfolioOptions:
    """Greedy knobs shared by every greedy candidate, and the exact solvers' threads."""

    restarts: int = 4
    seed: int = 0
    relay: bool = True
    rail_gather: bool = True  # as SynthOptions: off where transfers must move one chunk
    threads: int = 1
    seeds: int = 3
    # Whether a candidate other than the first may win: a caller that lowers the winner to
    # MSCCL passes a check that it lowers (more chunks are more steps for the runtime).
    accept: Callable[[Schedule], str] | None = None  # "" where it may, else why not


@dataclass
class _Candidate:
    engine: str
    variant: str
    schedule: Schedule | None = None
    time: float = float("inf")
    started: float = 0.0  # seconds after solve() began
    seconds: float = 0.0
    budget: float | None = None  # an exact solver's own time limit
    error: str = ""

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": self.engine, "variant": self.variant,
                               "started_s": round(self.started, 4),
                               "seconds": round(self.seconds, 4)}
        if self.budget is not None:
            out["budget_s"] = round(self.budget, 4)
        if self.schedule is not None:
            out["time"] = self.time
        else:
            out["error"] = self.error
        return out


def solve(fabric: Topology, demands: Sequence[Demand], engine: str = "auto",
          deadline_s: float = 10.0, options: PortfolioOptions | None = None) -> Schedule:
    """Synthesize with ``engine`` (greedy, milp, lp or auto) within ``deadline_s`` seconds."""
    if engine not in ENGINES:
        raise InputError(f"engine: unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    if not deadline_s > 0:
        raise InputError(f"deadline: must be positive, got {deadline_s}")
    opts = options or PortfolioOptions()
    demands = tuple(demands)
    check_demands(fabric, demands, opts.relay)  # once, not once per candidate that fails it
    started = time.monotonic()
    end = started + deadline_s
    runs: list[_Candidate] = []

    def run(engine_name: str, variant: str, fn: Callable[[], Schedule],
            budget: float | None = None) -> _Candidate:
        t0 = time.monotonic()
        cand = _Candidate(engine_name, variant, started=t0 - started, budget=budget)
        try:
            sched = fn()
            verdict = verify(sched)
            if not verdict.ok:
                raise ChoreoError(f"failed verification: {verdict.summary()}")
            refused = opts.accept(sched) if opts.accept is not None and runs else ""
            if refused:
                raise ChoreoError(f"not accepted: {refused}")
            cand.schedule, cand.time = sched, float(simulate(sched).makespan)
        except ChoreoError as err:
            if engine != "auto":
                raise
            cand.error = str(err).splitlines()[0]
        cand.seconds = time.monotonic() - t0
        runs.append(cand)
        return cand

    greedy_opts = SynthOptions(restarts=opts.restarts, seed=opts.seed, relay=opts.relay,
                               rail_gather=opts.rail_gather, accept=opts.accept)
    if engine in ("greedy", "auto"):
        first = run("greedy", "given", lambda: synthesize(fabric, demands, greedy_opts))
        if engine == "auto":
            _more_greedy(fabric, demands, opts, greedy_opts, first, end, run)
    if engine in ("milp", "lp") or (engine == "auto" and end - time.monotonic() > 0.2):
        _exact(fabric, demands, engine, opts, end, run)
    if engine == "auto":
        _cut_fastest(runs, end, run)
    best = min((c for c in runs if c.schedule is not None), key=lambda c: c.time, default=None)
    if best is None or best.schedule is None:
        errors = "; ".join(f"{c.engine}/{c.variant}: {c.error}" for c in runs)
        raise ChoreoError(f"no engine produced a verified schedule ({errors})")
    sched = best.schedule
    bound = lower_bound(fabric, demands[0], demands[1:]).value_s
    sched.meta["portfolio"] = {
        "engine": engine, "winner": best.engine, "variant": best.variant, "time": best.time,
        "lower_bound": bound, "gap_to_bound": best.time / bound - 1 if bound > 0 else None,
        "candidates": [c.record() for c in runs], "deadline_s": deadline_s,
        "seconds": time.monotonic() - started,
    }
    return sched


def _more_greedy(fabric: Topology, demands: tuple[Demand, ...], opts: PortfolioOptions,
                 base: SynthOptions, first: _Candidate, end: float,
                 run: Callable[..., _Candidate]) -> None:
    """Other seeds, then other chunk counts, each only if one more greedy run still fits.

    Chunks trade pipelining against per-step latency, and where the balance lies depends on
    the fabric's depth and alphas more than a rule of thumb knows (``auto_chunks``): the
    search doubles the chunks while that makes the schedule faster, halves them where
    doubling did not help, then tries halfway to each neighbour of the best (every
    candidate is kept in ``run``'s record, and the fastest wins)."""
    took = first.seconds
    for s in range(1, opts.seeds):
        if time.monotonic() + took * 1.5 > end:
            break
        so = replace(base, seed=base.seed + s)
        run("greedy", f"seed {so.seed}", lambda so=so: synthesize(fabric, demands, so))

    tried = {demands}

    def greedy(factor: float, at: tuple[Demand, ...]) -> tuple[tuple[Demand, ...], float]:
        """The run with ``at``'s chunks times ``factor``, and its time (inf: none)."""
        scaled = tuple(replace(d, chunks=min(max(1, round(d.chunks * factor)),
                                             MAX_SEARCH_CHUNKS)) for d in at)
        grows = max(d2.chunks / d.chunks for d, d2 in zip(demands, scaled, strict=True))
        # a run with more chunks takes longer, roughly in proportion
        if scaled in tried or time.monotonic() + took * max(grows, 1.0) * 1.5 > end:
            return scaled, float("inf")
        tried.add(scaled)
        label = "chunks " + ",".join(str(d.chunks) for d in scaled)
        return scaled, run("greedy", label, lambda: synthesize(fabric, scaled, base)).time

    best, at = first.time, demands
    for factor in (2.0, 0.5):
        while True:
            scaled, took_s = greedy(factor, at)
            if took_s >= best * (1 - MIN_GAIN):
                break
            best, at = took_s, scaled
        if at != demands:
            break  # more chunks helped: fewer would not
    for factor in (1.5, 0.75):
        greedy(factor, at)


def _cut_fastest(runs: list[_Candidate], end: float, run: Callable[..., _Candidate]) -> None:
    """The fastest candidate with its first and last transfers cut into pieces, where that
    is faster (``choreo.pieces``): a candidate of its own, verified and accepted like any."""
    fastest = min((c for c in runs if c.schedule is not None), key=lambda c: c.time,
                  default=None)
    if fastest is None or fastest.schedule is None:
        return
    found = best_cut(fastest.schedule, end, fastest.time)
    if found is not None:
        cut, how = found
        run(fastest.engine, f"{fastest.variant}, {how.label()}", lambda: cut)


def _exact(fabric: Topology, demands: tuple[Demand, ...], engine: str,
           opts: PortfolioOptions, end: float,
           run: Callable[..., _Candidate]) -> None:
    from choreo.teccl.copy import MilpOptions, synthesize_milp
    from choreo.teccl.flow import FLOW_COLLECTIVES, LpOptions, synthesize_lp

    flow_only = all(d.collective in FLOW_COLLECTIVES for d in demands)
    use = engine if engine in ("milp", "lp") else ("lp" if flow_only else "milp")
    limit = (end - time.monotonic()) * (1.0 if engine != "auto" else SAFETY)
    if limit <= 0:
        return
    if engine == "auto" and not _small_enough(fabric, demands, use):
        return
    if use == "lp":
        lp = LpOptions(time_limit=limit, threads=opts.threads, relay=opts.relay)
        run("lp", "flow", lambda: synthesize_lp(fabric, demands, lp), limit)
    else:
        mo = MilpOptions(time_limit=limit, threads=opts.threads, relay=opts.relay,
                         gap=0.0 if engine == "milp" else 0.05)
        run("milp", "copy", lambda: synthesize_milp(fabric, demands, mo), limit)


def _small_enough(fabric: Topology, demands: tuple[Demand, ...], use: str) -> bool:
    """A size estimate (commodities x links x ~10 epochs) against what solves in seconds."""
    links = len(fabric.usable_links())
    npus = len({r for d in demands for r in d.ranks})
    if fabric.switches:
        links += npus * npus  # the unwound mesh
    if use == "lp":
        return npus * links * 10 <= LP_VARIABLES
    chunks = sum(d.num_chunks for d in demands)
    return chunks * links * 10 <= MILP_BINARIES * 10 and chunks <= 64
