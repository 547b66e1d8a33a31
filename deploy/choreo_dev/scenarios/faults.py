"""Faults scenario: random GPU and link failures and recoveries through the simulated agents,
the operator and the synthesizer killed (SIGKILL) and restarted at random moments, the API
server restarted once; then every invariant must hold (``invariants.check``).

Randomness comes from one seeded generator, so a seed replays the same sequence of actions
(their timing still depends on the machine).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from choreo_dev.observe import GROUP
from choreo_dev.scenarios import invariants
from choreo_dev.scenarios.latency import Sampler, quantile
from choreo_dev.scenarios.world import World, wait
from choreo_dev.stack import AgentOptions

GPUS = 8
MAX_OPEN_FAULTS = 6  # so every tenant keeps at least two healthy GPUs


@dataclass
class FaultsResult:
    seed: int
    duration: float
    actions: Counter[str] = field(default_factory=Counter)
    log: list[tuple[float, str]] = field(default_factory=list)
    open_faults: int = 0
    converge_seconds: float = 0.0
    latency_buckets: dict[float, float] = field(default_factory=dict)
    report: invariants.Report | None = None

    def quantile(self, q: float) -> float:
        return quantile(q, self.latency_buckets)

    @property
    def resyntheses(self) -> int:
        return int(max(self.latency_buckets.values(), default=0))


class Chaos:
    """Injects one random action at a time and remembers what is broken."""

    def __init__(self, w: World, rng: random.Random, scripts: Path, say: Callable[[str], None]):
        self.w, self.rng, self.scripts, self.say = w, rng, scripts, say
        self.events: dict[str, list[dict[str, Any]]] = {n: [] for n in w.agents}
        self.broken: set[tuple[str, str, int]] = set()  # (node, "gpu"|"link", gpu)
        self.down: dict[str, float] = {}  # process -> when to restart it
        self.apiserver_restarted = False

    def script(self, node: str) -> Path:
        return self.scripts / f"{node}.yaml"

    def _append(self, node: str, event: dict[str, Any]) -> None:
        self.events[node].append({"at": "0s", **event})
        path, tmp = self.script(node), self.script(node).with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump({"events": self.events[node]}, default_flow_style=None))
        tmp.replace(path)

    def fault(self) -> str:
        """Break a random GPU or NVSwitch port, or (40%, or when enough are broken) mend one."""
        if self.broken and (len(self.broken) >= MAX_OPEN_FAULTS or self.rng.random() < 0.4):
            node, kind, gpu = self.rng.choice(sorted(self.broken))
            self._append(node, {"gpu-back": gpu} if kind == "gpu"
                         else {"link-up": [gpu, "sw-nvswitch"]})
            self.broken.discard((node, kind, gpu))
            return f"recover-{kind}"
        node = self.rng.choice(sorted(self.w.agents))
        gpu = self.rng.randrange(GPUS)
        kind = self.rng.choice(("gpu", "link"))
        key = (node, kind, gpu)
        if key in self.broken:
            return "skip"
        self._append(node, {"gpu-lost": gpu} if kind == "gpu"
                     else {"link-down": [gpu, "sw-nvswitch"]})
        self.broken.add(key)
        return f"fail-{kind}"

    def reported(self, open_names: set[str]) -> bool:
        """The open DeviceFailures are the faults still open. An agent reports only the root
        cause, so the port of a lost GPU may or may not have a failure of its own."""
        lost = {(node, gpu) for node, kind, gpu in self.broken if kind == "gpu"}
        name = {(node, kind, gpu): f"{node}-gpu{gpu}" if kind == "gpu"
                else f"{node}-link-{gpu}-sw-nvswitch" for node, kind, gpu in self.broken}
        must = {n for (node, kind, gpu), n in name.items()
                if kind == "gpu" or (node, gpu) not in lost}
        may = set(name.values()) | {f"{node}-link-{gpu}-sw-nvswitch" for node, gpu in lost}
        return must <= open_names <= may

    def crash(self, name: str) -> str:
        if name in self.down or not self.w.stack.alive(name):
            return "skip"
        self.w.kill(name)
        self.down[name] = time.monotonic() + self.rng.uniform(1.0, 4.0)
        return f"kill-{name}"

    def restarts(self, force: bool = False) -> list[str]:
        done = []
        for name, when in sorted(self.down.items()):
            if force or time.monotonic() >= when:
                if name == "synthesizer":
                    self.w.start_synthesizer()
                else:
                    self.w.start_operator()
                del self.down[name]
                done.append(f"restart-{name}")
        return done

    def restart_apiserver(self) -> str:
        started = time.monotonic()
        self.w.cluster.restart("kube-apiserver")
        self.apiserver_restarted = True
        self.say(f"kube-apiserver restarted, ready again after {time.monotonic() - started:.1f} s")
        return "restart-apiserver"

    def step(self) -> str:
        roll = self.rng.random()
        if roll < 0.8:
            return self.fault()
        return self.crash("operator" if roll < 0.9 else "synthesizer")


def open_failures(w: World) -> set[str]:
    items = w.client.get(f"{GROUP}/devicefailures")["items"]
    return {d["metadata"]["name"] for d in items if not d["spec"].get("resolved")}


def setup(w: World, nodes: int, tenants: int, scripts: Path) -> list[str]:
    """``nodes`` nodes with sim agents, and ``tenants`` tenants over ``nodes // tenants`` each."""
    names = w.add_nodes("chaos", nodes)
    w.fabric_topology("chaos", names)
    scripts.mkdir(parents=True, exist_ok=True)
    options = AgentOptions(fabric=f"dgx-h100-{nodes}", namespace=w.namespace("choreo-system"),
                           poll=0.25, recover_after=1.0)
    for i, node in enumerate(names):
        (scripts / f"{node}.yaml").write_text("events: []\n")
        w.start_agent(node, i, options, scripts / f"{node}.yaml")
    ns = w.namespace("chaos")
    per = nodes // tenants
    colls = ("allreduce", "allgather", "reducescatter")
    for t in range(tenants):
        w.tenant(ns, f"t{t}", names[t * per:(t + 1) * per], colls[t % len(colls)], 1 << 27)
    return names


def run(w: World, seed: int, duration: float, nodes: int = 8, tenants: int = 4,
        say: Callable[[str], None] = print, converge_timeout: float = 180.0) -> FaultsResult:
    rng = random.Random(seed)
    result = FaultsResult(seed, duration)
    scripts = w.root / "faults"
    w.start_synthesizer()
    w.start_operator()
    setup(w, nodes, tenants, scripts)
    wait(lambda: not invariants.converged(w.client), 180, "every tenant's first schedule", w)
    say(f"{tenants} tenants on {nodes} nodes converged; injecting faults for {duration:.0f} s "
        f"(seed {seed})")
    sampler = Sampler(w.operator_metrics, lambda: w.stack.pid("operator")
                      if w.stack.alive("operator") else None)
    sampler.start()
    chaos = Chaos(w, rng, scripts, say)
    start = time.monotonic()
    apiserver_at = start + rng.uniform(0.3, 0.6) * duration
    # each crash happens at least once, at a random moment of the first two thirds
    crash_at = {name: start + rng.uniform(0.1, 0.66) * duration
                for name in ("operator", "synthesizer")}
    try:
        while time.monotonic() - start < duration:
            actions = chaos.restarts()
            if not chaos.apiserver_restarted and time.monotonic() >= apiserver_at:
                actions.append(chaos.restart_apiserver())
            for name, when in list(crash_at.items()):
                if time.monotonic() >= when and name not in chaos.down:
                    actions.append(chaos.crash(name))
                    del crash_at[name]
            actions.append(chaos.step())
            for a in actions:
                if a != "skip":
                    result.actions[a] += 1
                    result.log.append((round(time.monotonic() - start, 2), a))
            time.sleep(rng.uniform(0.3, 2.0))
        for a in chaos.restarts(force=True):
            result.actions[a] += 1
        result.open_faults = len(chaos.broken)
        say(f"chaos over: {sum(result.actions.values())} actions, {result.open_faults} faults "
            "left open; waiting for the operator to catch up")
        settled = time.monotonic()
        # The agents first: a fault injected last is reported within two polls, a mended
        # device only after its hold (doubled on every relapse), so the API shows exactly
        # the faults left open before the operator can be expected to match them.
        wait(lambda: chaos.reported(open_failures(w)), converge_timeout,
             f"the agents to report exactly the {len(chaos.broken)} faults left open", w,
             interval=1.0)
        wait(lambda: not invariants.converged(w.client), converge_timeout,
             "every tenant to converge on the current fabric", w, interval=1.0)
        result.converge_seconds = time.monotonic() - settled
    finally:
        sampler.stop()
    result.latency_buckets = sampler.total()
    result.report = invariants.check(w.client)
    return result
