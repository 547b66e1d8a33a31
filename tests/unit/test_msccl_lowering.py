"""Every built-in topology (small instances) x every collective x every runtime: the lowered
files (one per kind of call the runtime needs) pass the validator and the interpreter proves
they compute the collective for both in-place and out-of-place calls."""

from __future__ import annotations

import pytest
from msccl_helpers import schedule

from choreo.collectives import Collective
from choreo.errors import InputError
from choreo.msccl import run, to_xml, validate
from choreo.msccl.layout import DIALECTS, file_kinds

TOPOLOGIES = ["ring-8", "uniring-6", "fc-8", "mesh-3x3", "torus-4x4", "hypercube-2x2x2",
              "switch-8", "switch2d-4x2", "3d-rfs-16", "dragonfly-4x5", "dgx1", "dgx2",
              "ndv2-2", "dgx-h100-2", "mi250"]
LEGACY_MISSING = {Collective.GATHER, Collective.SCATTER}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("collective", [c.value for c in Collective])
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_lowered_file_is_valid_and_computes_the_collective(topology: str, collective: str,
                                                           dialect: str) -> None:
    coll = Collective(collective)
    root = 1 if coll.rooted else 0
    sched = schedule(topology, collective, 1, root)
    if dialect == "legacy" and coll in LEGACY_MISSING:
        with pytest.raises(InputError, match="legacy runtime has no"):
            to_xml(sched, dialect=dialect)
        return
    served = []
    for kind in file_kinds(coll, dialect):
        xml = to_xml(sched, dialect=dialect, calls=kind)
        assert validate(xml) == []
        result = run(xml)
        assert result.ok, str(result)
        served += result.modes
        assert not xml.lstrip().startswith("<?xml")
    expected = ["out-of-place"] + ([] if coll is Collective.ALLTOALL else ["in-place"])
    assert sorted(served) == sorted(expected)


@pytest.mark.parametrize("collective", [c.value for c in Collective])
@pytest.mark.parametrize("topology", ["ring-8", "dgx1", "torus-4x4"])
def test_several_chunks_and_instances(topology: str, collective: str) -> None:
    sched = schedule(topology, collective, 2, 0)
    xml = to_xml(sched, instances=2)
    assert validate(xml) == []
    result = run(xml, root=0)
    assert result.ok, str(result)


@pytest.mark.parametrize("root", [0, 3])
@pytest.mark.parametrize("collective", ["broadcast", "reduce", "gather", "scatter"])
def test_rooted_collectives_check_the_root_they_were_built_for(collective: str,
                                                               root: int) -> None:
    xml = to_xml(schedule("ring-8", collective, 1, root))
    assert run(xml).ok
    assert run(xml, root=root).ok
    wrong = run(xml, root=(root + 1) % 8)
    assert not wrong.ok
