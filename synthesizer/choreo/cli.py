"""The ``choreo`` command: synthesize, simulate, verify, list topologies.

The layers above the core (service, operator, agents, dev tooling) add their own commands
through ``choreo.commands`` entry points, so the core never imports them. Errors a user can
fix are printed as one ``error: ...`` line naming the field and exit 2; nothing is written
unless the whole result is ready.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from importlib.metadata import entry_points
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from choreo.collectives import Collective, Demand, format_size, parse_size
from choreo.errors import ChoreoError, InputError
from choreo.msccl import cli as msccl_cli
from choreo.msccl.lower import lowerable
from choreo.nccl.compare import Versus, versus_nccl
from choreo.report import NCCL, Evaluation, TenantResult, evaluate
from choreo.schedule import Schedule
from choreo.topology import Topology

console = Console(highlight=False, soft_wrap=True)
status_console = Console(stderr=True, highlight=False, soft_wrap=True)

# Entry-point group of the commands other packages add, each a ``register(subparsers)``
# called in name order.
COMMANDS = "choreo.commands"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ChoreoError as err:
        status_console.print(f"[bold red]error:[/] {escape(str(err))}")
        return 2
    except KeyboardInterrupt:
        status_console.print("interrupted")
        return 130
    except Exception as err:  # a bug: say so plainly, show the traceback only on request
        if os.environ.get("CHOREO_DEBUG"):
            raise
        status_console.print(f"internal error: {type(err).__name__}: {escape(str(err))} "
                             "(set CHOREO_DEBUG=1 for a traceback)")
        return 70


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="choreo", description="Topology-aware collective synthesis for GPU/NPU clusters: "
        "synthesize and check schedules, and run the operator, synthesizer service and agent.")
    sub = p.add_subparsers(metavar="COMMAND")

    s = sub.add_parser("synthesize", help="synthesize a collective schedule for a topology")
    s.add_argument("--topology", "-t", default="3d-rfs-64",
                   help="built-in name (see `choreo topologies`) or a YAML/JSON file")
    s.add_argument("--collective", "-c", default="allreduce",
                   help=", ".join(c.value for c in Collective))
    s.add_argument("--size", "-s", default="1GiB", help="bytes, nccl-tests convention (1GiB, 64MB)")
    s.add_argument("--chunks", type=int,
                   help="chunks per rank piece (default: from size, alpha, beta)")
    s.add_argument("--root", type=int, default=0, help="root rank of rooted collectives")
    s.add_argument("--fail", default="", help="failures, e.g. npu:7,link:3-4,degrade:1-2:0.5")
    s.add_argument("--tenants", help="YAML/JSON file of several tenants (replaces -c/-s)")
    s.add_argument("--no-relay", action="store_true", help="only a tenant's own NPUs may forward")
    s.add_argument("--restarts", type=int, default=4, help="randomized restarts (best kept)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--engine", choices=("greedy", "milp", "lp", "auto"), default="greedy",
                   help="greedy (TACOS), milp/lp (TE-CCL, HiGHS) or auto (best verified)")
    s.add_argument("--deadline", type=float, default=10.0, metavar="SECONDS",
                   help="time budget of --engine milp, lp and auto")
    s.add_argument("--out", "-o", help="directory for schedule.json, summary.json and plots")
    s.add_argument("--plot", action="store_true", help="also write utilization.png, timeline.png")
    s.add_argument("--no-baselines", action="store_true", help="skip the baseline comparison")
    s.set_defaults(func=cmd_synthesize)
    msccl_cli.add_synthesize_options(s)

    t = sub.add_parser("topologies", help="list the built-in topologies")
    t.add_argument("name", nargs="?", help="show one topology's size and bandwidths")
    t.set_defaults(func=cmd_topologies)

    v = sub.add_parser("verify", help="check a schedule.json with the independent verifier")
    v.add_argument("schedule")
    v.set_defaults(func=cmd_verify)

    m = sub.add_parser("simulate", help="simulate a schedule.json and compare with baselines")
    m.add_argument("schedule")
    m.add_argument("--no-baselines", action="store_true")
    m.set_defaults(func=cmd_simulate)

    msccl_cli.register(sub)
    for command in sorted(entry_points(group=COMMANDS), key=lambda ep: ep.name):
        command.load()(sub)
    return p


# ---- synthesize ------------------------------------------------------------------------------


def load_fabric(spec: str, failures: str = "") -> Topology:
    from choreo.topofile import load_topology
    from choreo.transforms import apply_failures

    fabric = load_topology(spec)
    return apply_failures(fabric, failures) if failures else fabric


def build_demands(args: argparse.Namespace, fabric: Topology) -> tuple[list[Demand], bool]:
    from choreo.synth import auto_chunks
    from choreo.tenants import TenantSpec, load_tenants

    if args.tenants:
        specs, relay = load_tenants(args.tenants, fabric)
    else:
        specs = [TenantSpec(name="", ranks=tuple(fabric.npus),
                            collective=Collective.parse(args.collective, "--collective"),
                            size=parse_size(args.size, "--size"), chunks=args.chunks,
                            root=args.root)]
        relay = True
        if args.chunks is not None and args.chunks < 1:
            raise InputError(f"--chunks: must be at least 1, got {args.chunks}")
        if len(specs[0].ranks) < 2:
            raise InputError(f"--topology: {fabric.name} has {len(specs[0].ranks)} live NPU(s); "
                             "a collective needs at least 2")
    demands = [s.demand(auto_chunks(fabric, s.collective, s.size, len(s.ranks))) for s in specs]
    return demands, relay and not args.no_relay


def cmd_synthesize(args: argparse.Namespace) -> int:
    from choreo.synth import SynthOptions, synthesize

    if args.restarts < 1:
        raise InputError("--restarts: must be at least 1")
    if not args.deadline > 0:
        raise InputError(f"--deadline: must be positive, got {args.deadline}")
    fabric = load_fabric(args.topology, args.fail)
    demands, relay = build_demands(args, fabric)
    relay = relay and not args.msccl_out  # MSCCL can only use the communicator's own GPUs
    with progress() as step:
        step(f"synthesizing on {fabric.name}")
        started = time.perf_counter()
        # Several MSCCL instances need single-chunk transfers (the rail plan moves ranges).
        rail = getattr(args, "instances", 1) == 1
        # Files are written only where the winner lowers: nothing else may win then.
        accept = (partial(lowerable, dialect=args.dialect, instances=args.instances,
                          proto=args.proto) if args.msccl_out else None)
        if args.engine == "greedy":
            sched = synthesize(fabric, demands, SynthOptions(
                restarts=args.restarts, seed=args.seed, relay=relay, rail_gather=rail,
                accept=accept))
        else:
            from choreo.portfolio import PortfolioOptions, solve

            sched = solve(fabric, demands, args.engine, args.deadline, PortfolioOptions(
                restarts=args.restarts, seed=args.seed, relay=relay, rail_gather=rail,
                accept=accept))
        seconds = time.perf_counter() - started
        sched.meta["synthesis_seconds"] = seconds
        ev = evaluate(sched, baselines=not args.no_baselines, step=step)
        files: dict[str, Callable[[], bytes]] = {}
        behind = _nccl_ahead(ev) if args.msccl_out and not args.force else {}
        msccl = (msccl_cli.msccl_files(sched, args, frozenset(behind)) if args.msccl_out
                 else {})
        if args.out:
            files["schedule.json"] = lambda: json.dumps(sched.to_dict(),
                                                        separators=(",", ":")).encode()
            files["summary.json"] = lambda: json.dumps(ev.to_dict(), indent=2).encode()
            if args.plot:
                from choreo import plots

                files["utilization.png"] = lambda: plots.utilization_heatmap(sched, ev.sim)
                files["timeline.png"] = lambda: plots.timeline(sched, ev.sim)
            step("writing results")
            write_all(Path(args.out), files)
        if msccl:
            write_all(Path(args.msccl_out), msccl)
    print_evaluation(ev, seconds)
    if args.out:
        console.print(f"wrote {', '.join(files)} to {escape(args.out)}")
    for t, why in behind.items():
        console.print(f"{escape(ev.tenants[t].name)}: no MSCCL file: {escape(why)}; NCCL runs "
                      "its own algorithm (--force writes the file anyway)")
    if msccl:
        console.print(f"wrote {', '.join(listed(msccl))} to {escape(args.msccl_out)}")
    return 0 if ev.verdict.ok else 1


def listed(names: Iterable[str]) -> list[str]:
    """File names as written, a folder of per-node files as one entry with its count."""
    folders: dict[str, int] = {}
    for name in names:
        head, sep, _ = name.rpartition("/")
        key = f"{head}/" if sep else name
        folders[key] = folders.get(key, 0) + 1
    return [f"{k} ({n:,} node files)" if k.endswith("/") else k for k, n in folders.items()]


def _nccl_ahead(ev: Evaluation) -> dict[int, str]:
    """Tenants whose schedule NCCL is predicted to beat, with why: shipping a file there
    would make the job slower than not installing choreo."""
    out = {}
    for k, t in enumerate(ev.tenants):
        nccl = t.baselines.get(NCCL)
        vs = (Versus(t.time, nccl, t.nccl_choice) if nccl is not None  # else --no-baselines
              else versus_nccl(ev.schedule.fabric, ev.schedule.demands[k], t.time))
        if vs is not None and vs.nccl_ahead:
            out[k] = vs.why()
    return out


def write_all(out: Path, files: dict[str, Callable[[], bytes]]) -> None:
    """Render every file first, then move them in: a failure leaves no partial output."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, render in files.items():  # a name may hold a folder (per-node files)
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_bytes(render())
        out.mkdir(parents=True, exist_ok=True)
        for name in files:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def progress() -> Iterator[Callable[[str], None]]:
    """A spinner with the current step on a terminal; silent otherwise."""
    if not status_console.is_terminal:
        yield lambda _msg: None
        return
    with status_console.status("starting") as status:
        yield lambda msg: status.update(msg)


def _fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def print_evaluation(ev: Evaluation, seconds: float | None = None) -> None:
    """One block per tenant: its time against the bound, then against every baseline."""
    sched = ev.schedule
    console.print(f"[bold]{sched.engine}[/] schedule on [bold]{escape(sched.topology.name)}[/]: "
                  f"{len(sched):,} transfers, " + ("[green]verified[/]" if ev.verdict.ok
                                                   else "[red]FAILED verification[/]")
                  + (f", synthesized in {_fmt_time(seconds)}" if seconds is not None else ""))
    for err in ev.verdict.errors[:10]:
        console.print(f"  [red]{escape(err)}[/]")
    for t in ev.tenants:
        title = (f"{escape(t.name)}: {t.collective} of {format_size(t.size)} on {t.npus} NPUs, "
                 f"{t.chunks} chunk(s) per piece")
        table = Table(title=title, title_justify="left")
        table.add_column("algorithm")
        table.add_column("time", justify="right")
        table.add_column("algbw GB/s", justify="right")
        table.add_column("busbw GB/s", justify="right")
        table.add_column("vs choreo", justify="right")
        factor = t.busbw / t.algbw if t.algbw else 1.0
        table.add_row("[bold]choreo[/]", _fmt_time(t.time), f"{t.algbw / 1e9:.1f}",
                      f"{t.busbw / 1e9:.1f}", "1.00x")
        if NCCL in t.baselines:
            table.add_row("NCCL model", *_versus(t, t.baselines[NCCL], factor))
        table.add_row("lower bound", _fmt_time(t.bound), f"{t.size / t.bound / 1e9:.1f}",
                      f"{factor * t.size / t.bound / 1e9:.1f}",
                      f"choreo at {t.fraction_of_bound:.1%}")
        for name, bt in sorted(t.baselines.items(), key=lambda kv: kv[1]):
            if name != NCCL:
                table.add_row(escape(name), *_versus(t, bt, factor))
        console.print(table)
        vs = t.speedup(NCCL)
        if vs is not None:
            console.print(f"  vs NCCL ({escape(t.nccl_choice)}): {vs:.2f}x" + (
                "" if vs >= 1 else " (slower: NCCL's own algorithm is the better choice here)"))
        console.print(f"  bound: {escape(t.bound_kind)}")


def _versus(t: TenantResult, other: float, factor: float) -> tuple[str, str, str, str]:
    """time, algbw, busbw and the ratio to choreo of another algorithm's run."""
    return (_fmt_time(other), f"{t.size / other / 1e9:.1f}", f"{factor * t.size / other / 1e9:.1f}",
            f"{other / t.time:.2f}x slower" if other >= t.time else f"{t.time / other:.2f}x faster")


# ---- other commands --------------------------------------------------------------------------


def cmd_topologies(args: argparse.Namespace) -> int:
    from choreo.generators import list_builtins

    if args.name:
        topo = load_fabric(args.name)
        npus = topo.npus
        bws = sorted({round(lk.bandwidth / 1e9, 3) for lk in topo.links})
        console.print(f"{escape(topo.name)}: {len(npus)} NPUs, {len(topo.switches)} switches, "
                      f"{len(topo.links)} links, bandwidths {bws} GB/s")
        console.print(f"min per-NPU ingress {min(topo.ingress_bandwidth(v) for v in npus) / 1e9:g}"
                      " GB/s")
        return 0
    table = Table(title="built-in topologies")
    table.add_column("name")
    table.add_column("description")
    for name, text in list_builtins():
        table.add_row(escape(name), escape(text))
    console.print(table)
    return 0


def _load_schedule(path: str) -> Schedule:
    try:
        return Schedule.load(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: not a schedule JSON file ({err})") from None
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(f"{path}: malformed schedule: {err}") from None


def cmd_verify(args: argparse.Namespace) -> int:
    from choreo.verify import verify

    sched = _load_schedule(args.schedule)
    verdict = verify(sched)
    if verdict.ok:
        console.print(f"{escape(args.schedule)}: valid ({len(sched)} transfers, "
                      f"{len(sched.demands)} tenant(s))")
        return 0
    console.print(f"{escape(args.schedule)}: INVALID")
    for err in verdict.errors:
        console.print(f"  {escape(err)}")
    return 1


def cmd_simulate(args: argparse.Namespace) -> int:
    sched = _load_schedule(args.schedule)
    ev = evaluate(sched, baselines=not args.no_baselines)
    print_evaluation(ev)
    return 0 if ev.verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
