"""``python -m choreo_dev.gather_bench``: AllGather and ReduceScatter against the optimal bound.

ForestColl shows both are throughput-optimal on any topology in polynomial time, so the
bound (the cut and max-flow bounds of ``choreo.bounds``) is the bar: every built-in fabric
family, small and up to 1024 NPUs, at 1 GiB with relay off (as schedules ship), the target
within 3% of it. (On DGX-1 with one chunk per shard the bound is not reachable: SCCL proves
7/6 of it optimal; the bound is taken for the chunks a schedule has, which may be more.)
By default each row is what ``--engine auto`` ships: the portfolio, which also searches the
chunk count, within a deadline, keeping only what lowers to MSCCL.
"""

from __future__ import annotations

import argparse
import time

from choreo.benchtable import Row, finish
from choreo.bounds import lower_bound
from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.msccl.lower import lowerable
from choreo.portfolio import ENGINES, PortfolioOptions, solve
from choreo.simulate import simulate
from choreo.synth import auto_chunks
from choreo.verify import verify

GIB = 1 << 30
TARGET = 0.97  # of the bound: within 3%
DEADLINE = 10.0  # seconds per row for --engine auto
FABRICS = ("ring-16", "mesh-4x4", "torus-8x8", "torus-16x16", "torus-32x32", "hypercube-4x4x4",
           "hypercube-8x8x8", "switch-16", "switch2d-8x4", "switch2d-16x16", "3d-rfs-64",
           "3d-rfs-256", "dragonfly-4x5", "dragonfly-8x9", "dgx1", "dgx2-2", "dgx2-8", "ndv2-2",
           "dgx-h100-4", "dgx-h100-16", "dgx-h100-32", "dgx-h100-128", "dgx-a100-4",
           "dgx-a100-16", "mi250")


def row(spec: str, collective: Collective, engine: str = "auto",
        deadline: float = DEADLINE) -> Row:
    fabric = build(spec)
    n = len(fabric.npus)
    demand = Demand(collective, tuple(fabric.npus), GIB, auto_chunks(fabric, collective, GIB, n))
    started = time.perf_counter()
    # As files ship: relay off, and only what lowers to MSCCL may win a search.
    schedule = solve(fabric, [demand], engine, deadline, PortfolioOptions(
        relay=False, accept=lowerable))
    seconds = time.perf_counter() - started
    won = schedule.meta["portfolio"]
    how = won["winner"] if won["variant"] in ("given", "flow", "copy") else (
        f"{won['winner']}, {won['variant']}")
    verdict = verify(schedule)
    if not verdict.ok:
        raise AssertionError(f"{spec}: schedule fails verification: {verdict.summary()}")
    # against the chunks the schedule was planned with (engines may cut shards finer)
    bound = lower_bound(fabric, schedule.demands[0], whole_chunks=not schedule.ranged)
    share = bound.value_s / simulate(schedule).makespan
    return Row(f"{spec} ({n} NPUs) {collective.value}", f"{share:.2%} of the bound",
               f">= {TARGET:.0%}", f"{schedule.engine} ({how}), synthesized in {seconds:.2f} s",
               share >= TARGET, value=share)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m choreo_dev.gather_bench", description=__doc__)
    p.add_argument("--only", help="fabrics whose name contains this text")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="auto: the portfolio within --deadline (default); greedy: one run")
    p.add_argument("--deadline", type=float, default=DEADLINE,
                   help="seconds per row for the portfolio's candidates")
    args = p.parse_args(argv)
    rows = [row(spec, coll, args.engine, args.deadline) for spec in FABRICS
            if not args.only or args.only in spec
            for coll in (Collective.ALLGATHER, Collective.REDUCESCATTER)]
    return finish(rows, "AllGather / ReduceScatter at 1 GiB against the optimal bound", args.json)


if __name__ == "__main__":
    raise SystemExit(main())
