"""128 fake nodes x 8 GPUs, 20 tenants: all converge to verified schedules."""

from __future__ import annotations

import pytest

from choreo_dev.scenarios import scale
from choreo_dev.scenarios.world import World

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MIB = 1 << 20


def test_128_nodes_20_tenants_converge(scenario_world: World, scenario_seed: int) -> None:
    s = scenario_seed
    print(f"scale scenario seed {s}")
    result = scale.run(scenario_world, s, nodes=128, tenants=20, timeout=600)
    report = result.report
    assert report is not None
    print(f"converged in {result.converge_seconds:.1f} s; operator RSS "
          f"{result.operator_rss / MIB:.0f} MiB, synthesizer RSS "
          f"{result.synthesizer_rss / MIB:.0f} MiB; {report.configmaps} ConfigMaps")
    assert report.tenants == 20 and report.ok, report.problems[:10]
    assert result.gpus >= 8 * 60
    assert result.operator_rss < 1 << 30 and result.synthesizer_rss < 4 << 30
