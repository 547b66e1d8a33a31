"""``python -m choreo_dev.soak``: the scenarios at soak length, as a benchmark table.

Runs the scale scenario (128 nodes x 8 GPUs, 20 tenants) and the faults scenario for
``--minutes`` of chaos on fresh local clusters, then prints measured | target | reference
rows. Randomness is seeded (``--seed``, printed); every process is stopped by PID.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from choreo.benchtable import Row, exit_code, print_rows
from choreo_dev.scenarios import faults, scale
from choreo_dev.scenarios.world import world

MIB = 1 << 20
console = Console(highlight=False)
if not console.is_terminal:
    console.width = 120  # logs and CI: wide enough for the table


def say(message: str) -> None:
    console.print(f"· {message}")


def scale_rows(seed: int, nodes: int, tenants: int, keep: Path | None) -> list[Row]:
    with world(keep / "scale" if keep else None) as w:
        r = scale.run(w, seed, nodes, tenants, say)
    report = r.report
    assert report is not None
    for problem in report.problems[:20]:
        say(f"[red]problem:[/] {problem}")
    return [
        Row(f"scale: {tenants} tenants ({r.gpus} GPUs) on {nodes} nodes, time to converge",
            f"{r.converge_seconds:.1f} s", "<= 300 s", "issue 10", r.converge_seconds <= 300),
        Row("scale: tenants Ready with verified schedules",
            f"{report.verified}/{report.tenants} ({len(report.problems)} problems)",
            f"{tenants}/{tenants}", "issue 10", report.ok),
        Row("scale: operator RSS", f"{r.operator_rss / MIB:.0f} MiB", "<= 500 MiB",
            "chart limit 1 GiB", r.operator_rss <= 500 * MIB),
        Row("scale: synthesizer RSS (with workers)", f"{r.synthesizer_rss / MIB:.0f} MiB",
            "<= 2048 MiB", "chart limit 4 GiB", r.synthesizer_rss <= 2048 * MIB),
    ]


def fault_rows(seed: int, minutes: float, keep: Path | None) -> list[Row]:
    with world(keep / "faults" if keep else None) as w:
        r = faults.run(w, seed, minutes * 60, say=say, converge_timeout=300)
    report = r.report
    assert report is not None
    for problem in report.problems[:20]:
        say(f"[red]problem:[/] {problem}")
    injected = {k: v for k, v in sorted(r.actions.items())}
    p50, p90, p99 = (r.quantile(q) for q in (0.5, 0.9, 0.99))
    return [
        Row(f"faults: {minutes:g} min of chaos, actions",
            ", ".join(f"{k} {v}" for k, v in injected.items()), "-", "issue 10", None),
        Row("faults: converged after the chaos", f"{r.converge_seconds:.1f} s "
            f"({r.open_faults} faults still open)", "<= 120 s", "issue 10",
            r.converge_seconds <= 120),
        Row("faults: tenants on verified schedules, no failed device, no lost or orphaned "
            "ConfigMap", f"{report.verified}/{report.tenants} ({len(report.problems)} problems,"
            f" {report.configmaps} ConfigMaps)", "all", "issue 10", report.ok),
        Row("faults: resynthesis latency p50 / p90 / p99 (operator histogram)",
            f"{p50:.2f} / {p90:.2f} / {p99:.2f} s over {r.resyntheses}", "p90 <= 5 s",
            "issue 6: <= 1 s for 64 GPUs", p90 <= 5),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m choreo_dev.soak",
                                description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="chaos duration (default 10)")
    p.add_argument("--seed", type=int, help="random seed (default: random, printed)")
    p.add_argument("--nodes", type=int, default=128)
    p.add_argument("--tenants", type=int, default=20)
    p.add_argument("--skip-scale", action="store_true")
    p.add_argument("--keep", type=Path, help="keep state and logs in this directory")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup on SIGTERM
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    console.print(f"soak seed {seed} (replay with --seed {seed})")
    rows = [] if args.skip_scale else scale_rows(seed, args.nodes, args.tenants, args.keep)
    rows += fault_rows(seed, args.minutes, args.keep)
    print_rows(rows, f"choreo soak (seed {seed})", console)
    return exit_code(rows)


if __name__ == "__main__":
    sys.exit(main())
