"""Scripted faults for the simulated backend: what breaks, when, and for how long.

A script is YAML (or JSON) with an ``events`` list; times are seconds after the agent
starts (numbers or strings like ``'2.5s'``, ``'500ms'``)::

    events:
      - {at: 2s, link-down: [1, 5]}          # GPU 1 <-> GPU 5, both directions
      - {at: 6s, link-up: [1, 5]}
      - {at: 3s, link-down: [0, sw-nvswitch]} # GPU 0's port on the node's switch
      - {at: 3s, gpu-lost: 3}
      - {at: 9s, gpu-back: 3}
      - {at: 4s, link-degraded: [0, 1], factor: 0.5}
      - {at: 8s, link-restored: [0, 1]}
      - {at: 5s, link-flapping: [2, 3], period: 1s, until: 15s}
      - {at: 5s, link-errors: [2, 3], counter: crc, rate: 200, until: 8s}
      - {at: 2s, nic-down: mlx5_0}
      - {at: 7s, nic-up: mlx5_0}
      - {at: 2s, xid: {gpu: 2, code: 79}}

Every problem is reported as ``script.yaml: events[3].factor: ...`` and nothing runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from choreo.topofile import parse_duration
from choreo_agents.backends import COUNTERS
from choreo_api import Device, ValidationError, problem

ACTIONS = (
    "link-down", "link-up", "gpu-lost", "gpu-back", "link-degraded", "link-restored",
    "link-flapping", "link-errors", "nic-down", "nic-up", "xid",
)  # fmt: skip


class ScriptError(ValueError):
    """A fault script that cannot be run, with the offending field named."""


@dataclass(frozen=True, slots=True)
class Event:
    at: float
    action: str
    link: Device | None = None
    gpu: int | None = None
    nic: str | None = None
    factor: float = 1.0
    period: float = 0.0
    until: float = math.inf
    counter: str = "crc"
    rate: float = 0.0
    code: int = 0


@dataclass(slots=True)
class FaultState:
    """The simulated hardware's condition at one instant."""

    lost_gpus: set[int] = field(default_factory=set)
    down_links: set[Device] = field(default_factory=set)
    degraded: dict[Device, float] = field(default_factory=dict)
    down_nics: set[str] = field(default_factory=set)
    counters: dict[Device, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Script:
    events: tuple[Event, ...] = ()

    def state_at(self, t: float) -> FaultState:
        """Replay the events up to ``t`` seconds after start."""
        state = FaultState()
        for ev in self.events:
            if ev.at > t:
                break
            _apply(state, ev, t)
        return state

    def xids_between(self, t0: float, t1: float) -> list[tuple[int, int]]:
        """XID events in (t0, t1]."""
        return [
            (e.gpu, e.code)
            for e in self.events
            if e.action == "xid" and t0 < e.at <= t1 and e.gpu is not None
        ]


def _apply(state: FaultState, ev: Event, t: float) -> None:
    a = ev.action
    if a == "gpu-lost" and ev.gpu is not None:
        state.lost_gpus.add(ev.gpu)
    elif a == "gpu-back" and ev.gpu is not None:
        state.lost_gpus.discard(ev.gpu)
    elif a == "nic-down" and ev.nic is not None:
        state.down_nics.add(ev.nic)
    elif a == "nic-up" and ev.nic is not None:
        state.down_nics.discard(ev.nic)
    elif ev.link is None:
        return
    elif a == "link-down":
        state.down_links.add(ev.link)
    elif a == "link-up":
        state.down_links.discard(ev.link)
    elif a == "link-degraded":
        state.degraded[ev.link] = ev.factor
    elif a == "link-restored":
        state.degraded.pop(ev.link, None)
    elif a == "link-flapping" and t < ev.until:
        if (t - ev.at) % ev.period < ev.period / 2:
            state.down_links.add(ev.link)
        else:
            state.down_links.discard(ev.link)
    elif a == "link-errors":
        elapsed = min(t, ev.until) - ev.at
        per_link = state.counters.setdefault(ev.link, {})
        per_link[ev.counter] = per_link.get(ev.counter, 0.0) + math.floor(ev.rate * elapsed)


def load_script(path: str | Path) -> Script:
    """Read and check a fault script file."""
    where = str(path)
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScriptError(f"{where}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ScriptError(f"{where}: not valid YAML: {exc}") from exc
    return parse_script(doc, where)


def parse_script(doc: Any, where: str = "script") -> Script:
    if doc is None:
        return Script()
    if not isinstance(doc, dict) or not isinstance(doc.get("events", []), list):
        raise ScriptError(f"{where}: expected a mapping with an 'events' list")
    unknown = set(doc) - {"events"}
    if unknown:
        raise ScriptError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    events = [_event(e, f"{where}: events[{i}]") for i, e in enumerate(doc.get("events") or [])]
    return Script(tuple(sorted(events, key=lambda e: e.at)))


def _event(doc: Any, at: str) -> Event:
    if not isinstance(doc, dict):
        raise ScriptError(f"{at}: expected a mapping like {{at: 2s, link-down: [1, 5]}}")
    actions = [k for k in doc if k in ACTIONS]
    if len(actions) != 1:
        raise ScriptError(f"{at}: needs exactly one of {', '.join(ACTIONS)}")
    action = actions[0]
    allowed = {"at", action, *_EXTRA.get(action, ())}
    extra = set(doc) - allowed
    if extra:
        raise ScriptError(f"{at}: unexpected key(s) {', '.join(sorted(map(str, extra)))}")
    if "at" not in doc:
        raise ScriptError(f"{at}.at: missing (seconds after start, e.g. 2s)")
    when = _seconds(doc["at"], f"{at}.at")
    value = doc[action]
    kw: dict[str, Any] = {"at": when, "action": action}
    if action in ("gpu-lost", "gpu-back"):
        kw["gpu"] = _index(value, f"{at}.{action}")
    elif action in ("nic-down", "nic-up"):
        if not isinstance(value, str) or not value:
            raise ScriptError(f"{at}.{action}: expected a NIC name such as mlx5_0")
        kw["nic"] = value
    elif action == "xid":
        if not isinstance(value, dict) or set(value) != {"gpu", "code"}:
            raise ScriptError(f"{at}.xid: expected {{gpu: N, code: XID}}")
        kw["gpu"] = _index(value["gpu"], f"{at}.xid.gpu")
        kw["code"] = _index(value["code"], f"{at}.xid.code")
    else:
        kw["link"] = parse_link(value, f"{at}.{action}")
    if action == "link-degraded":
        factor = doc.get("factor")
        if not isinstance(factor, int | float) or isinstance(factor, bool) or not 0 < factor <= 1:
            raise ScriptError(f"{at}.factor: expected the bandwidth fraction left, in (0, 1]")
        kw["factor"] = float(factor)
    if action == "link-flapping":
        kw["period"] = _seconds(doc.get("period"), f"{at}.period", positive=True)
    if "until" in doc:
        kw["until"] = _seconds(doc["until"], f"{at}.until")
        if kw["until"] <= when:
            raise ScriptError(f"{at}.until: must be later than at ({when:g} s)")
    if action == "link-errors":
        counter = doc.get("counter", "crc")
        if counter not in COUNTERS:
            raise ScriptError(f"{at}.counter: expected one of {', '.join(COUNTERS)}")
        rate = doc.get("rate")
        if not isinstance(rate, int | float) or isinstance(rate, bool) or rate <= 0:
            raise ScriptError(f"{at}.rate: expected errors per second > 0")
        kw["counter"], kw["rate"] = counter, float(rate)
    return Event(**kw)


_EXTRA = {
    "link-degraded": ("factor",),
    "link-flapping": ("period", "until"),
    "link-errors": ("counter", "rate", "until"),
}


def parse_link(value: Any, at: str) -> Device:
    """``[1, 5]`` (two GPUs), ``[0, sw-nvswitch]`` (GPU to a switch) or ``"1-5"``."""
    if isinstance(value, str) and value.count("-") == 1 and value.replace("-", "").isdigit():
        value = [int(x) for x in value.split("-")]
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        raise ScriptError(f"{at}: expected [gpu, peer gpu or switch name]")
    src = _index(value[0], f"{at}[0]")
    far = value[1]
    try:
        if isinstance(far, int) and not isinstance(far, bool):
            if far == src:
                raise ScriptError(f"{at}: a link joins two different GPUs")
            return Device.link(src, gpu=_index(far, f"{at}[1]"))
        if isinstance(far, str) and far:
            return Device.link(src, switch=far)
    except ValidationError as err:
        raise ScriptError(f"{at}: {problem(err)}") from err
    raise ScriptError(f"{at}[1]: expected a GPU index or a switch name")


def _index(value: Any, at: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ScriptError(f"{at}: expected a non-negative integer, got {value!r}")
    return value


def _seconds(value: Any, at: str, positive: bool = False) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise ScriptError(f"{at}: {exc}") from exc
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        raise ScriptError(f"{at}: expected a {'positive' if positive else 'non-negative'} time")
    return seconds
