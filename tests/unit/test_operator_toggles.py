"""kopf's index-readiness toggle set, as the operator runs it: wake-ups linear in objects."""

from __future__ import annotations

import asyncio

from kopf._cogs.aiokits import aiotoggles

from choreo_operator import toggles


class _Counting(aiotoggles.ToggleSet):
    """Counts evaluations of the aggregate state: one per waiter woken, plus the patch's own."""

    evaluations = 0

    def is_on(self) -> bool:
        type(self).evaluations += 1
        return super().is_on()


async def _startup(objects: int) -> int:
    """kopf's startup: a kind's toggle held off while every listed object's worker adds its
    toggle, drops it once indexed and waits for the whole set; then the listing ends."""
    _Counting.evaluations = 0
    indexed = _Counting(all)
    kind = await indexed.make_toggle(name="kind")

    async def worker(toggle: aiotoggles.Toggle) -> None:
        await indexed.drop_toggle(toggle)
        await indexed.wait_for(True)

    workers = []
    for i in range(objects):
        toggle = await indexed.make_toggle(name=str(i))
        workers.append(asyncio.create_task(worker(toggle)))
        await asyncio.sleep(0)
    assert not any(w.done() for w in workers), "a worker ran before every index was filled"
    await kind.turn_to(True)
    await asyncio.wait_for(asyncio.gather(*workers), timeout=60)
    return _Counting.evaluations


def test_startup_wakeups_grow_linearly_with_objects() -> None:
    toggles.install()
    small, large = asyncio.run(_startup(500)), asyncio.run(_startup(1000))
    # kopf's own notify-on-every-change gives n**2 / 2: 125,000 and 500,000 here.
    assert large <= 8 * 1000, large
    assert large <= 2.2 * small, (small, large)


def test_waiters_are_released_when_the_aggregate_changes() -> None:
    toggles.install()

    async def main() -> None:
        every = aiotoggles.ToggleSet(all)
        off = await every.make_toggle(False)
        on_waiter = asyncio.create_task(every.wait_for(True))
        await asyncio.sleep(0)
        assert not on_waiter.done()
        await every.drop_toggle(off)  # the last off toggle gone: all() turns on
        await asyncio.wait_for(on_waiter, timeout=5)

        some = aiotoggles.ToggleSet(any)
        waiter = asyncio.create_task(some.wait_for(True))
        await asyncio.sleep(0)
        assert not waiter.done()
        on = await some.make_toggle(True)  # an on toggle added: any() turns on
        await asyncio.wait_for(waiter, timeout=5)
        off_waiter = asyncio.create_task(some.wait_for(False))
        await asyncio.sleep(0)
        assert not off_waiter.done()
        await some.drop_toggles([on])
        await asyncio.wait_for(off_waiter, timeout=5)

        single = await every.make_toggle(False)  # a toggle's own waiters still wake on turns
        turned = asyncio.create_task(single.wait_for(True))
        await asyncio.sleep(0)
        await single.turn_to(True)
        await asyncio.wait_for(turned, timeout=5)

    asyncio.run(main())


def test_install_is_idempotent() -> None:
    toggles.install()
    patched = aiotoggles.ToggleSet.make_toggle
    toggles.install()
    assert aiotoggles.ToggleSet.make_toggle is patched
