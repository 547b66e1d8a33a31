"""Scale scenario: 128 fake 8-GPU nodes in one rail fabric and 20 tenants of random size,
collective and largest message size, created at once; every tenant must converge to a
verified schedule. Reports the time to converge and the resident memory of the operator and
the synthesizer (with its worker processes), by PID.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from choreo_dev.scenarios import invariants
from choreo_dev.scenarios.world import World, wait
from choreo_operator.reconciler import Settings

# Largest sizes per collective: a pod's part of the MSCCL files must fit in one ConfigMap
# (1 MiB), and larger messages mean more chunks, so more XML (256 MiB AllReduce over 48 GPUs
# or 1 GiB AllGather over 80 do not fit; the operator then reports ScheduleTooLarge).
SIZES = {"allreduce": (1 << 24, 1 << 25), "allgather": (1 << 26, 1 << 28),
         "reducescatter": (1 << 26, 1 << 28)}
MAX_NODES = 8  # per tenant (64 GPUs), for the same reason


@dataclass
class ScaleResult:
    seed: int
    nodes: int
    tenants: int
    gpus: int = 0
    sizes: list[int] = field(default_factory=list)
    converge_seconds: float = 0.0
    operator_rss: int = 0
    synthesizer_rss: int = 0
    report: invariants.Report | None = None


def layout(rng: random.Random, nodes: int, tenants: int) -> list[int]:
    """Nodes per tenant: random, 2 to ``MAX_NODES`` each, together at most ``nodes``."""
    sizes = [2] * tenants
    spare = nodes - 2 * tenants
    if spare < 0:
        raise ValueError(f"{tenants} tenants need at least {2 * tenants} nodes")
    for _ in range(spare):
        t = rng.randrange(tenants)
        if rng.random() < 0.9 and sizes[t] < MAX_NODES:
            sizes[t] += 1
    return sizes


def run(w: World, seed: int, nodes: int = 128, tenants: int = 20,
        say: Callable[[str], None] = print, timeout: float = 600.0) -> ScaleResult:
    rng = random.Random(seed)
    result = ScaleResult(seed, nodes, tenants)
    names = w.add_nodes("scale", nodes)
    w.fabric_topology("scale", names)
    w.start_synthesizer()
    w.start_operator(["--timeout", "300"])
    ns = w.namespace("scale")
    result.sizes = layout(rng, nodes, tenants)
    result.gpus = 8 * sum(result.sizes)
    say(f"{tenants} tenants over {sum(result.sizes)} of {nodes} nodes ({result.gpus} GPUs), "
        f"sizes {result.sizes} (seed {seed})")
    started = time.monotonic()
    at = 0
    for t, size in enumerate(result.sizes):
        collective = rng.choice(sorted(SIZES))
        w.tenant(ns, f"t{t:02d}", names[at:at + size], collective, rng.choice(SIZES[collective]))
        at += size
    settings = _settings()
    wait(lambda: not invariants.converged(w.client, settings), timeout,
         f"all {tenants} tenants to converge", w, interval=1.0)
    result.converge_seconds = time.monotonic() - started
    result.operator_rss = w.stack.rss_bytes("operator")
    result.synthesizer_rss = w.stack.rss_bytes("synthesizer")
    say(f"converged in {result.converge_seconds:.1f} s; verifying every schedule")
    result.report = invariants.check(w.client, settings)
    return result


def _settings() -> Settings:
    """The planning settings of an operator started with ``--timeout 300``."""
    return Settings(call_timeout_seconds=300.0)
