"""``python -m choreo.nccl.versus``: choreo's schedules against NCCL as it runs, side by side.

Per case, choreo synthesizes (relay off, as it ships to MSCCL), the simulator times the
schedule, and the NCCL model times NCCL's own choice on the same fabric. The table reports
where choreo is ahead and, as plainly, where it is not: there the product ships no file and
NCCL runs; so it is where choreo refuses a case (an AllToAll past the greedy engine's reach).
Degraded cases fail one GPU, one NIC or one NVSwitch port of node 1. Shared cases
synthesize several tenants jointly and time them against every tenant running NCCL at once
(``nccl_jointly``: each link carries all tenants' bytes): two tenants on the same nodes (GPUs
0-3 and 4-7 of every node, no link in common), and two or four tenants on
``dgx-h100-spine-2x4`` and ``-4x4`` with nodes in every block, whose traffic meets on the 2:1
spine. (On a torus, tenants' traffic can only meet by relaying through each other's GPUs,
which an MSCCL program cannot do: with relay off, as schedules ship, they share no link.)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

from choreo.benchtable import Row, finish
from choreo.collectives import Collective, Demand
from choreo.errors import InputError
from choreo.generators import build
from choreo.msccl.lower import lowerable
from choreo.nccl.model import nccl_jointly
from choreo.portfolio import PortfolioOptions, solve
from choreo.schedule import Schedule
from choreo.simulate import simulate
from choreo.synth import SynthOptions, auto_chunks, synthesize
from choreo.topology import Topology
from choreo.verify import verify

MIB = 1 << 20
SIZES = (16 * MIB, 256 * MIB, 1024 * MIB)
COLLECTIVES = (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCESCATTER,
               Collective.ALLTOALL)
Degrade = Callable[[Topology], Topology]
SHARED_TARGET = 1.20  # tenants meeting on shared links: slowest tenant against NCCL at once


def _link(fabric: Topology, gpu: int, kind: str) -> list[int]:
    """Both directions of ``gpu``'s link of ``kind`` (its NIC: ib; its NVSwitch port)."""
    return [i for i, lk in enumerate(fabric.links)
            if lk.kind == kind and gpu in (lk.src, lk.dst)
            and not (fabric.is_npu(lk.src) and fabric.is_npu(lk.dst))]


def failed_gpu(fabric: Topology) -> Topology:
    return fabric.with_health(frozenset({9}), ())


def failed_nic(fabric: Topology) -> Topology:
    return fabric.with_health(frozenset(), _link(fabric, 9, "ib"))


def failed_nvswitch_port(fabric: Topology) -> Topology:
    return fabric.with_health(frozenset(), _link(fabric, 9, "nvswitch"))


DEGRADED: dict[str, Degrade] = {"one failed GPU": failed_gpu, "one failed NIC": failed_nic,
                                "one failed NVSwitch port": failed_nvswitch_port}


@dataclass(frozen=True)
class Engine:
    """How choreo synthesizes each case: greedy alone (the product's default), or the
    portfolio (``auto``) within ``deadline`` seconds, keeping only what lowers to MSCCL."""

    name: str = "greedy"
    deadline: float = 30.0

    def synthesize(self, fabric: Topology, demands: list[Demand]) -> Schedule:
        if self.name == "greedy":
            return synthesize(fabric, demands, SynthOptions(restarts=2, relay=False))
        return solve(fabric, demands, self.name, self.deadline, PortfolioOptions(
            restarts=2, relay=False, accept=lowerable))


GREEDY = Engine()


def _case(fabric: Topology, groups: list[tuple[int, ...]], coll: Collective,
          size: int, engine: Engine = GREEDY,
          ) -> tuple[list[float], list[float], list[str], float]:
    """choreo's and NCCL's time per tenant, NCCL's choices, and the synthesis seconds."""
    demands = [Demand(coll, ranks, size, auto_chunks(fabric, coll, size, len(ranks)),
                      name=f"t{k}") for k, ranks in enumerate(groups)]
    started = time.perf_counter()
    sched = engine.synthesize(fabric, demands)
    seconds = time.perf_counter() - started
    verdict = verify(sched)
    if not verdict.ok:
        raise AssertionError(f"{fabric.name}: schedule fails verification: {verdict.errors[:2]}")
    ours = [float(t) for t in simulate(sched).tenant_time]
    nccl = nccl_jointly(fabric, demands)
    return ours, [r.seconds for r in nccl], [r.choice for r in nccl], seconds


def _compared(group: str, case: str, fabric: Topology, groups: list[tuple[int, ...]],
              coll: Collective, size: int, target: float | None = None,
              engine: Engine = GREEDY) -> Row:
    """The case's row; a case choreo refuses (too large for its engines) is a row where NCCL
    runs, with the refusal as its reason."""
    try:
        return _row(group, case, *_case(fabric, groups, coll, size, engine), target=target)
    except InputError as err:
        demands = [Demand(coll, ranks, size) for ranks in groups]
        choices = sorted({r.choice for r in nccl_jointly(fabric, demands)})
        return Row(case, "no schedule (NCCL runs)", "(info)" if target is None else
                   f">= {target:.2f}x", f"NCCL {'/'.join(choices)}; refused: {err}",
                   None if target is None else False, group=group)


def _row(group: str, case: str, ours: list[float], theirs: list[float], choices: list[str],
         seconds: float, target: float | None = None) -> Row:
    speedups = [t / o for o, t in zip(ours, theirs, strict=True)]
    worst = min(speedups)
    return Row(case, f"{worst:.2f}x" + (" (slowest tenant)" if len(ours) > 1 else ""),
               "(info)" if target is None else f">= {target:.2f}x",
               f"NCCL {'/'.join(sorted(set(choices)))}; synthesized in {seconds:.2f} s",
               None if target is None else worst >= target, group=group, value=worst)


def rows(nodes: tuple[int, ...], sizes: tuple[int, ...],
         degraded_skip: tuple[int, ...] = (), engine: Engine = GREEDY) -> list[Row]:
    out = []
    for k in nodes:
        fabric = build(f"dgx-h100-{k}")
        for coll in COLLECTIVES:
            for size in sizes:
                out.append(_compared("healthy", f"dgx-h100-{k} {coll.value} {size // MIB} MiB",
                                     fabric, [tuple(fabric.npus)], coll, size, engine=engine))
    for k in (n for n in nodes if n >= 2 and n not in degraded_skip):
        base = build(f"dgx-h100-{k}")
        for what, degrade in DEGRADED.items():
            fabric = degrade(base)
            for coll in COLLECTIVES:
                for size in sizes:
                    out.append(_compared(
                        "degraded", f"dgx-h100-{k} {what}, {coll.value} {size // MIB} MiB",
                        fabric, [tuple(fabric.npus)], coll, size, engine=engine))
        halves = [tuple(g for g in base.npus if (g % 8 < 4) == first) for first in (True, False)]
        out.append(_compared("shared", f"dgx-h100-{k} two tenants (GPUs 0-3 / 4-7 of every "
                             "node), allreduce 1 GiB", base, halves, Collective.ALLREDUCE,
                             1 << 30, engine=engine))
    out += spine_rows(2, 4, engine) + spine_rows(4, 4, engine)
    return out


def spine_rows(blocks: int = 2, per_block: int = 4, engine: Engine = GREEDY) -> list[Row]:
    """Two and four tenants, each with the same number of nodes in every block of
    ``dgx-h100-spine-<blocks>x<per_block>``: all their traffic between blocks meets on the
    oversubscribed spine uplinks."""
    fabric = build(f"dgx-h100-spine-{blocks}x{per_block}")
    out = []
    for tenants in (2, 4):
        per = per_block // tenants
        groups = [tuple(g for b in range(blocks) for i in range(per)
                        for g in range(8 * (b * per_block + t * per + i),
                                       8 * (b * per_block + t * per + i) + 8))
                  for t in range(tenants)]
        for coll in (Collective.ALLREDUCE, Collective.ALLGATHER):
            out.append(_compared("shared", f"{fabric.name} {tenants} tenants ({per} node(s) of "
                                 f"every block each), {coll.value} 1 GiB", fabric, groups, coll,
                                 1 << 30, target=SHARED_TARGET, engine=engine))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m choreo.nccl.versus", description=__doc__)
    p.add_argument("--nodes", default="1,2,4,8,16,128", help="dgx-h100 node counts")
    p.add_argument("--degraded-skip", default="",
                   help="node counts whose degraded and shared cases are left out")
    p.add_argument("--quick", action="store_true", help="1 GiB only")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--engine", choices=("greedy", "auto"), default="greedy",
                   help="greedy (the product's default) or the portfolio within --deadline")
    p.add_argument("--deadline", type=float, default=30.0,
                   help="seconds per case for --engine auto")
    args = p.parse_args(argv)
    nodes = tuple(int(x) for x in args.nodes.split(","))
    skip = tuple(int(x) for x in args.degraded_skip.split(",") if x)
    table = rows(nodes, (1024 * MIB,) if args.quick else SIZES, skip,
                 Engine(args.engine, args.deadline))
    return finish(table, "choreo vs NCCL as it runs (NCCL time / choreo time; > 1: choreo ahead)",
                  args.json)


if __name__ == "__main__":
    raise SystemExit(main())
