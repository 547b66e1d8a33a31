"""Coalescing bursts of events into one reconciliation round.

A round starts once no new event arrived for ``quiet`` seconds, or ``max_delay`` seconds
after the first event of the burst, whichever comes first: 20 DeviceFailures created within
a second become one round, yet a steady trickle cannot starve the operator.
"""

from __future__ import annotations

import asyncio
import time


class Debouncer:
    def __init__(self, quiet: float = 0.1, max_delay: float = 2.0) -> None:
        self.quiet = quiet
        self.max_delay = max_delay
        self._event = asyncio.Event()
        self._first: float | None = None
        self._last = 0.0
        self.reasons: set[str] = set()

    def poke(self, reason: str) -> None:
        now = time.monotonic()
        if self._first is None:
            self._first = now
        self._last = now
        self.reasons.add(reason)
        self._event.set()

    async def wait(self) -> tuple[set[str], float]:
        """Wait for a settled burst; return its reasons and the wall time of its first event."""
        await self._event.wait()
        while True:
            assert self._first is not None
            now = time.monotonic()
            due = min(self._last + self.quiet, self._first + self.max_delay)
            if now >= due:
                break
            await asyncio.sleep(due - now)
        first_wall = time.time() - (time.monotonic() - self._first)
        reasons, self.reasons = self.reasons, set()
        self._first = None
        self._event.clear()
        return reasons, first_wall
