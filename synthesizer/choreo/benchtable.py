"""The one table every choreo benchmark prints: measured value, target, reference, verdict.

Keeping a single row type means every component reports the same way and a run can be
saved (``--json``) and compared later.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table


@dataclass
class Row:
    """One measurement. ``ok`` is None when there is no target (reported only)."""

    case: str
    measured: str
    target: str
    reference: str
    ok: bool | None = None
    group: str = ""
    value: float = math.nan


def print_rows(rows: Sequence[Row], title: str, console: Console | None = None) -> None:
    """Print the table; by default wide when stdout is not a terminal, so logs do not wrap."""
    out = console or Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    table = Table(title=escape(title))
    grouped = any(r.group for r in rows)
    for col in (["group"] if grouped else []) + ["case", "measured", "target", "reference", "ok"]:
        table.add_column(col, overflow="fold")
    for r in rows:
        mark = "-" if r.ok is None else ("[green]yes[/]" if r.ok else "[red]NO[/]")
        cells = [r.case, r.measured, r.target, r.reference]
        table.add_row(*(escape(c) for c in ([r.group] if grouped else []) + cells), mark)
    out.print(table)


def write_json(rows: Sequence[Row], path: str | Path) -> None:
    Path(path).write_text(json.dumps([asdict(r) for r in rows], indent=2))


def finish(rows: Sequence[Row], title: str, json_path: str | None = None) -> int:
    """Print the table, save it if asked, and return the exit code: how every benchmark's
    ``main`` ends."""
    print_rows(rows, title)
    if json_path:
        write_json(rows, json_path)
    return exit_code(rows)


def exit_code(rows: Sequence[Row]) -> int:
    """0 when no target was missed: a benchmark run can gate on it."""
    return 0 if all(r.ok is not False for r in rows) else 1
