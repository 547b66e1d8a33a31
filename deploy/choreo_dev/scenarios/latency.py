"""The operator's resynthesis-latency histogram, summed over every operator process.

A killed operator takes its counters with it, so a sampler thread scrapes ``/metrics`` once
a second and keeps the last scrape of each process (by PID); the distribution reported is
the sum of those. Samples recorded after the last scrape of a killed process are lost, so
the count is a lower bound.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

FAMILY = "choreo_resynthesis_latency_seconds"


def parse_buckets(text: str) -> dict[float, float]:
    """``le`` -> cumulative count of the histogram in Prometheus text format."""
    out: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith(f"{FAMILY}_bucket{{"):
            continue
        head, _, value = line.rpartition(" ")
        le = head.split('le="', 1)[1].split('"', 1)[0]
        out[math.inf if le == "+Inf" else float(le)] = float(value)
    return out


def quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus' ``histogram_quantile``: linear within the bucket holding rank q."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return math.nan
    rank, prev_bound, prev_count = q * total, 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return prev_bound
            width = count - prev_count
            return prev_bound + (le - prev_bound) * ((rank - prev_count) / width if width else 1)
        prev_bound, prev_count = le, count
    return prev_bound


@dataclass
class Sampler:
    """Scrapes ``fetch()`` (the operator's /metrics) every ``period`` seconds in a thread."""

    fetch: Callable[[], str]
    pid: Callable[[], int | None]
    period: float = 1.0
    last: dict[int, dict[float, float]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        pid = self.pid()
        if pid is None:
            return
        with contextlib.suppress(OSError, ValueError, IndexError):
            buckets = parse_buckets(self.fetch())
            if buckets:
                self.last[pid] = buckets

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self.sample()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="latency-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sample()

    def total(self) -> dict[float, float]:
        out: dict[float, float] = {}
        for buckets in self.last.values():
            for le, count in buckets.items():
                out[le] = out.get(le, 0.0) + count
        return out
