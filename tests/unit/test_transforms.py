"""Failures, degradation, tenant views and the --fail syntax."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from choreo.errors import InputError
from choreo.generators import build
from choreo.transforms import (
    Failure,
    apply_failures,
    degrade_link,
    fail_links,
    fail_npus,
    link_between,
    parse_failures,
    restrict,
)


def test_fail_npus_keeps_ids_and_links() -> None:
    topo = build("mesh-4x4")
    after = fail_npus(topo, [7, 9])
    assert after.failed == {7, 9}
    assert after.links == topo.links and after.kinds == topo.kinds
    assert 7 not in after.npus and len(after.npus) == 14
    assert not any(after.usable(i) for i in after.out_links(7))
    after.check_connected(after.npus)  # TACOS' asymmetric example stays connected


def test_fail_npus_by_name_and_rejects_switches() -> None:
    topo = build("dgx-h100-2")
    assert fail_npus(topo, ["node1/gpu3"]).failed == {11}
    with pytest.raises(InputError, match="is a switch, not an NPU"):
        fail_npus(topo, [16])
    with pytest.raises(InputError, match="node 99 does not exist"):
        fail_npus(topo, [99])


def test_fail_link_pair_fails_both_directions_and_parallel_links() -> None:
    topo = build("dgx1")
    after = fail_links(topo, [(0, 1)])
    bad = [i for i, link in enumerate(after.links) if not link.healthy]
    assert len(bad) == 4  # a double NVLink, both directions
    assert {(after.links[i].src, after.links[i].dst) for i in bad} == {(0, 1), (1, 0)}
    assert after.ingress_bandwidth(0) == pytest.approx(4 * 25e9)


def test_fail_link_by_index_only_touches_that_link() -> None:
    topo = build("ring-4")
    after = fail_links(topo, [2])
    assert [link.healthy for link in after.links].count(False) == 1
    assert not after.links[2].healthy


def test_fail_links_errors() -> None:
    topo = build("ring-4")
    with pytest.raises(InputError, match="no link between npu0 and npu2"):
        fail_links(topo, [(0, 2)])
    with pytest.raises(InputError, match="link 8 does not exist"):
        fail_links(topo, [8])


def test_failing_a_cut_disconnects() -> None:
    topo = fail_links(build("ring-4"), ["0-1", "2-3"])
    with pytest.raises(InputError, match="disconnected"):
        topo.check_connected(topo.npus)


def test_degrade_link() -> None:
    topo = build("torus-4x4")
    after = degrade_link(topo, (1, 2), 0.5)
    assert [link.bandwidth for link in link_between(after, 1, 2)] == [25e9]
    assert [link.bandwidth for link in link_between(after, 2, 1)] == [25e9]
    assert sum(link.bandwidth for link in after.links) == pytest.approx(
        sum(link.bandwidth for link in topo.links) - 50e9
    )
    with pytest.raises(InputError, match=r"factor must be in \(0, 1\]"):
        degrade_link(topo, (1, 2), 1.5)


def test_restrict_without_relay() -> None:
    topo = build("ring-8")
    view = restrict(topo, [0, 1, 2, 3], relay=False)
    assert all(view.links[i].healthy == (i in view.usable_links()) for i in range(len(view.links)))
    usable = {(view.links[i].src, view.links[i].dst) for i in view.usable_links()}
    assert usable == {(0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2)}
    view.check_connected([0, 1, 2, 3])
    split = restrict(topo, [0, 4], relay=False)
    with pytest.raises(InputError, match="no usable links"):
        split.check_connected([0, 4])


def test_restrict_with_relay_keeps_the_fabric_and_switches_still_forward() -> None:
    topo = build("ring-8")
    assert restrict(topo, [0, 4], relay=True) == topo
    sw = build("switch-8")
    view = restrict(sw, [0, 5], relay=False)
    view.check_connected([0, 5])
    assert len(view.usable_links()) == 4
    with pytest.raises(InputError, match="tenant NPU 8"):
        restrict(sw, [0, 8], relay=False)
    with pytest.raises(InputError, match="no NPUs"):
        restrict(sw, [], relay=True)


def test_parse_failures() -> None:
    items = parse_failures("npu:7, link:3-4,degrade:1-2:0.5,link:17")
    assert items == [
        Failure("npu", "7"),
        Failure("link", "3-4"),
        Failure("degrade", "1-2", 0.5),
        Failure("link", "17"),
    ]
    assert [str(f) for f in items] == ["npu:7", "link:3-4", "degrade:1-2:0.5", "link:17"]
    assert parse_failures("") == []


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("gpu:3", "'gpu:3' is not one of"),
        ("npu:", "'npu:' is not one of"),
        ("degrade:1-2", "needs a factor"),
        ("degrade:1-2:0", "needs a factor"),
        ("degrade:1-2:x", "needs a factor"),
    ],
)
def test_parse_failures_errors(text: str, needle: str) -> None:
    with pytest.raises(InputError) as info:
        parse_failures(text)
    assert needle in str(info.value) and str(info.value).startswith("--fail:")


def test_apply_failures_resolves_names_and_reports_bad_items() -> None:
    topo = build("dgx-h100-2")
    after = apply_failures(topo, "npu:node0/gpu1,link:node1/gpu0-sw-rail0")
    assert after.failed == {1}
    rail0 = topo.names.index("sw-rail0")
    assert all(not link.healthy for link in link_between(after, 8, rail0))
    with pytest.raises(InputError, match="--fail: npu:node9/gpu0: no node named"):
        apply_failures(topo, "npu:node9/gpu0")
    with pytest.raises(InputError, match="--fail: link:0-9: no link between"):
        apply_failures(topo, "link:0-9")


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_transforms_preserve_ids_and_indices(data: st.DataObject) -> None:
    topo = build(data.draw(st.sampled_from(["torus-4x4", "dgx1", "3d-rfs-16", "dragonfly-4x5"])))
    npus = data.draw(st.sets(st.sampled_from(topo.npus), max_size=3))
    links = data.draw(st.sets(st.integers(0, len(topo.links) - 1), max_size=5))
    after = fail_links(fail_npus(topo, npus), links)
    assert after.kinds == topo.kinds and len(after.links) == len(topo.links)
    assert [(x.src, x.dst, x.bandwidth) for x in after.links] == [
        (x.src, x.dst, x.bandwidth) for x in topo.links
    ]
    assert set(after.usable_links()) <= set(topo.usable_links()) - links
    assert all(not after.usable(i) for i in range(len(after.links)) if after.links[i].src in npus)
