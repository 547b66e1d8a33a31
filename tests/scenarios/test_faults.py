"""Random GPU and link failures and recoveries, the operator and synthesizer killed and
restarted, the API server restarted once: afterwards every invariant holds."""

from __future__ import annotations

import os

import pytest

from choreo_dev.scenarios import faults
from choreo_dev.scenarios.world import World

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DURATION = float(os.environ.get("CHOREO_SCENARIO_SECONDS", "75"))


def test_chaos_leaves_every_tenant_on_a_verified_schedule(
        scenario_world: World, scenario_seed: int) -> None:
    s = scenario_seed
    print(f"faults scenario seed {s}")
    result = faults.run(scenario_world, s, DURATION)
    report = result.report
    assert report is not None
    print(f"actions {dict(result.actions)}; {result.open_faults} faults open at the end; "
          f"converged {result.converge_seconds:.1f} s after the chaos; resynthesis latency "
          f"p50 {result.quantile(0.5):.2f} s, p90 {result.quantile(0.9):.2f} s, "
          f"p99 {result.quantile(0.99):.2f} s over {result.resyntheses} resyntheses")
    assert result.actions["restart-apiserver"] == 1
    assert result.actions["kill-operator"] >= 1 and result.actions["kill-synthesizer"] >= 1
    assert result.actions["fail-gpu"] + result.actions["fail-link"] >= 5
    assert report.tenants == 4 and report.ok, report.problems[:10]
    assert result.resyntheses >= 5
