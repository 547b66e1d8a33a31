"""Pictures of a schedule: a link-utilization heat map (as in TACOS Fig. 1/17) and a timeline."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from choreo.schedule import Schedule
from choreo.simulate import SimResult


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def utilization_heatmap(schedule: Schedule, sim: SimResult, title: str = "") -> bytes:
    """NPU-to-NPU matrix of how busy each physical link was (switch hops folded to endpoints)."""
    fabric = schedule.fabric
    npus = fabric.all_npus
    index = {v: i for i, v in enumerate(npus)}
    grid = np.full((len(npus), len(npus)), np.nan)
    util = sim.fabric_utilization
    for i, link in enumerate(fabric.links):
        a = link.src if link.src in index else None
        b = link.dst if link.dst in index else None
        if a is None or b is None:
            # an NPU-switch port: show it on the diagonal of its NPU
            npu = a if a is not None else b
            if npu is None:
                continue
            a = b = npu
        cell = grid[index[a], index[b]]
        grid[index[a], index[b]] = util[i] if np.isnan(cell) else max(cell, util[i])
    fig, ax = plt.subplots(figsize=(6.4, 5.4))
    im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xlabel("destination NPU")
    ax.set_ylabel("source NPU (diagonal: switch ports)")
    ax.set_title(title or f"link utilization: {schedule.topology.name} ({schedule.engine})")
    fig.colorbar(im, ax=ax, label="busy time / collective time")
    return _png(fig)


def timeline(schedule: Schedule, sim: SimResult, title: str = "") -> bytes:
    """Aggregate link bandwidth in use over time, one curve per tenant."""
    topo = schedule.topology
    bw = np.array([lk.bandwidth for lk in topo.links])[schedule.link]
    bins = 200
    edges = np.linspace(0.0, max(sim.makespan, 1e-12), bins + 1)
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for t, d in enumerate(schedule.demands):
        mine = schedule.tenant == t
        starts, ends, rate = sim.start[mine], sim.end[mine], bw[mine]
        load = _binned_load(starts, ends, rate, edges)
        ax.plot(edges[:-1] * 1e6, load / 1e9, label=d.name or f"tenant{t} {d.collective.value}")
    ax.set_xlabel("time (us)")
    ax.set_ylabel("bandwidth in use (GB/s)")
    ax.set_title(title or "collective timeline")
    ax.legend(loc="upper right", fontsize="small")
    return _png(fig)


def _binned_load(starts: np.ndarray, ends: np.ndarray, rate: np.ndarray,
                 edges: np.ndarray) -> np.ndarray:
    """Mean of the summed ``rate`` of active intervals over each bin (exact, O(n log n))."""
    times = np.concatenate([starts, ends])
    deltas = np.concatenate([rate, -rate])
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(deltas[order])
    # integral of the step function at each event time
    integral = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))])
    at_edges = np.interp(edges, times, integral, left=0.0, right=integral[-1] if len(times) else 0)
    return np.diff(at_edges) / np.diff(edges)
