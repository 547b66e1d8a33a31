"""Draw the dashboard's panels from Prometheus data into one PNG, in the dashboard's order.

Each panel becomes a small line chart with Grafana's units (bytes/s as GB/s, seconds,
percent) and legends. It is a picture of what the dashboard shows, not a Grafana clone:
stat and table panels are drawn as time series too.
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from choreo_dev.dashboard.promql import (
    Prometheus,
    Series,
    default_variables,
    expand,
    legend,
    panels,
)

# unit -> (divisor, axis label)
UNITS: dict[str, tuple[float, str]] = {
    "Bps": (1e9, "GB/s"),
    "s": (1.0, "seconds"),
    "percentunit": (0.01, "%"),
    "reqps": (1.0, "requests/s"),
    "short": (1.0, ""),
}


@dataclass
class PanelData:
    """What one panel drew: its title and, per query, the series returned."""

    title: str
    unit: str
    series: list[tuple[str, Series]] = field(default_factory=list)

    @property
    def points(self) -> int:
        return sum(len(s.values) for _, s in self.series)


def fetch(dashboard: dict[str, Any], prom: Prometheus, start: float, end: float,
          step: float, variables: dict[str, str] | None = None) -> list[PanelData]:
    """Run every query of every panel over ``[start, end]``."""
    values = variables or default_variables(dashboard)
    out = []
    for p in panels(dashboard):
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        data = PanelData(p.get("title", ""), unit)
        for t in p["targets"]:
            for s in prom.query_range(expand(t["expr"], values), start, end, step):
                data.series.append((legend(t.get("legendFormat", ""), s.labels), s))
        out.append(data)
    return out


def draw(title: str, data: list[PanelData], columns: int = 2) -> bytes:
    """One PNG with a subplot per panel; empty panels say "no data"."""
    rows = max(1, math.ceil(len(data) / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(7.2 * columns, 3.4 * rows), squeeze=False)
    t0 = min((s.times[0] for d in data for _, s in d.series if s.times), default=0.0)
    for ax, panel in zip(axes.flat, data, strict=False):
        _draw_panel(ax, panel, t0)
    for ax in list(axes.flat)[len(data):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=14, fontweight="bold")
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def _draw_panel(ax: Axes, panel: PanelData, t0: float) -> None:
    divisor, label = UNITS.get(panel.unit, (1.0, panel.unit))
    ax.set_title(panel.title, fontsize=10, loc="left")
    ax.grid(True, alpha=0.3)
    ax.set_xlabel("seconds", fontsize=8)
    if label:
        ax.set_ylabel(label, fontsize=8)
    drawn = 0
    for name, s in panel.series:
        if not s.values:
            continue
        xs = [t - t0 for t in s.times]
        ys = [v / divisor for v in s.values]
        style = "o-" if len(xs) < 3 else "-"
        ax.plot(xs, ys, style, markersize=3, linewidth=1.4, label=name[:48])
        drawn += 1
    if drawn:
        ax.legend(fontsize=7, loc="best", ncol=2 if drawn > 4 else 1)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes,
                color="grey")
    ax.tick_params(labelsize=7)


def render(dashboard: dict[str, Any], prom: Prometheus, out: Path, *, minutes: float = 15.0,
           step: float | None = None, end: float | None = None,
           variables: dict[str, str] | None = None) -> list[PanelData]:
    """Fetch the last ``minutes`` of every panel and write the PNG to ``out``."""
    end = time.time() if end is None else end
    start = end - minutes * 60
    step = step or max(1.0, minutes * 60 / 300)
    data = fetch(dashboard, prom, start, end, step, variables)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(draw(dashboard.get("title", "dashboard"), data))
    return data
