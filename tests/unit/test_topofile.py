"""Topology files: schema, conveniences, error messages with field paths, round trips."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from choreo.errors import InputError
from choreo.generators import build
from choreo.topofile import (
    load_topology,
    parse_bandwidth,
    parse_duration,
    save_topology,
    topology_from_doc,
    topology_schema,
)
from choreo.topology import Link, NodeKind, Topology
from choreo.transforms import fail_links, fail_npus
from choreo.unwind import unwind


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_schema_is_valid_draft_2020_12_and_closed() -> None:
    schema = topology_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["link"]["additionalProperties"] is False


@pytest.mark.parametrize("spec", ["torus-4x4", "dgx1", "3d-rfs-16", "dgx-h100-2", "mi250"])
def test_to_dict_output_satisfies_the_schema(spec: str) -> None:
    topo = fail_links(fail_npus(build(spec), [1]), [0])
    jsonschema.validate(topo.to_dict(), topology_schema())
    jsonschema.validate(unwind(topo, 2).to_dict(), topology_schema())


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
@pytest.mark.parametrize("spec", ["dgx2-2", "3d-rfs-16", "ndv2-2"])
def test_save_load_round_trip(tmp_path: Path, spec: str, suffix: str) -> None:
    topo = fail_links(fail_npus(build(spec), [3]), [0, 5])
    path = tmp_path / f"fab{suffix}"
    save_topology(topo, path)
    again = load_topology(str(path))
    assert again == topo
    assert again.fingerprint() == topo.fingerprint()
    assert not list(tmp_path.glob(".*.tmp"))


def test_logical_links_round_trip(tmp_path: Path) -> None:
    topo = unwind(build("switch-8"), 3)
    save_topology(topo, tmp_path / "u.json")
    assert load_topology(str(tmp_path / "u.json")).links == topo.links


def test_save_rejects_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown topology file type"):
        save_topology(build("ring-4"), tmp_path / "fab.txt")
    assert not list(tmp_path.iterdir())


def test_conveniences(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "fab.yaml",
        """
name: small
npus: 3
switches: 1
defaults: {alpha: 0.5us, bandwidth: 25GB/s, bidirectional: true}
links:
  - {src: 0, dst: 1, count: 2}
  - {src: 1, dst: 2, bandwidth: 400Gbps, bidirectional: false}
  - {src: 2, dst: 3, bandwidth: 25e9, kind: nvswitch}
""",
    )
    topo = load_topology(path)
    assert topo.name == "small"
    assert topo.kinds == (NodeKind.NPU,) * 3 + (NodeKind.SWITCH,)
    assert [(x.src, x.dst) for x in topo.links] == [
        (0, 1),
        (1, 0),
        (0, 1),
        (1, 0),
        (1, 2),
        (2, 3),
        (3, 2),
    ]
    assert topo.links[0].alpha == pytest.approx(0.5e-6)
    assert topo.links[4].bandwidth == pytest.approx(50e9)
    assert topo.links[5].bandwidth == 25e9 and topo.links[5].kind == "nvswitch"


def test_json_file_with_nodes_list(tmp_path: Path) -> None:
    doc = {
        "nodes": [{"kind": "npu", "name": "a"}, {"kind": "npu", "name": "b"}],
        "links": [{"src": 0, "dst": 1, "bandwidth": 1e9}, {"src": 1, "dst": 0, "bandwidth": 1e9}],
        "dims": [2],
    }
    topo = load_topology(write(tmp_path, "ab.json", json.dumps(doc)))
    assert topo.names == ("a", "b") and topo.name == "ab" and topo.dims == (2,)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "npus: 4\nlinks:\n"
            + "".join(f"  - {{src: {i}, dst: {i + 1}, bandwidth: 1e9}}\n" for i in range(3))
            + "  - {src: 3, dst: 0, bandwidth: -5}\n",
            "fab.yaml: links[3].bandwidth: -5 is not positive",
        ),
        (
            "npus: 2\nlinks: [{src: 0, dst: 1, bandwidth: 0}]",
            "links[0].bandwidth: 0 is not positive",
        ),
        (
            "npus: 2\nlinks: [{src: 0, dst: 1, bandwidth: 1, alpha: -1}]",
            "links[0].alpha: -1 is negative",
        ),
        (
            "npus: 2\nlinks: [{src: 0, dst: 1, bandwidth: fast}]",
            "links[0].bandwidth: 'fast' is not a",
        ),
        (
            "npus: 2\nlinks: [{src: 0, dst: 1, bandwidth: 1, speed: 2}]",
            "links[0]: unknown field(s) 'speed'",
        ),
        ("npus: 2\nlinks: [{src: 0, dst: 1}]", "links[0].bandwidth: is required"),
        ("npus: 2\nlinks: [{src: 0, bandwidth: 1}]", "links[0]: 'dst' is required"),
        ("npus: 2\nlinks: [{src: 0, dst: 5, bandwidth: 1}]", "links[0].dst: node 5 does not exist"),
        (
            "npus: 2\nlinks: [{src: 1, dst: 1, bandwidth: 1}]",
            "links[0]: a link from node 1 to itself",
        ),
        ("npus: 2\nlinks: [{src: '0', dst: 1, bandwidth: 1}]", "links[0].src: expected integer"),
        ("npus: 2\nlinks: []\nfailed: [7]", "failed[0]: node 7 does not exist"),
        ("npus: 2\nlinks: []\ncolor: red", "unknown field(s) 'color'"),
        ("links: []", "'nodes' or 'npus' is required"),
        ("npus: 2\nnodes: [{}]\nlinks: []", "either 'nodes' or 'npus'"),
        ("nodes: [{kind: gpu}]\nlinks: []", "nodes[0].kind"),
        ("nodes: [{name: a}, {}]\nlinks: []", "nodes[1].name: name every node or none"),
        ("nodes: [{name: a}, {name: a}]\nlinks: []", "nodes[1].name: 'a' is already nodes[0]"),
        ("- 1\n- 2\n", "expected a mapping"),
        ("npus: 2\nlinks: [{src: 0, dst: 1", "fab.yaml:"),
        # refused before a node or link is allocated, not built until memory runs out
        ("npus: 1000000000\nlinks: []", "npus: 1,000,000,000 nodes, more than the 1,048,576"),
        ("npus: 2\nswitches: 2000000\nlinks: []", "npus: 2,000,002 nodes"),
        (
            "npus: 2\nlinks: [{src: 0, dst: 1, bandwidth: 1, bidirectional: true, "
            "count: 1000000000}]",
            "links[0].count: the links expand to 2,000,000,000 or more, more than the "
            "16,777,216",
        ),
    ],
)
def test_errors_name_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, "fab.yaml", text)
    with pytest.raises(InputError) as info:
        load_topology(path)
    assert message in str(info.value)
    assert str(info.value).startswith(path)


def test_invalid_json_names_line(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.json", '{"npus": 2,\n "links": [}')
    with pytest.raises(InputError, match=r"bad\.json:2:\d+: invalid JSON"):
        load_topology(path)


def test_spec_resolution(tmp_path: Path) -> None:
    assert load_topology("torus-4x4").name == "torus-4x4"
    with pytest.raises(InputError, match="no such file"):
        load_topology(str(tmp_path / "missing.yaml"))
    with pytest.raises(InputError, match="no such file"):
        load_topology("some/dir/fabric")
    with pytest.raises(InputError, match="unknown topology 'warpdrive-9'"):
        load_topology("warpdrive-9")
    with pytest.raises(InputError, match="empty"):
        load_topology("  ")


def test_units() -> None:
    assert parse_bandwidth("25GB/s") == 25e9
    assert parse_bandwidth("400Gbps") == 50e9
    assert parse_bandwidth("100 Gb/s") == 12.5e9
    assert parse_bandwidth("1GiB/s") == 2**30
    assert parse_bandwidth(7) == 7.0
    assert parse_duration("0.5us") == pytest.approx(0.5e-6)
    assert parse_duration("700 ns") == pytest.approx(0.7e-6)
    assert parse_duration("5e-7") == pytest.approx(5e-7)
    with pytest.raises(ValueError):
        parse_bandwidth("25 GHz")
    with pytest.raises(ValueError):
        parse_duration("-1us")


link_strategy = st.builds(
    Link,
    src=st.integers(0, 3),
    dst=st.integers(4, 6),
    alpha=st.floats(0, 1e-3),
    bandwidth=st.floats(1.0, 1e13),
    kind=st.sampled_from(["nvlink", "ib", "generic"]),
    healthy=st.booleans(),
    via=st.lists(st.integers(0, 50), max_size=3).map(tuple),
)


@settings(max_examples=40, deadline=None)
@given(links=st.lists(link_strategy, max_size=12), failed=st.sets(st.integers(0, 6)))
def test_dict_round_trip_property(links: list[Link], failed: set[int]) -> None:
    topo = Topology(
        name="prop",
        kinds=(NodeKind.NPU,) * 6 + (NodeKind.SWITCH,),
        links=tuple(links),
        failed=frozenset(failed),
    )
    doc = json.loads(json.dumps(topo.to_dict()))
    assert topology_from_doc(doc) == topo
    assert Topology.from_dict(doc) == topo


def test_the_fingerprint_tells_apart_every_field_to_dict_holds() -> None:
    """Hashed from the columns, it still changes with anything the document holds, and only
    with that: an equal fabric built again has the same one."""
    topo = build("dgx-h100-2")
    same = Topology.from_dict(topo.to_dict())
    assert same.fingerprint() == topo.fingerprint()
    first = topo.links[0]
    variants = [
        replace(topo, name="other"),
        replace(topo, links=(replace(first, alpha=first.alpha * 2), *topo.links[1:])),
        replace(topo, links=(replace(first, bandwidth=first.bandwidth / 2), *topo.links[1:])),
        replace(topo, links=(replace(first, kind=first.kind + "x"), *topo.links[1:])),
        replace(topo, links=(replace(first, dst=topo.links[1].dst), *topo.links[1:])),
        topo.with_health(frozenset(), [0]),
        topo.with_health(frozenset({1}), []),
        replace(topo, names=tuple(f"x{i}" for i in range(topo.num_nodes))),
        replace(topo, reducing=frozenset({topo.switches[0]})),
    ]
    prints = {v.fingerprint() for v in variants}
    assert len(prints) == len(variants) and topo.fingerprint() not in prints
