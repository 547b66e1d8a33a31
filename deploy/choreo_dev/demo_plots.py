"""The demo's pictures: per-port link utilization before and after faults, and a timeline.

On an NVSwitch + rail fabric every link joins a GPU to a switch, so a GPU-by-GPU matrix is
empty off its diagonal. The utilization picture is instead one row per node and one column
per GPU port: its NVSwitch port and its rail (NIC) port, busy time over collective time.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from choreo.collectives import Collective, Demand
from choreo.simulate import simulate
from choreo.synth import SynthOptions, auto_chunks, synthesize
from choreo.topology import Topology


@dataclass
class Utilization:
    """Busy fraction per (node, column); NaN where the GPU failed, -1 where the port is down."""

    title: str
    nodes: list[str]
    grid: np.ndarray  # nodes x (gpus NVSwitch ports + gpus rail ports)
    gpus: int


def utilization(topo: Topology, tenants: Sequence[tuple[str, str, tuple[int, ...], int]],
                title: str) -> Utilization:
    """Synthesize ``tenants`` (name, collective, fabric ids, bytes) jointly on ``topo`` with the
    library and fold the simulated per-link busy time onto GPU ports."""
    demands = []
    for name, coll, npus, size in tenants:
        c = Collective.parse(coll)
        demands.append(Demand(c, npus, size, auto_chunks(topo, c, size, len(npus)), name=name))
    sched = synthesize(topo, demands, SynthOptions(restarts=1, relay=False))
    util = simulate(sched).fabric_utilization
    names = topo.names or tuple(str(v) for v in range(topo.num_nodes))
    nodes = sorted({names[v].split("/")[0] for v in topo.all_npus},
                   key=lambda n: (len(n), n))
    gpus = max(int(names[v].rsplit("gpu", 1)[1]) for v in topo.all_npus) + 1
    grid = np.zeros((len(nodes), 2 * gpus))
    row = {n: i for i, n in enumerate(nodes)}
    for i, link in enumerate(topo.links):
        for npu, other in ((link.src, link.dst), (link.dst, link.src)):
            if not topo.is_npu(npu) or topo.is_npu(other):
                continue
            node, gpu = names[npu].split("/")[0], int(names[npu].rsplit("gpu", 1)[1])
            col = gpu if "nvswitch" in names[other] else gpus + gpu
            if not link.healthy:
                grid[row[node], col] = -1.0
            elif grid[row[node], col] >= 0:
                grid[row[node], col] = max(grid[row[node], col], float(util[i]))
    for v in topo.failed:
        node, gpu = names[v].split("/")[0], int(names[v].rsplit("gpu", 1)[1])
        grid[row[node], [gpu, gpus + gpu]] = np.nan
    return Utilization(title, nodes, grid, gpus)


def utilization_png(panels: Sequence[Utilization]) -> bytes:
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.4), squeeze=False)
    cmap = matplotlib.colormaps["viridis"].copy()
    cmap.set_bad("#d62728")
    image = None
    for ax, p in zip(axes[0], panels, strict=True):
        shown = np.ma.masked_invalid(np.where(p.grid < 0, np.nan, p.grid))
        image = ax.imshow(shown, cmap=cmap, vmin=0, vmax=1, aspect="auto",
                          interpolation="nearest")
        down = np.argwhere(p.grid < 0)
        for r, c in down:
            ax.text(c, r, "x", ha="center", va="center", color="white", fontsize=12,
                    fontweight="bold")
        ax.axvline(p.gpus - 0.5, color="white", linewidth=2)
        ax.set_xticks(range(2 * p.gpus))
        ax.set_xticklabels([f"nv{g}" for g in range(p.gpus)] + [f"ib{g}" for g in range(p.gpus)],
                           rotation=90, fontsize=7)
        ax.set_yticks(range(len(p.nodes)))
        ax.set_yticklabels(p.nodes, fontsize=8)
        ax.set_title(p.title, fontsize=10)
        ax.set_xlabel("GPU port: NVSwitch (nv) | rail NIC (ib)")
    fig.suptitle("link utilization per GPU port (red: failed GPU, x: failed link)")
    if image is not None:
        fig.colorbar(image, ax=axes[0].tolist(), label="busy time / collective time",
                     shrink=0.85)
    return _png(fig)


@dataclass
class Mark:
    """One moment of the fault timeline, in seconds since the demo started."""

    at: float
    lane: str
    kind: str  # fault, failure, configmap, recovered
    label: str


_STYLE = {"fault": ("X", "#d62728"), "failure": ("o", "#ff7f0e"),
          "configmap": ("s", "#2ca02c"), "recovered": ("^", "#1f77b4")}


def timeline_png(marks: Sequence[Mark], spans: Sequence[tuple[str, float, float]]) -> bytes:
    """Lanes per tenant: fault injected, DeviceFailure seen, new ConfigMap; spans = latency."""
    lanes = list(dict.fromkeys(m.lane for m in marks))
    fig, ax = plt.subplots(figsize=(10, 1.2 + 1.0 * len(lanes)))
    y = {lane: i for i, lane in enumerate(lanes)}
    for lane, t0, t1 in spans:
        ax.plot([t0, t1], [y[lane], y[lane]], color="#999999", linewidth=6, alpha=0.4,
                solid_capstyle="butt")
        ax.annotate(f"{t1 - t0:.2f} s", ((t0 + t1) / 2, y[lane] + 0.18), ha="center",
                    fontsize=8)
    seen: set[str] = set()
    placed: dict[str, int] = {}
    for m in sorted(marks, key=lambda m: (m.lane, m.at)):
        marker, color = _STYLE[m.kind]
        ax.scatter([m.at], [y[m.lane]], marker=marker, color=color, s=70, zorder=3,
                   label=m.kind if m.kind not in seen else None)
        seen.add(m.kind)
        k = placed[m.lane] = placed.get(m.lane, -1) + 1  # alternate rows: close marks
        ax.annotate(m.label, (m.at, y[m.lane] - 0.25 - 0.17 * (k % 2)), ha="center",
                    fontsize=7)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(lanes)
    ax.set_ylim(-0.8, len(lanes) - 0.4)
    ax.set_xlabel("seconds since the demo started")
    ax.set_title("resynthesis timeline: fault injected -> DeviceFailure -> new ConfigMap")
    ax.legend(loc="upper left", fontsize=8, ncol=4)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()
