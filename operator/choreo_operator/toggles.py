"""kopf's toggle sets wake their waiters only when the set's own state changes.

At startup kopf holds every object's handlers until every index is filled: each object's
worker waits on one ``ToggleSet`` (``operator_indexed``), and the watcher adds and drops a
toggle per listed object. kopf 1.45 notifies every waiter on each add and drop, although
neither changes any toggle's state, and the set stays off until every kind is listed. With
``n`` objects that is about ``n**2`` wake-ups: 2,000 objects took 36 s, 4,000 took 157 s
(measured with kopf's own class), and 5,000 nodes with their pods (about 10,000 objects)
kept the operator indexing for longer than the benchmark waited.

A waiter on the set waits for its aggregate state and a waiter on one toggle for that
toggle's state; adding or dropping a toggle changes no toggle's state, so only a change of
the aggregate can release anyone. ``install`` makes ``make_toggle``, ``drop_toggle`` and
``drop_toggles`` notify exactly then. Turning a toggle on or off still notifies as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from kopf._cogs.aiokits import aiotoggles

_ToggleSet = aiotoggles.ToggleSet
_Toggle = aiotoggles.Toggle
_PATCHED = "_choreo_quiet"


async def _make_toggle(self: aiotoggles.ToggleSet, __val: bool = False, *,
                       name: str | None = None) -> aiotoggles.Toggle:
    toggle = _Toggle(__val, name=name, condition=self._condition)
    async with self._condition:
        before = self.is_on()
        self._toggles.add(toggle)
        if self.is_on() != before:
            self._condition.notify_all()
    return toggle


async def _drop_toggle(self: aiotoggles.ToggleSet, toggle: aiotoggles.Toggle) -> None:
    await _drop_toggles(self, (toggle,))


async def _drop_toggles(self: aiotoggles.ToggleSet, toggles: Iterable[aiotoggles.Toggle]) -> None:
    async with self._condition:
        before = self.is_on()
        self._toggles.difference_update(toggles)
        if self.is_on() != before:
            self._condition.notify_all()


def install() -> None:
    """Patch kopf's ToggleSet once; a kopf without the attributes relied on fails here."""
    if getattr(_ToggleSet, _PATCHED, False):
        return
    probe = _ToggleSet(all)
    for attribute in ("_condition", "_toggles", "make_toggle", "drop_toggle", "drop_toggles"):
        if not hasattr(probe, attribute):
            raise RuntimeError(f"kopf's ToggleSet has no {attribute!r}: choreo_operator.toggles "
                               "needs updating for this kopf version")
    _ToggleSet.make_toggle = _make_toggle  # type: ignore[method-assign]
    _ToggleSet.drop_toggle = _drop_toggle  # type: ignore[method-assign]
    _ToggleSet.drop_toggles = _drop_toggles  # type: ignore[method-assign]
    setattr(_ToggleSet, _PATCHED, True)
