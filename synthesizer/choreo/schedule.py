"""The one schedule type of choreo, produced by every engine and consumed by everything else.

Transfers are stored as columns (numpy arrays) because large fabrics produce millions of them.
Transfer ``i`` moves chunks ``chunk[i] .. chunk[i] + count[i] - 1`` of tenant ``tenant[i]``
from NPU ``src[i]`` to NPU ``dst[i]`` over link ``link[i]`` of ``topology`` during
``[start[i], end[i])`` seconds, so it lasts at least ``alpha + count * chunk_bytes /
bandwidth``; ``op[i]`` says whether the receiver overwrites (COPY) or accumulates (REDUCE) its
copies. The engines move one chunk per transfer (``count`` 1); the hierarchical plans of very
large tenants move ranges, which keeps their schedules linear in the number of ranks.
``topology`` is the graph the link ids refer to; when it was derived from the physical
``fabric`` (switches unwound), its links name their physical links in ``via``.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np

from choreo.collectives import Collective, Demand
from choreo.topology import Topology

COLUMNS = ("tenant", "chunk", "src", "dst", "link", "start", "end", "op", "count")
_INT_COLUMNS = ("tenant", "chunk", "src", "dst", "link", "count")


class Op(IntEnum):
    COPY = 0
    REDUCE = 1


@dataclass
class Schedule:
    fabric: Topology
    topology: Topology
    demands: tuple[Demand, ...]
    tenant: np.ndarray
    chunk: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    link: np.ndarray
    start: np.ndarray
    end: np.ndarray
    op: np.ndarray
    engine: str = "greedy"
    meta: dict[str, Any] = field(default_factory=dict)
    count: np.ndarray = None  # type: ignore[assignment]  # None means one chunk each

    def __post_init__(self) -> None:
        if self.count is None:
            self.count = np.ones(len(self.tenant), dtype=np.int32)
        for name in _INT_COLUMNS:
            setattr(self, name, np.ascontiguousarray(getattr(self, name), dtype=np.int32))
        self.start = np.ascontiguousarray(self.start, dtype=np.float64)
        self.end = np.ascontiguousarray(self.end, dtype=np.float64)
        self.op = np.ascontiguousarray(self.op, dtype=np.int8)
        sizes = {len(getattr(self, name)) for name in COLUMNS}
        if len(sizes) != 1:
            raise ValueError(f"schedule columns differ in length: {sizes}")

    @classmethod
    def empty(cls, fabric: Topology, topology: Topology, demands: tuple[Demand, ...]) -> Schedule:
        """No transfers: what a collective needs when its data is already in place."""
        z = np.zeros(0)
        return cls(fabric, topology, demands, z, z, z, z, z, z, z, z, count=z)

    def __len__(self) -> int:
        return len(self.tenant)

    @property
    def ranged(self) -> bool:
        """Whether some transfer moves more than one chunk."""
        return bool(len(self.count)) and int(self.count.max()) > 1

    def expanded(self) -> tuple[np.ndarray, np.ndarray]:
        """One row per moved chunk: (transfer index, chunk) arrays."""
        idx = np.repeat(np.arange(len(self), dtype=np.int64), self.count)
        first = np.repeat(np.cumsum(self.count, dtype=np.int64) - self.count, self.count)
        return idx, self.chunk[idx] + (np.arange(len(idx), dtype=np.int64) - first)

    @property
    def makespan(self) -> float:
        """Time at which the last transfer of any tenant ends."""
        return float(self.end.max()) if len(self) else 0.0

    def tenant_makespan(self, tenant: int) -> float:
        ends = self.end[self.tenant == tenant]
        return float(ends.max()) if len(ends) else 0.0

    def select(self, mask: np.ndarray) -> Schedule:
        """The transfers where ``mask`` holds, keeping topology and demands."""
        cols = {name: getattr(self, name)[mask] for name in COLUMNS}
        return Schedule(self.fabric, self.topology, self.demands, engine=self.engine,
                        meta=dict(self.meta), **cols)

    def sorted(self) -> Schedule:
        """Transfers ordered by start time, then end time (stable); this schedule itself when
        they already are, as a matcher's plan usually is (a linear check spares the sort)."""
        start, end = self.start, self.end
        if bool(np.all((start[1:] > start[:-1])
                       | ((start[1:] == start[:-1]) & (end[1:] >= end[:-1])))):
            return self
        order = np.lexsort((end, start))
        return self.select(order)

    @staticmethod
    def concat(parts: list[Schedule], engine: str | None = None) -> Schedule:
        """Join schedules on the same fabric and demands (for example the phases of AllReduce)."""
        first = parts[0]
        cols = {name: (getattr(first, name) if len(parts) == 1 else
                       np.concatenate([getattr(p, name) for p in parts])) for name in COLUMNS}
        return Schedule(first.fabric, first.topology, first.demands,
                        engine=engine or first.engine, meta=dict(first.meta), **cols)

    # ---- (de)serialization ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        same = self.topology is self.fabric or self.topology == self.fabric
        return {
            "format": "choreo.schedule/v1",
            "engine": self.engine,
            "meta": self.meta,
            "fabric": self.fabric.to_dict(),
            "topology": None if same else self.topology.to_dict(),
            "demands": [demand_to_dict(d) for d in self.demands],
            "transfers": {name: getattr(self, name).tolist() for name in COLUMNS},
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Schedule:
        fabric = Topology.from_dict(doc["fabric"], "schedule.fabric")
        topo = (Topology.from_dict(doc["topology"], "schedule.topology")
                if doc.get("topology") else fabric)
        demands = tuple(demand_from_dict(d) for d in doc["demands"])
        transfers = doc["transfers"]
        cols = {name: np.asarray(transfers[name]) for name in COLUMNS if name in transfers}
        return cls(fabric, topo, demands, engine=doc.get("engine", "unknown"),
                   meta=doc.get("meta", {}), **cols)

    def save(self, path: str | Path) -> None:
        """Write atomically: a reader never sees a half-written schedule."""
        write_atomic(Path(path), json.dumps(self.to_dict(), separators=(",", ":")))

    @classmethod
    def load(cls, path: str | Path) -> Schedule:
        return cls.from_dict(json.loads(Path(path).read_text()))


def demand_to_dict(d: Demand) -> dict[str, Any]:
    return {"collective": d.collective.value, "ranks": list(d.ranks), "size": d.size,
            "chunks": d.chunks, "root": d.root, "weight": d.weight, "name": d.name}


def demand_from_dict(doc: dict[str, Any]) -> Demand:
    return Demand(collective=Collective.parse(doc["collective"]), ranks=tuple(doc["ranks"]),
                  size=int(doc["size"]), chunks=int(doc.get("chunks", 1)),
                  root=int(doc.get("root", 0)), weight=float(doc.get("weight", 1.0)),
                  name=str(doc.get("name", "")))


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write to a temporary file beside ``path`` and rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode() if isinstance(text, str) else text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
