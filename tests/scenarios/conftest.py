"""Scenario tests: each module gets its own throw-away cluster (``choreo_dev.scenarios``).

They need the local control plane; without its binaries they skip, or fail when
``CHOREO_E2E_REQUIRED`` is set (as in CI). Every scenario prints its seed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from choreo_dev import testing
from choreo_dev.scenarios.world import World, world


@pytest.fixture
def scenario_seed() -> int:
    """``CHOREO_SCENARIO_SEED`` replays a run; the default is fixed so CI is repeatable."""
    return int(os.environ.get("CHOREO_SCENARIO_SEED", "20240611"))


@pytest.fixture(scope="module")
def scenario_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    testing.control_plane_binaries()
    root: Path = tmp_path_factory.mktemp("scenario")
    with world(root) as w:
        records = [*w.cluster.records().values()]
        yield w
    alive = testing.leftover_processes([*records, *(
        r for r in (w.stack.record(n) for n in w.stack.names()) if r is not None)])
    assert not alive, f"processes survived the scenario: {alive}"
