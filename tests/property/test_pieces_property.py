"""Any schedule with any of its transfers' ends cut into pieces is still the collective, and
its MSCCL file runs to completion in the interpreter: received pieces of one range lie side by
side, and a message of several chunks waits for room in the FIFO."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.msccl import run, to_xml
from choreo.pieces import Cut, cut_ends
from choreo.schedule import Schedule
from choreo.simulate import durations
from choreo.synth import SynthOptions, synthesize
from choreo.verify import verify

FABRICS = ("ring-6", "torus-3x3", "switch2d-4x2", "dragonfly-3x4", "dgx1", "dgx-h100-2")
COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE,
               Collective.BROADCAST, Collective.REDUCE)
_CACHE: dict[tuple[object, ...], Schedule] = {}


def _schedule(fabric: str, collective: Collective, chunks: int) -> Schedule:
    key = (fabric, collective, chunks)
    if key not in _CACHE:
        topo = build(fabric)
        demand = Demand(collective, tuple(topo.npus), 1 << 20, chunks, root=1)
        _CACHE[key] = synthesize(topo, [demand], SynthOptions(restarts=1, relay=False))
    return _CACHE[key]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fabric=st.sampled_from(FABRICS), collective=st.sampled_from(COLLECTIVES),
       chunks=st.integers(1, 3), pieces=st.integers(2, 5), head=st.floats(-1.0, 3.0),
       tail=st.floats(-1.0, 3.0))
def test_cut_schedules_verify_and_run(fabric: str, collective: Collective, chunks: int,
                                      pieces: int, head: float, tail: float) -> None:
    s = _schedule(fabric, collective, chunks)
    longest = float(durations(s).max())
    cut = cut_ends(s, Cut(pieces, head * longest, tail * longest))
    verdict = verify(cut)
    assert verdict.ok, verdict.summary()
    result = run(to_xml(cut), root=1)
    assert result.ok, str(result)
