"""The `choreo-dev` command line turns flags and fabric files into node specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from choreo_dev.cli import build_parser, node_specs
from choreo_dev.errors import DevClusterError
from choreo_dev.fabric import POSITION_LABEL


def test_dims_and_labels_from_flags() -> None:
    specs = node_specs(None, dims="2x2", gpus=4, prefix="n", labels=["team=a"])
    assert [s.name for s in specs] == ["n-0", "n-1", "n-2", "n-3"]
    assert specs[3].labels[POSITION_LABEL] == "1.1"
    assert specs[3].labels["team"] == "a"
    assert specs[3].gpus == 4


def test_fabric_file(tmp_path: Path) -> None:
    path = tmp_path / "fabric.yaml"
    path.write_text("nodes:\n  - {name: x0, position: [2]}\n")
    (spec,) = node_specs(str(path))
    assert spec.name == "x0" and spec.labels[POSITION_LABEL] == "2"


def test_missing_and_broken_fabric_files_are_explained(tmp_path: Path) -> None:
    with pytest.raises(DevClusterError, match="does not exist"):
        node_specs(str(tmp_path / "nope.yaml"))
    broken = tmp_path / "broken.yaml"
    broken.write_text("nodes: [\n")
    with pytest.raises(DevClusterError, match="is not YAML"):
        node_specs(str(broken))


def test_parser_knows_every_command() -> None:
    parser = build_parser()
    for argv in (
        ["build", "--only", "etcd"],
        ["cluster", "up", "--nodes", "8", "--no-build"],
        ["cluster", "down"],
        ["cluster", "status"],
        ["cluster", "env"],
        ["cluster", "wipe"],
        ["nodes", "add", "--dims", "4x2", "--label", "a=b"],
        ["nodes", "fail", "n-0"],
        ["nodes", "recover", "n-0"],
        ["nodes", "list"],
        ["kubectl", "get", "nodes"],
        ["bench"],
    ):
        assert callable(parser.parse_args(argv).func)
    with pytest.raises(SystemExit):
        parser.parse_args(["nodes", "add", "--count", "2", "--dims", "2x1"])


@pytest.mark.parametrize("gap", ["-1", "601", "nan"])
def test_operator_bench_refuses_a_failure_gap_out_of_range(
        gap: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before any cluster starts, naming the option."""
    from choreo_dev import operator_bench

    assert operator_bench.main(["--failure-gap", gap]) == 2
    assert "--failure-gap must be between 0 and 600 seconds" in capsys.readouterr().err
