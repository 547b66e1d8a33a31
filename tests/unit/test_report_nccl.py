"""Reports lead with NCCL as it runs: ``baselines.nccl``, ``nccl_choice`` and ``speedup.nccl``
in every tenant's summary, textbook single-channel algorithms named for what they are."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from choreo.bounds import lower_bound
from choreo.cli import main
from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.nccl.compare import versus, versus_nccl
from choreo.nccl.model import nccl_baseline
from choreo.report import NCCL, evaluate, known
from choreo.synth import SynthOptions, synthesize


def test_summary_names_nccl_and_its_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    assert main(["synthesize", "-t", "dgx-h100-2", "-c", "allgather", "-s", "256MiB",
                 "--out", str(tmp_path)]) == 0
    [tenant] = json.loads((tmp_path / "summary.json").read_text())["tenants"]
    fabric = build("dgx-h100-2")
    nccl = nccl_baseline(fabric, Demand(Collective.ALLGATHER, tuple(fabric.npus), 256 << 20))
    assert tenant["baselines"][NCCL] == pytest.approx(nccl.seconds)
    assert tenant["nccl_choice"].startswith(nccl.choice)
    assert tenant["speedup"][NCCL] == pytest.approx(nccl.seconds / tenant["time"])
    textbook = set(tenant["baselines"]) - {NCCL}
    assert textbook and all(name.endswith("-1ch") for name in textbook)
    out = capsys.readouterr().out
    assert "NCCL model" in out and f"vs NCCL ({nccl.choice}" in out


def test_best_textbook_baseline_leaves_nccl_out() -> None:
    fabric = build("dgx-h100-1")
    demand = Demand(Collective.ALLREDUCE, tuple(fabric.npus), 1 << 30, 8)
    [t] = evaluate(synthesize(fabric, [demand], SynthOptions(restarts=1))).tenants
    assert t.nccl_choice.startswith("nvls/")  # one NVSwitch node: NCCL runs NVLS
    best = t.best_baseline
    assert best is not None and best[0] != NCCL
    # NVLS reduces in the switch: it beats choreo's point-to-point schedule on one node, and
    # the bound (which allows in-switch reduction) stays below both
    assert t.baselines[NCCL] < t.time and t.bound <= t.baselines[NCCL]


def test_no_file_where_nccl_is_predicted_faster(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # one NVSwitch node, AllReduce 1 GiB: NCCL's NVLS reduces in the switch and wins
    args = ["synthesize", "-t", "dgx-h100-1", "-c", "allreduce", "-s", "1GiB"]
    assert main([*args, "--msccl-out", str(tmp_path / "gated")]) == 0
    assert not (tmp_path / "gated").exists()
    out = capsys.readouterr().out
    assert "no MSCCL file: NCCL (nvls/simple" in out and "predicted" in out
    # the same without the baselines still asks the NCCL model; --force writes the file
    assert main([*args, "--no-baselines", "--msccl-out", str(tmp_path / "quiet")]) == 0
    assert not (tmp_path / "quiet").exists()
    assert main([*args, "--force", "--msccl-out", str(tmp_path / "forced")]) == 0
    assert [p.name for p in (tmp_path / "forced").iterdir()] == ["tenant0-allreduce.xml"]
    # where choreo is ahead the file is written
    assert main(["synthesize", "-t", "dgx-h100-2", "-c", "allgather", "-s", "1GiB",
                 "--msccl-out", str(tmp_path / "ahead")]) == 0
    assert (tmp_path / "ahead" / "tenant0-allgather.xml").exists()


def test_a_case_choreo_refuses_is_a_row_where_nccl_runs() -> None:
    from choreo.collectives import Collective
    from choreo.generators import build
    from choreo.nccl.versus import _compared

    fabric = build("dgx-h100-32")
    row = _compared("healthy", "moe", fabric, [tuple(fabric.npus)], Collective.ALLTOALL, 1 << 24)
    assert row.measured == "no schedule (NCCL runs)" and row.ok is None
    assert "NCCL p2p/simple" in row.reference and "256 ranks x 1 chunk(s)" in row.reference


def test_the_comparison_can_use_the_portfolio_which_is_never_slower() -> None:
    """``--engine auto`` times the portfolio's schedule (which also searches the chunk
    count) against the same NCCL: never slower than greedy's, on every tenant's worst."""
    from choreo.collectives import Collective
    from choreo.generators import build
    from choreo.nccl.versus import Engine, _case

    fabric = build("dgx-h100-2")
    halves = [tuple(g for g in fabric.npus if (g % 8 < 4) == first) for first in (True, False)]
    greedy, nccl, _, _ = _case(fabric, halves, Collective.ALLGATHER, 1 << 28)
    auto, nccl_again, _, _ = _case(fabric, halves, Collective.ALLGATHER, 1 << 28,
                                   Engine("auto", 5.0))
    assert nccl_again == nccl
    assert max(auto) <= max(greedy) * (1 + 1e-9)


@pytest.mark.parametrize(("fabric_name", "sizes"), [
    ("dgx-h100-16", (64 << 20,)),  # the rail plan: the solve picks its own chunks
    ("dgx-h100-2", (1 << 24, 1 << 22)),  # two tenants: each alone, and jointly for the last
])
def test_what_judging_finds_before_the_solve_is_what_it_would_find_after(
        fabric_name: str, sizes: tuple[int, ...]) -> None:
    """``known`` is found from the demands as asked (one chunk), before the solve; judging
    the schedule with it gives every bound and NCCL comparison it gives without, though the
    schedule's demands carry other chunks. A capacity for other demands is not used."""
    fabric = build(fabric_name)
    n = len(fabric.npus) // len(sizes)
    asked = [Demand(Collective.ALLREDUCE, tuple(fabric.npus[t * n:(t + 1) * n]), size, 1,
                    name=f"t{t}") for t, size in enumerate(sizes)]
    schedule = synthesize(fabric, asked, SynthOptions(restarts=1, relay=False))
    if len(sizes) == 1:
        assert schedule.demands[0].chunks > 1  # not the demand ``known`` was found for
    found = known(fabric, asked)
    with_it = evaluate(schedule, baselines=False, found=found)
    without = evaluate(schedule, baselines=False)
    assert [(t.bound, t.bound_kind) for t in with_it.tenants] == [
        (t.bound, t.bound_kind) for t in without.tenants]
    for t, d in enumerate(schedule.demands):
        assert versus(found.nccl[t], 1e-3) == versus_nccl(fabric, d, 1e-3)
    other = replace(asked[0], size=2 * asked[0].size)
    assert lower_bound(fabric, other, known=found.alone[0]) == lower_bound(fabric, other)
    assert found.serves(schedule.demands) and not found.serves([other, *asked[1:]])
