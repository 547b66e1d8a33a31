"""The compiled cheapest-path search gives the same routes as the Python Dijkstra it replaces
for routing (which ``choreo.nccl.loads`` still uses for its settle order)."""

import pickle
import random
from collections.abc import Callable

import numpy as np
import pytest

from choreo.collectives import Collective, Demand
from choreo.errors import InputError
from choreo.generators import build
from choreo.hierarchy import hierarchical
from choreo.railgather import rail_gather
from choreo.resources import physical_paths
from choreo.routing import Router, route
from choreo.schedule import Schedule
from choreo.topology import Link, Topology
from choreo.transforms import degrade_link, fail_links, fail_npus
from choreo.verify import verify


def _python_path(router: Router, a: int, b: int) -> tuple[int, ...]:
    pred, _ = router.search(a, {b})
    hops = []
    while b != a:
        hops.append(pred[b])
        b = router.fabric.links[pred[b]].src
    return tuple(reversed(hops))


@pytest.mark.parametrize("spec", ["dgx-h100-4", "dgx-h100-16", "torus-4x4", "dragonfly-4x3", "dgx1",
                                  "3d-rfs-8", "switch2d-4x4", "dgx2-2"])
def test_engine_routes_match_the_python_search(spec: str) -> None:
    fabric = build(spec)
    router = Router(fabric, 1 << 20)
    npus = list(fabric.npus)
    rnd = random.Random(7)
    targets = {a: rnd.sample(npus, min(5, len(npus))) for a in npus}
    routes = router.paths_from(targets)
    assert len(routes) == sum(len(set(bs)) for bs in targets.values())
    for (a, b), path in routes.items():
        assert path == _python_path(router, a, b), (a, b)
        if a != b:
            assert fabric.links[path[0]].src == a and fabric.links[path[-1]].dst == b


def test_an_unreachable_target_names_both_ends() -> None:
    fabric = build("ring-4")
    cut = fabric.with_health(frozenset(), [i for i, lk in enumerate(fabric.links)
                                           if {lk.src, lk.dst} in ({0, 1}, {2, 3})])
    with pytest.raises(InputError, match="no usable path from"):
        Router(cut, 1024).paths_from({0: [1, 3], 1: [2]})


@pytest.mark.parametrize(("plan", "collective"), [
    (hierarchical, Collective.ALLREDUCE),
    (rail_gather, Collective.ALLGATHER),
])
def test_fixed_plans_keep_sends_off_other_gpus_when_a_rail_link_is_slow(
        plan: Callable[[Topology, list[Demand]], Schedule], collective: Collective) -> None:
    fabric = build("dgx-h100-3")
    gpu, rail = fabric.names.index("node0/gpu2"), fabric.names.index("sw-rail2")
    slow = degrade_link(fabric, (gpu, rail), 0.5)  # the cheapest path detours via rail 5
    assert len(route(slow, {(gpu, fabric.names.index("node1/gpu2"))}, 1 << 26)[0].links[-1]
               .via) == 6
    s = plan(slow, [Demand(collective, tuple(slow.npus), 256 << 20, 1)])
    assert verify(s).ok
    for k in set(s.link.tolist()):
        hops = s.topology.links[k].via
        assert len(hops) == 2 and not slow.is_npu(slow.links[hops[0]].dst)


@pytest.mark.parametrize("transit", [True, False])
def test_the_search_graph_is_the_fabrics_usable_out_links_in_link_order(transit: bool) -> None:
    """The router's graph, built from the fabric's link columns, is each node's usable
    out-links in link order (a failed GPU's and a broken link's left out), with the
    chunk's cost, and into an NPU's sink copy where sends may not pass through it."""
    fabric = fail_links(fail_npus(build("dgx-h100-4"), [3]), [(9, 33)])
    router = Router(fabric, 1 << 20, transit)
    n = fabric.num_nodes
    sink = [v + n if not transit and fabric.is_npu(v) else v for v in range(n)]
    want = [[(i, sink[fabric.links[i].dst], fabric.links[i].alpha
              + (1 << 20) / fabric.links[i].bandwidth)
             for i in fabric.out_links(v) if fabric.usable(i)] for v in range(n)]
    assert router.adj == want + [[] for _ in range(0 if transit else n)]


def test_a_routed_topology_carries_the_columns_its_links_give() -> None:
    fabric = fail_npus(build("dgx-h100-4"), [3])
    npus = [v for v in fabric.npus if v not in fabric.failed]
    pairs = {(a, b) for a in npus for b in npus if a != b}
    topo, _ = route(fabric, pairs, 1 << 20)
    assert len(topo.links) > len(fabric.links)
    fresh = Topology(topo.name, topo.kinds, topo.links, topo.failed, topo.names, topo.dims,
                     topo.reducing)
    for name in ("src", "dst", "alpha", "bandwidth", "usable"):
        assert np.array_equal(getattr(topo.columns, name), getattr(fresh.columns, name)), name
    assert not fresh.columns.usable[[i for i, lk in enumerate(topo.links)
                                     if 3 in (lk.src, lk.dst)]].any()
    for name in ("ptr", "links"):  # the vias: from the paths, and from a walk over the links
        assert np.array_equal(getattr(topo.vias, name), getattr(fresh.vias, name)), name


def test_a_topology_pickles_as_columns_and_comes_back_equal() -> None:
    """Service workers hand schedules to their helper process: a routed topology travels
    as columns, with its column caches, and comes back equal link for link."""
    fabric = fail_npus(build("dgx-h100-4"), [3])
    npus = [v for v in fabric.npus if v not in fabric.failed]
    topo, _ = route(fabric, {(a, b) for a in npus for b in npus if a != b}, 1 << 20)
    topo.fingerprint()
    topo.out_links(0)  # a per-node cache, rebuilt where needed rather than sent
    for original in (fabric, fabric.with_health(frozenset(), [0, 5]), topo):
        back = pickle.loads(pickle.dumps(original))
        assert back == original and back.links == original.links
        assert back.fingerprint() == original.fingerprint()
        assert back.usable_links() == original.usable_links()
        assert back.out_links(0) == original.out_links(0)
    back = pickle.loads(pickle.dumps(topo))
    assert {"columns", "vias", "_fingerprint"} <= back.__dict__.keys()
    assert "_adjacency" not in back.__dict__
    for name in ("ptr", "links"):
        assert np.array_equal(getattr(back.vias, name), getattr(topo.vias, name)), name


def _walked_path(topology: Topology, fabric: Topology, link: int) -> tuple[int, ...]:
    """What a topology link rides, a Link at a time, as the resource model defines it."""
    lk = topology.links[link]
    if lk.via:
        return lk.via
    if link < len(fabric.links):
        f = fabric.links[link]
        if (f.src, f.dst) == (lk.src, lk.dst):
            return (link,)
    return ()


@pytest.mark.parametrize("spec", ["dgx-h100-4", "torus-4x4", "dgx-h100-spine-2x2"])
def test_physical_paths_are_what_each_link_rides(spec: str) -> None:
    """Circuits ride their paths, the fabric's links themselves, a link the fabric lacks
    (one past its end, or with other ends at its index) nothing."""
    fabric = fail_npus(build(spec), [1])
    npus = [v for v in fabric.npus if v not in fabric.failed]
    topo, _ = route(fabric, {(a, b) for a in npus for b in npus if a != b}, 1 << 20)
    swapped = list(topo.links)
    swapped[0] = Link(topo.links[0].dst, topo.links[0].src, 1e-6, 1e9)  # other ends
    odd = Topology(topo.name, topo.kinds, tuple(swapped), topo.failed)
    for t in (topo, odd, fabric):
        links = np.arange(len(t.links), dtype=np.int64)[::-1].copy()
        ptr, raw = physical_paths(t, fabric, links)
        assert [tuple(raw[ptr[k]:ptr[k + 1]].tolist()) for k in range(len(links))] == [
            _walked_path(t, fabric, int(i)) for i in links]
