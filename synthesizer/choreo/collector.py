"""Pausing Python's cyclic garbage collector where many objects are made at once."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while acyclic objects are made by the hundred
    thousand (an MSCCL file's model, a routed topology's circuits): each allocation burst
    would set off collections that walk everything the process holds, and none of them
    frees anything."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
