"""Collectives as chunk-level pre- and postconditions.

A ``Demand`` is one tenant's collective: which NPUs take part (in rank order), how many bytes
(the nccl-tests convention for ``size``: the output buffer of AllGather, Gather and
ReduceScatter's input, one rank's send buffer of AllToAll), and how many chunks each rank's
piece is cut into.
Chunk ids are dense per demand; ``origins``/``destinations`` say where each chunk starts and
where it must end. For combining collectives every rank contributes to every chunk and the
destinations must hold the reduction of all contributions, each exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

import numpy as np

from choreo.errors import InputError

MAX_SIZE = 1 << 40  # 1 TiB: larger requests are a typo, not a workload


class Collective(StrEnum):
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    ALLREDUCE = "allreduce"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    GATHER = "gather"
    SCATTER = "scatter"
    ALLTOALL = "alltoall"

    @property
    def combining(self) -> bool:
        return self in (Collective.REDUCESCATTER, Collective.ALLREDUCE, Collective.REDUCE)

    @property
    def rooted(self) -> bool:
        return self in (Collective.BROADCAST, Collective.REDUCE, Collective.GATHER,
                        Collective.SCATTER)

    @classmethod
    def parse(cls, text: str, where: str = "collective") -> Collective:
        key = text.strip().lower().replace("-", "").replace("_", "")
        for c in cls:
            if c.value == key:
                return c
        known = ", ".join(c.value for c in cls)
        raise InputError(f"{where}: unknown collective {text!r} (known: {known})")


def volume(collective: Collective, size: int, n: int) -> float:
    """Bytes of all of a collective's chunks: ``size`` for every collective but AllToAll,
    whose ``size`` is one rank's send buffer (``size / n`` to every peer, as nccl-tests and
    the MSCCL runtimes count it), so its chunks hold ``n * size``."""
    return float(size) * (n if collective is Collective.ALLTOALL else 1)


@dataclass(frozen=True)
class Demand:
    """One tenant's collective over ``ranks`` (NPU ids, rank order)."""

    collective: Collective
    ranks: tuple[int, ...]
    size: int
    chunks: int = 1
    root: int = 0
    weight: float = 1.0
    name: str = ""

    def __post_init__(self) -> None:
        where = f"tenant {self.name!r}" if self.name else "demand"
        if len(self.ranks) < 2:
            raise InputError(
                f"{where}.ranks: a collective needs at least 2 NPUs, got {len(self.ranks)}")
        if len(set(self.ranks)) != len(self.ranks):
            raise InputError(f"{where}.ranks: an NPU is listed twice")
        if not 0 < self.size <= MAX_SIZE:
            raise InputError(f"{where}.size: must be in 1 B .. 1 TiB, got {self.size}")
        if self.chunks < 1:
            raise InputError(f"{where}.chunks: must be at least 1, got {self.chunks}")
        if not 0 <= self.root < len(self.ranks):
            raise InputError(f"{where}.root: rank {self.root} is not in 0..{len(self.ranks) - 1}")
        if not self.weight > 0:
            raise InputError(f"{where}.weight: must be positive, got {self.weight}")

    @property
    def n(self) -> int:
        return len(self.ranks)

    @property
    def num_chunks(self) -> int:
        c, n = self.collective, self.n
        if c in (Collective.BROADCAST, Collective.REDUCE):
            return self.chunks
        if c is Collective.ALLTOALL:
            return n * n * self.chunks
        return n * self.chunks

    @property
    def volume(self) -> float:
        """Bytes of all chunks together (``volume``)."""
        return volume(self.collective, self.size, self.n)

    @property
    def chunk_bytes(self) -> float:
        """Bytes in one chunk, from the nccl-tests meaning of ``size``."""
        return self.volume / self.num_chunks

    def origins(self, chunk: int) -> tuple[int, ...]:
        """Ranks holding (a contribution to) the chunk before the collective starts."""
        o = self.single_origin
        return tuple(range(self.n)) if o is None else (int(o[chunk]),)

    def destinations(self, chunk: int) -> tuple[int, ...]:
        """Ranks that must hold the final chunk when the collective ends."""
        d = self.single_destination
        return tuple(range(self.n)) if d is None else (int(d[chunk]),)

    @cached_property
    def single_origin(self) -> np.ndarray | None:
        """Per chunk its one origin rank, or None when every rank holds a part of every chunk."""
        c, k = self.collective, np.arange(self.num_chunks)
        if c.combining:
            return None
        if c in (Collective.BROADCAST, Collective.SCATTER):
            return np.full(self.num_chunks, self.root)
        if c is Collective.ALLTOALL:
            return k // (self.n * self.chunks)
        return k // self.chunks

    @cached_property
    def single_destination(self) -> np.ndarray | None:
        """Per chunk its one destination rank, or None when every rank needs every chunk."""
        c, k = self.collective, np.arange(self.num_chunks)
        if c in (Collective.ALLGATHER, Collective.ALLREDUCE, Collective.BROADCAST):
            return None
        if c in (Collective.REDUCE, Collective.GATHER):
            return np.full(self.num_chunks, self.root)
        if c is Collective.ALLTOALL:
            return (k // self.chunks) % self.n
        return k // self.chunks

    def bus_factor(self) -> float:
        """NCCL's busbw = algbw * factor (nccl-tests PERFORMANCE.md)."""
        n = self.n
        c = self.collective
        if c is Collective.ALLREDUCE:
            return 2 * (n - 1) / n
        if c in (Collective.BROADCAST, Collective.REDUCE):
            return 1.0
        return (n - 1) / n


def format_size(n: int) -> str:
    """``1 GiB``, ``64 MiB``, ``12 B``: the inverse of ``parse_size`` for people."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def parse_size(text: str | int, where: str = "size") -> int:
    """Parse ``1GiB``, ``512MB``, ``4096`` into bytes; reject zero, negatives and > 1 TiB."""
    if isinstance(text, int):
        value = text
    else:
        units = {
            "": 1, "b": 1,
            "k": 1000, "kb": 1000, "kib": 1 << 10,
            "m": 1000**2, "mb": 1000**2, "mib": 1 << 20,
            "g": 1000**3, "gb": 1000**3, "gib": 1 << 30,
            "t": 1000**4, "tb": 1000**4, "tib": 1 << 40,
        }
        s = text.strip().lower().replace(" ", "")
        num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = s[len(num):]
        if unit not in units or not num:
            raise InputError(f"{where}: cannot read {text!r} as a size (e.g. 64MiB, 1GiB, 4096)")
        try:
            value = int(float(num) * units[unit])
        except ValueError:
            raise InputError(f"{where}: cannot read {text!r} as a size") from None
        except OverflowError:  # 1e400 reads as infinity
            raise InputError(f"{where}: must be in 1 B .. 1 TiB, got {text!r}") from None
    if not 0 < value <= MAX_SIZE:
        raise InputError(f"{where}: must be in 1 B .. 1 TiB, got {text!r}")
    return value
