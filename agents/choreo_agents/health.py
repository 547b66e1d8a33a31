"""From raw hardware signals to debounced device verdicts.

``HealthMonitor`` interprets one poll: a lost GPU, a link that is down, an error counter
rising faster than its threshold, a fatal XID. ``Hysteresis`` then decides when a verdict
becomes a state change the operator hears about: a device must look bad on
``fail_after`` consecutive polls to fail, and must stay good for a hold time to recover.
Each relapse within the flap window doubles that hold time (up to ``max_hold``), so a
flapping link fails once and stays failed instead of storming the operator with
fail/recover pairs; the hold decays back after a long good spell.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from choreo_agents.backends import COUNTERS, RawHealth
from choreo_agents.model import HealthSample, Inventory
from choreo_api import Device

FATAL_XIDS = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    64: "ECC page retirement failure",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
NVLINK_XIDS = {74: "NVLink error"}

DEFAULT_THRESHOLDS = {"crc": 100.0, "replay": 100.0, "recovery": 1.0}
"""Errors per second above which a link counts as bad for that poll."""


class HealthMonitor:
    """Interprets raw polls; keeps the previous counters and recent XIDs."""

    def __init__(
        self,
        thresholds: dict[str, float] | None = None,
        xid_hold: float = 60.0,
    ) -> None:
        self.thresholds = dict(DEFAULT_THRESHOLDS, **(thresholds or {}))
        self.xid_hold = xid_hold
        self._prev: dict[Device, tuple[float, dict[str, float]]] = {}
        self._xid_until: dict[Device, tuple[float, str]] = {}
        self.rates: dict[Device, dict[str, float]] = {}

    def observe(self, inventory: Inventory, raw: RawHealth, now: float) -> HealthSample:
        sample = HealthSample()
        for gpu in inventory.gpus:
            present = raw.gpu_present.get(gpu.index, True)
            sample.mark(Device.of_gpu(gpu.index), not present, "" if present else "GPU is lost")
        for gpu_index, code in raw.xids:
            self._xid(inventory, gpu_index, code, now)
        for key, (until, reason) in list(self._xid_until.items()):
            if now >= until:
                del self._xid_until[key]
            else:
                sample.mark(key, True, reason)
        for link in inventory.links:
            key = link.device
            if link.peer.nic is not None:
                continue  # its only signal is the NIC's port: reported once, as the NIC
            up = raw.link_up.get(key, True)
            sample.mark(key, not up, "" if up else "link down")
            if key in raw.link_partial:
                sample.degraded.add(key)
            if key in raw.counters:
                self._counter_check(sample, key, raw.counters[key], now)
        for name, up in raw.nic_up.items():
            sample.mark(Device.of_nic(name), not up, "" if up else "port not ACTIVE")
        return sample

    def _xid(self, inventory: Inventory, gpu: int, code: int, now: float) -> None:
        until = now + self.xid_hold
        if code in FATAL_XIDS and 0 <= gpu < len(inventory.gpus):
            self._xid_until[Device.of_gpu(gpu)] = (until, f"XID {code}: {FATAL_XIDS[code]}")
        elif code in NVLINK_XIDS:
            for link in inventory.links:
                if link.src == gpu and link.kind in ("nvlink", "nvswitch"):
                    self._xid_until[link.device] = (until, f"XID {code}: {NVLINK_XIDS[code]}")

    def _counter_check(
        self, sample: HealthSample, key: Device, counters: dict[str, float], now: float
    ) -> None:
        prev = self._prev.get(key)
        self._prev[key] = (now, dict(counters))
        if prev is None or now <= prev[0]:
            return
        dt = now - prev[0]
        rates: dict[str, float] = {}
        for name in COUNTERS:
            if name not in counters:
                continue
            delta = counters[name] - prev[1].get(name, counters[name])
            rates[name] = max(delta, 0.0) / dt  # a reset counter reads as no errors
        self.rates[key] = rates
        over = [f"{n} errors {r:.0f}/s" for n, r in rates.items() if r > self.thresholds[n]]
        if over:
            sample.mark(key, True, ", ".join(over))


class State(StrEnum):
    GOOD = "good"
    BAD = "bad"


@dataclass(slots=True)
class _Track:
    state: State = State.GOOD
    bad_streak: int = 0
    good_since: float | None = None
    hold: float = 0.0
    last_failed: float = float("-inf")
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Transition:
    key: Device
    state: State
    reason: str


@dataclass(slots=True)
class Hysteresis:
    fail_after: int = 2
    recover_after: float = 30.0
    max_hold: float = 600.0
    flap_window: float = 600.0
    _tracks: dict[Device, _Track] = field(default_factory=dict)

    def seed_bad(self, keys: Iterable[Device], now: float, reason: str = "") -> None:
        """Start these devices failed (failures reported before a restart stay until healed)."""
        for key in keys:
            self._tracks[key] = _Track(
                State.BAD, self.fail_after, None, self.recover_after, now, reason
            )

    def state(self, key: Device) -> State:
        track = self._tracks.get(key)
        return track.state if track else State.GOOD

    def reason(self, key: Device) -> str:
        track = self._tracks.get(key)
        return track.reason if track else ""

    def bad(self) -> dict[Device, str]:
        return {k: t.reason for k, t in self._tracks.items() if t.state is State.BAD}

    def update(self, sample: HealthSample, now: float) -> list[Transition]:
        """Feed one poll; return the devices whose debounced state changed."""
        out: list[Transition] = []
        for key, obs in sample.observations.items():
            track = self._tracks.setdefault(key, _Track())
            if track.state is State.GOOD:
                if obs.bad:
                    track.bad_streak += 1
                    track.reason = obs.reason
                    if track.bad_streak >= self.fail_after:
                        self._fail(track, now)
                        out.append(Transition(key, State.BAD, obs.reason))
                else:
                    track.bad_streak = 0
                    if (
                        track.hold > self.recover_after
                        and now - track.last_failed > self.flap_window
                    ):
                        track.hold = self.recover_after  # a long good spell forgives old flaps
            elif obs.bad:
                if track.good_since is not None:  # relapse while waiting out the hold
                    track.hold = min(track.hold * 2, self.max_hold)
                track.good_since = None
                track.reason = obs.reason or track.reason
            else:
                if track.good_since is None:
                    track.good_since = now
                if now - track.good_since >= track.hold:
                    track.state = State.GOOD
                    track.bad_streak = 0
                    track.good_since = None
                    out.append(Transition(key, State.GOOD, "recovered"))
        return out

    def _fail(self, track: _Track, now: float) -> None:
        relapse = now - track.last_failed <= self.flap_window
        track.hold = (
            min(max(track.hold, self.recover_after) * 2, self.max_hold)
            if relapse
            else self.recover_after
        )
        track.state = State.BAD
        track.last_failed = now
        track.good_since = None
