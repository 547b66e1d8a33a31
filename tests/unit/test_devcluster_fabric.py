"""Fabric descriptions become fake GPU Node objects with position labels."""

from __future__ import annotations

import pytest
import yaml

from choreo_dev.errors import DevClusterError
from choreo_dev.fabric import (
    GPU_RESOURCE,
    INDEX_LABEL,
    POSITION_LABEL,
    NodeSpec,
    grid,
    node_manifest,
    parse,
)


def test_grid_is_row_major_with_positions() -> None:
    specs = grid("gpu", [2, 3], 4, {"team": "x"})
    assert [s.name for s in specs] == [f"gpu-{i}" for i in range(6)]
    assert specs[4].labels[POSITION_LABEL] == "1.1"
    assert specs[4].labels["choreo.dev/fabric-dim-0"] == "1"
    assert specs[4].labels[INDEX_LABEL] == "4"
    assert specs[4].labels["team"] == "x"
    assert all(s.gpus == 4 for s in specs)


def test_explicit_nodes_with_overrides() -> None:
    doc = yaml.safe_load(
        """
        gpusPerNode: 8
        labels: {choreo.dev/fabric: rail-4}
        nodes:
          - {name: a0, position: [0, 0]}
          - {name: a1, position: [0, 1], gpus: 4, labels: {spare: true}}
        """
    )
    a0, a1 = parse(doc)
    assert (a0.gpus, a1.gpus) == (8, 4)
    assert a1.labels["choreo.dev/fabric"] == "rail-4"
    assert a1.labels[POSITION_LABEL] == "0.1"
    assert a1.labels["spare"] == "true"


def test_dims_description() -> None:
    specs = parse({"dims": [4], "namePrefix": "n", "gpusPerNode": 2})
    assert [s.name for s in specs] == ["n-0", "n-1", "n-2", "n-3"]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"nodes": []}, "non-empty `nodes`"),
        ({"nodes": [{"name": "A_B"}]}, "invalid node name"),
        ({"nodes": [{"name": "a"}, {"name": "a"}]}, "appears twice"),
        ({"nodes": [{"name": "a", "gpus": -1}]}, "non-negative integer"),
        ({"nodes": [{"name": "a", "position": "0,1"}]}, "list of integers"),
        ({"dims": [0]}, "positive integers"),
        ({"nodes": [{"name": "a", "labels": {"k": "bad value"}}]}, "not a valid label value"),
        ([1, 2], "must be a mapping"),
    ],
)
def test_bad_descriptions_are_explained(doc: object, message: str) -> None:
    with pytest.raises(DevClusterError, match=message):
        parse(doc)


def test_node_manifest_advertises_gpus_to_the_scheduler() -> None:
    node = node_manifest(NodeSpec(name="g0", gpus=8, labels={POSITION_LABEL: "3"}))
    assert node["status"]["capacity"][GPU_RESOURCE] == "8"
    assert node["status"]["allocatable"][GPU_RESOURCE] == "8"
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert node["metadata"]["labels"][POSITION_LABEL] == "3"
    assert "taints" not in node["spec"]


def test_cpu_only_node_is_not_labelled_as_gpu() -> None:
    node = node_manifest(NodeSpec(name="c0", gpus=0))
    assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "false"
