"""docs/crds.md is generated from crds/; a change to a schema must regenerate it."""

from choreo_dev import crddoc


def test_crd_reference_is_current():
    assert crddoc.DOC.read_text() == crddoc.render(), (
        "docs/crds.md is stale: run `python -m choreo_dev.crddoc`")


def test_reference_covers_every_kind_and_rule():
    text = crddoc.render()
    for kind in ("FabricTopology", "NodeFabric", "CollectiveJob", "DeviceFailure"):
        assert f"## {kind}" in text
    assert "minBytes must not exceed maxBytes" in text
    assert "`spec.collectives[].minBytes`" in text
