"""engine=auto: never worse than greedy alone, within its deadline, and says who won."""

from __future__ import annotations

import time

import pytest

from choreo.collectives import Collective, Demand
from choreo.errors import InfeasibleError, InputError
from choreo.generators import build
from choreo.msccl.lower import lowerable
from choreo.portfolio import PortfolioOptions, solve
from choreo.simulate import simulate
from choreo.synth import SynthOptions, auto_chunks, synthesize
from choreo.transforms import fail_links
from choreo.verify import verify


def _demand(name: str, coll: Collective, size: int) -> tuple:
    fabric = build(name)
    npus = tuple(fabric.npus)
    return fabric, Demand(coll, npus, size, auto_chunks(fabric, coll, size, len(npus)))


@pytest.mark.parametrize(("name", "coll", "size"), [
    ("dgx1", Collective.ALLGATHER, 1 << 20),
    ("ring-6", Collective.ALLREDUCE, 64 << 20),
    ("switch-8", Collective.ALLTOALL, 1 << 30),
    ("ndv2-2", Collective.ALLTOALL, 1 << 30),
    ("mesh-3x3", Collective.BROADCAST, 1 << 20),
])
def test_auto_is_never_worse_than_greedy_alone(name, coll, size):
    fabric, d = _demand(name, coll, size)
    greedy = synthesize(fabric, [d], SynthOptions())
    sched = solve(fabric, [d], "auto", deadline_s=4.0)
    assert verify(sched).ok
    assert simulate(sched).makespan <= simulate(greedy).makespan * (1 + 1e-9)
    info = sched.meta["portfolio"]
    assert info["winner"] in ("greedy", "milp", "lp")
    assert info["time"] == pytest.approx(simulate(sched).makespan)
    assert info["gap_to_bound"] >= -1e-9
    engines = {c["engine"] for c in info["candidates"]}
    assert "greedy" in engines and len(engines) >= 2


def test_auto_beats_greedy_on_alltoall_with_the_lp():
    fabric, d = _demand("ndv2-2", Collective.ALLTOALL, 64 << 20)  # 1 GiB over 16 ranks
    sched = solve(fabric, [d], "auto", deadline_s=10.0)
    greedy = simulate(synthesize(fabric, [d])).makespan
    assert sched.meta["portfolio"]["winner"] == "lp"
    assert simulate(sched).makespan < greedy * 0.99


@pytest.mark.parametrize(("name", "coll", "deadline"), [
    ("dgx1", Collective.ALLGATHER, 0.3),
    ("torus-4x4", Collective.ALLGATHER, 1.0),
    ("dgx-h100-2", Collective.ALLTOALL, 1.0),
])
def test_auto_respects_its_deadline(name, coll, deadline):
    """Every candidate after the first starts inside the deadline, and an exact solver's own
    time limit ends inside it; how long a solver overruns its limit on a loaded machine is
    the solver's business, so wall time gets only a generous guard against a hang."""
    fabric = build(name)
    d = Demand(coll, tuple(fabric.npus), 64 << 20, chunks=3)
    started = time.perf_counter()
    sched = solve(fabric, [d], "auto", deadline_s=deadline)
    elapsed = time.perf_counter() - started
    assert verify(sched).ok
    first, *later = sched.meta["portfolio"]["candidates"]
    assert first["started_s"] < 0.05
    for cand in later:
        assert cand["started_s"] < deadline, cand
        assert cand["started_s"] + cand.get("budget_s", 0.0) <= deadline, cand
    assert elapsed <= deadline * 4 + 5


@pytest.mark.parametrize("engine", ["greedy", "milp"])
def test_single_engines_run_alone(engine):
    fabric, d = _demand("ring-4", Collective.ALLGATHER, 4 << 20)
    sched = solve(fabric, [d], engine, deadline_s=10.0,
                  options=PortfolioOptions(restarts=1))
    assert sched.engine == engine
    assert [c["engine"] for c in sched.meta["portfolio"]["candidates"]] == [engine]


def test_bad_engine_and_deadline_are_refused():
    fabric, d = _demand("ring-4", Collective.ALLGATHER, 4 << 20)
    with pytest.raises(InputError, match="engine"):
        solve(fabric, [d], "quantum")
    with pytest.raises(InputError, match="deadline"):
        solve(fabric, [d], "auto", deadline_s=0)
    with pytest.raises(InputError, match="MILP"):
        solve(fabric, [d], "lp")



@pytest.mark.parametrize("engine", ["auto", "milp", "greedy"])
def test_a_tenant_cut_apart_is_refused_once_before_any_engine_runs(engine):
    """The failure is named once, as greedy names it, not once per candidate inside "no
    engine produced a verified schedule", and no engine spends the deadline on it."""
    fabric = fail_links(build("ring-4"), [(0, 1), (2, 3)])
    d = Demand(Collective.ALLGATHER, (0, 1, 2, 3), 4 << 20)
    started = time.monotonic()
    with pytest.raises(InfeasibleError, match="disconnected") as err:
        solve(fabric, [d], engine, deadline_s=30)
    assert "no engine" not in str(err.value) and str(err.value).count("disconnected") == 1
    assert time.monotonic() - started < 5

def test_auto_searches_the_chunk_count():
    """Chunks trade pipelining against per-step alphas: from the rule of thumb's count, the
    search doubles while that is faster, then tries halfway to the best's neighbours, and
    the fastest wins, however many chunks it has."""
    fabric, d = _demand("dragonfly-4x5", Collective.ALLGATHER, 1 << 30)
    sched = solve(fabric, [d], "auto", 10.0, PortfolioOptions(relay=False))
    info = sched.meta["portfolio"]
    times = {c["variant"]: c["time"] for c in info["candidates"] if "time" in c}
    given = times["given"]
    doubled = f"chunks {2 * d.chunks}"
    assert doubled in times  # the search started there
    assert info["variant"].startswith("chunks ") and info["time"] == min(times.values())
    assert info["time"] < given * 0.999
    assert sched.demands[0].chunks != d.chunks and verify(sched).ok


def test_a_candidate_the_caller_cannot_use_never_wins():
    """``accept`` (a lowering check, where files ship) sees every candidate but the first;
    one it refuses is recorded with why and cannot win, even when faster."""
    fabric, d = _demand("dragonfly-4x5", Collective.ALLGATHER, 1 << 30)
    seen = []

    def refuse(schedule):
        seen.append(schedule.demands[0].chunks)
        return "too many steps"

    sched = solve(fabric, [d], "auto", 10.0, PortfolioOptions(relay=False, accept=refuse))
    info = sched.meta["portfolio"]
    assert info["variant"] == "given" and sched.demands[0].chunks == d.chunks
    refused = [c for c in info["candidates"] if c["variant"] != "given"]
    assert refused and all(c["error"] == "not accepted: too many steps" for c in refused)
    assert len(seen) == len(refused)


def test_lowerable_says_why_a_schedule_would_not_run():
    fabric, d = _demand("dgx-h100-2", Collective.ALLGATHER, 1 << 26)
    sched = synthesize(fabric, [d], SynthOptions(relay=False))
    assert lowerable(sched) == ""
    assert "instances" in lowerable(sched, instances=1000)
