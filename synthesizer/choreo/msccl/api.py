"""The entry points other services call: one tenant's schedule to XML text."""

from __future__ import annotations

from choreo.msccl.lower import lower
from choreo.schedule import Schedule


def to_xml(schedule: Schedule, tenant: int = 0, *, dialect: str = "executor", instances: int = 1,
           proto: str = "Simple", min_bytes: int = 0, max_bytes: int | None = None,
           name: str | None = None, calls: str | None = None) -> str:
    """MSCCL XML for ``tenant`` of ``schedule``.

    ``[min_bytes, max_bytes]`` is the inclusive size range the file serves (None: no upper
    limit); it is written in the dialect's own convention (executor: inclusive, 0 = unlimited;
    legacy: exclusive, 0 = never; its range also stops where the scratch it allocates at
    communicator creation would pass ``layout.LEGACY_SCRATCH_CAP``). ``calls``: in-place,
    out-of-place or both (``lower.check_calls``). Raises ``InputError`` if the runtime could not
    run it.
    """
    return lower(schedule, tenant, dialect=dialect, instances=instances, proto=proto,
                 min_bytes=min_bytes, max_bytes=max_bytes, name=name, calls=calls).text
