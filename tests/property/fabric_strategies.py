"""A hypothesis strategy for random connected fabrics, shared by the property tests."""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
import numpy as np
from hypothesis import strategies as st

from choreo.topology import Link, NodeKind, Topology


@st.composite
def fabrics(draw: st.DrawFn, alphas: Sequence[float] = (0.0, 0.5e-6, 2e-6),
            bandwidths: Sequence[float] = (12.5e9, 50e9, 200e9),
            port_alphas: Sequence[float] = (0.5e-6,),
            port_bandwidths: Sequence[float] = (25e9,)) -> Topology:
    """A random connected NPU graph with heterogeneous duplex links (and maybe a switch with
    up to four NPUs), each link's alpha and bandwidth drawn from the given values."""
    n = draw(st.integers(3, 10))
    seed = draw(st.integers(0, 2**31 - 1))
    extra = draw(st.floats(0.0, 0.6))
    rng = np.random.default_rng(seed)
    tree = nx.random_labeled_tree(n, seed=seed)
    edges = set(tree.edges()) | {
        (a, b) for a in range(n) for b in range(a + 1, n) if rng.random() < extra
    }
    links: list[Link] = []
    for a, b in sorted(edges):
        alpha = float(rng.choice(alphas))
        bw = float(rng.choice(bandwidths))
        links += [Link(a, b, alpha, bw, "nvlink"), Link(b, a, alpha, bw, "nvlink")]
    kinds = [NodeKind.NPU] * n
    if draw(st.booleans()):
        sw = n
        kinds.append(NodeKind.SWITCH)
        for v in sorted(rng.choice(n, size=min(n, 4), replace=False).tolist()):
            alpha, bw = float(rng.choice(port_alphas)), float(rng.choice(port_bandwidths))
            links += [Link(v, sw, alpha, bw, "ib"), Link(sw, v, alpha, bw, "ib")]
    return Topology("random", tuple(kinds), tuple(links))
