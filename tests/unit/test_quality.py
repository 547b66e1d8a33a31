"""choreo is never slower than the best baseline on any built-in fabric (simulated time)."""

from __future__ import annotations

import pytest

from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.report import evaluate
from choreo.synth import SynthOptions, auto_chunks, synthesize

BUILTINS = ["ring-8", "uniring-8", "fc-8", "mesh-4x4", "mesh-3x3x3", "torus-8x8", "torus-4x4x4",
            "hypercube-4x4x4", "switch-16", "switch2d-8x4", "3d-rfs-64", "dragonfly-4x5", "dgx1",
            "dgx2", "dgx2-2", "ndv2-2", "dgx-h100-4", "mi250"]
SIZE = 1 << 30


@pytest.mark.parametrize("coll", [Collective.ALLREDUCE, Collective.ALLGATHER])
@pytest.mark.parametrize("name", BUILTINS)
def test_never_slower_than_the_best_baseline(name: str, coll: Collective):
    fabric = build(name)
    n = len(fabric.npus)
    demand = Demand(coll, tuple(fabric.npus), SIZE, auto_chunks(fabric, coll, SIZE, n))
    ev = evaluate(synthesize(fabric, [demand], SynthOptions(restarts=4)))
    assert ev.verdict.ok, ev.verdict.errors[:3]
    result = ev.tenants[0]
    best = result.best_baseline
    assert best is not None
    assert result.time <= best[1] * (1 + 1e-9), f"{best[0]} is faster: {best[1]} < {result.time}"
    assert 0 < result.fraction_of_bound <= 1 + 1e-9
