"""Invalid manifests are rejected by the API server naming the field; references to nodes
that do not exist are flagged by the operator in a condition."""

from __future__ import annotations

import pytest

from choreo_dev.scenarios import badinput
from choreo_dev.scenarios.world import World

pytestmark = pytest.mark.e2e


def test_invalid_manifests_are_rejected_naming_the_field(scenario_world: World) -> None:
    outcomes = badinput.rejected(scenario_world)
    assert len(outcomes) == len(badinput.INVALID) >= 20
    accepted = [o.name for o in outcomes if not o.rejected]
    assert not accepted, f"accepted by the API server: {accepted}"
    vague = [(o.name, o.message) for o in outcomes if not o.named]
    assert not vague, f"rejections that do not name the field: {vague}"


def test_references_to_missing_nodes_are_flagged(scenario_world: World) -> None:
    w = scenario_world
    w.start_synthesizer()
    w.start_operator()
    node = w.add_nodes("bad", 1)[0]
    flagged = badinput.missing_nodes(w, node)
    applied, placed = (f.condition for f in flagged)
    assert applied["status"] == "False" and applied["reason"] == "UnknownDevice"
    assert "no-such-node" in applied["message"]
    assert placed["status"] == "False" and "stray" in placed["message"]
    assert w.stack.alive("operator"), "bad input must not crash the operator"
