"""When to probe and when to retry: staggered periodic probes and exponential backoff.

Measuring links loads them, so a DaemonSet that starts on a thousand nodes at once must
not measure a thousand nodes at once. Each node's first probe is offset by a fraction of
the startup window derived from a hash of its name (stable across restarts, spread
uniformly across nodes), and every later interval is jittered by a few percent so nodes
that happen to align drift apart.
"""

from __future__ import annotations

import hashlib
import random


def node_fraction(node: str) -> float:
    """A stable number in [0, 1) per node name."""
    return int.from_bytes(hashlib.sha256(node.encode()).digest()[:8], "big") / 2.0**64


class ProbeSchedule:
    def __init__(
        self, node: str, interval: float, start: float, jitter: float = 0.1, window: float = 30.0
    ) -> None:
        self.interval = interval
        self.jitter = jitter
        self.offset = node_fraction(node) * min(window, interval)
        self.next_at = start + self.offset
        self._rng = random.Random(node)

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def done(self, now: float) -> None:
        spread = 1.0 + self.jitter * (2.0 * self._rng.random() - 1.0)
        self.next_at = now + self.interval * spread


class Backoff:
    """Exponential backoff with full jitter after failures; immediate after a success."""

    def __init__(
        self, initial: float = 0.5, maximum: float = 30.0, seed: int | None = None
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self.failures = 0
        self.not_before = float("-inf")
        self._rng = random.Random(seed)

    def ready(self, now: float) -> bool:
        return now >= self.not_before

    def failed(self, now: float) -> float:
        """Record a failure; return the delay before the next attempt."""
        self.failures += 1
        cap = min(self.maximum, self.initial * 2.0 ** (self.failures - 1))
        delay = cap / 2 + self._rng.random() * cap / 2
        self.not_before = now + delay
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self.not_before = float("-inf")
