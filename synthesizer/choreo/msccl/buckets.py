"""Size buckets: several schedules of one collective, each serving a byte range.

Small messages want few chunks (latency), large ones many (pipelining). The runtimes pick the
first file whose range contains the call's size: executor files in lexicographic order of path
(``minBytes <= n <= maxBytes``, 0 = unlimited), legacy ones in ``MSCCL_XML_FILES`` order
(``minBytes <= n < maxBytes``, at most 4 files). Ranges here are inclusive and must not overlap.
Legacy uses a file only for calls whose kind (in place or not) equals its ``inplace``, so each
legacy bucket is written twice, once per kind (``layout.file_kinds``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from choreo.collectives import Demand
from choreo.errors import InputError
from choreo.msccl import layout
from choreo.msccl.lower import Lowering, Pack, lower, node_file_gpus
from choreo.schedule import Schedule


@dataclass(frozen=True)
class BucketFile:
    """One bucket's file, checked and named, ready to be lowered (anywhere: it pickles)."""

    name: str
    schedule: Schedule
    tenant: int
    min_bytes: int
    max_bytes: int | None
    algo_name: str
    dialect: str
    instances: int
    proto: str
    calls: str  # the kind of call it serves (layout.CALLS)
    bucket: int  # index of its bucket in size order

    def lowering(self, pack: Pack | None = None) -> Lowering:
        """The program, with the upper end of the range it really serves (its elements
        compressed as they are written, with ``pack``)."""
        return lower(self.schedule, self.tenant, dialect=self.dialect,
                     instances=self.instances, proto=self.proto, min_bytes=self.min_bytes,
                     max_bytes=self.max_bytes, name=self.algo_name, calls=self.calls,
                     file_gpus=node_file_gpus(self.schedule, self.tenant), pack=pack)

    def xml(self) -> str:
        return self.lowering().text


def bucket_files(buckets: Sequence[tuple[int, int | None, Schedule]], tenant: int = 0, *,
                 dialect: str = "executor", instances: int = 1,
                 proto: str = "Simple") -> list[tuple[str, str]]:
    """(file name, XML) per file, in size order; names sort in that same order."""
    return [(f.name, f.xml()) for f in plan_files(buckets, tenant, dialect=dialect,
                                                 instances=instances, proto=proto)]


def plan_files(buckets: Sequence[tuple[int, int | None, Schedule]], tenant: int = 0, *,
               dialect: str = "executor", instances: int = 1,
               proto: str = "Simple") -> list[BucketFile]:
    """The files ``bucket_files`` writes, checked and named but not lowered yet: one per
    bucket and kind of call (``layout.file_kinds``)."""
    if not buckets:
        raise InputError("buckets: at least one (min_bytes, max_bytes, schedule) is needed")
    if dialect not in layout.RUNTIMES:
        raise InputError(f"dialect: {dialect!r} is not one of {', '.join(layout.DIALECTS)}")
    ordered = sorted(buckets, key=lambda b: b[0])
    first = _demand(ordered[0][2], tenant)
    kinds = layout.file_kinds(first.collective, dialect)
    most = layout.max_buckets(first.collective, dialect)
    if most is not None and len(buckets) > most:
        raise InputError(f"buckets: the legacy runtime loads at most {layout.MAX_LEGACY_ALGOS} "
                         f"algorithms and needs {len(kinds)} per bucket "
                         f"({' and '.join(kinds)} calls) for {first.collective.value}, so at "
                         f"most {most} bucket(s); got {len(buckets)}")
    for k, (lo, hi, sched) in enumerate(ordered):
        d = _demand(sched, tenant)
        if (d.collective, d.ranks, d.root) != (first.collective, first.ranks, first.root):
            raise InputError(f"buckets[{k}]: tenant {tenant} is a {d.collective.value} over "
                             f"{len(d.ranks)} ranks; every bucket must be the same collective "
                             "on the same ranks")
        if lo < 0 or (hi is not None and hi < lo):
            raise InputError(f"buckets[{k}]: range {lo}..{hi} is empty or negative")
        if k + 1 < len(ordered):
            nxt = ordered[k + 1][0]
            if hi is None or hi >= nxt:
                raise InputError(f"buckets[{k}]: range {lo}..{'unlimited' if hi is None else hi}"
                                 f" overlaps the next one starting at {nxt}")
    base = first.name or first.collective.value
    width = max(2, len(str(len(ordered) - 1)))
    out = []
    for k, (lo, hi, sched) in enumerate(ordered):
        tag = f"{base}-{k:0{width}d}"
        chunks = _demand(sched, tenant).chunks
        for kind in kinds:
            suffix = layout.file_suffix(kind)
            out.append(BucketFile(f"{tag}{suffix}.xml", sched, tenant, lo, hi,
                                  f"{tag}-{chunks}c{suffix}", dialect, instances, proto, kind,
                                  k))
    return out


def _demand(sched: Schedule, tenant: int) -> Demand:
    if not 0 <= tenant < len(sched.demands):
        raise InputError(f"tenant: {tenant} is not in 0..{len(sched.demands) - 1}")
    return sched.demands[tenant]
