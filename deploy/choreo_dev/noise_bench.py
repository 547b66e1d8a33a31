"""``python -m choreo_dev.noise_bench``: the greedy engine, the hierarchical AllReduce, the
rail-aligned plan and the plane plan on links measured with noise.

Agents measure every link's alpha and bandwidth; no two come out equal. Each case perturbs
every link of a built-in fabric by a uniform relative noise (seed 7) and reports the
synthesized time over the noise-free one. The slowest link of a round sets it, so about
``1 + noise`` is the best to expect; the target allows twice the noise. ``synthesize`` keeps
the faster of the rail or plane plan and the other, so what ships is never slower than both.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from choreo.benchtable import Row, finish
from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.planes import plane_gather, plane_layout
from choreo.railgather import layout, rail_gather
from choreo.schedule import Schedule
from choreo.synth import SynthOptions, synthesize
from choreo.topology import Topology

FABRICS = ("dgx-h100-2", "dgx-h100-4", "switch2d-8x4", "torus-4x4", "3d-rfs-64", "dgx-h100-33",
           "mi250")
NOISE = (0.005, 0.04, 0.08, 0.15)
SIZE = 256 << 20


def noisy(topo: Topology, noise: float, seed: int = 7) -> Topology:
    rng = np.random.default_rng(seed)
    return topo.with_links([replace(lk, bandwidth=lk.bandwidth * (1 + rng.uniform(-noise, noise)),
                                    alpha=lk.alpha * (1 + rng.uniform(-noise, noise)))
                            for lk in topo.links])


def _run(plan: str, topo: Topology, d: Demand) -> Schedule:
    """The rail-aligned or the plane plan alone, or what ``synthesize`` gives without them
    (the greedy engine or the packed trees, or the hierarchical AllReduce above 256 ranks)."""
    if plan == "rail":
        return rail_gather(topo, [d])
    if plan == "plane":
        planned = plane_gather(topo, [d])
        if planned is None:
            raise RuntimeError(f"{topo.name}: the plane plan no longer applies")
        return planned
    return synthesize(topo, [d], SynthOptions(relay=False, restarts=1, rail_gather=False))


def rows() -> list[Row]:
    out = []
    for spec in FABRICS:
        topo = build(spec)
        for coll in (Collective.ALLGATHER, Collective.ALLREDUCE):
            d = Demand(coll, tuple(topo.npus), SIZE, 1)
            plans = ["other"] + ["rail"] * (layout(topo, d) is not None) + [
                "plane"] * (plane_layout(topo, d) is not None)
            for plan in plans:
                clean = _run(plan, topo, d)
                for noise in NOISE:
                    ratio = _run(plan, noisy(topo, noise), d).makespan / clean.makespan
                    out.append(Row(
                        f"{spec} {coll.value} 256 MiB, {noise:.1%} noise, {clean.engine}",
                        f"{ratio:.2f}x the noise-free time", f"<= {1 + 2 * noise:.2f}x",
                        f"noise-free {clean.makespan * 1e3:.3f} ms", ratio <= 1 + 2 * noise,
                        value=ratio))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m choreo_dev.noise_bench", description=__doc__)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    return finish(rows(), "synthesis on noisy link measurements", args.json)


if __name__ == "__main__":
    raise SystemExit(main())
