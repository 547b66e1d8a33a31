"""Tenants files: several collectives on one fabric, synthesized jointly.

```yaml
relay: true                # may NPUs outside a tenant forward its data (default true)
tenants:
  - name: training-a
    ranks: 0-31            # ids, names (node1/gpu3), ranges "a-b", or "all"
    collective: allreduce
    size: 1GiB
    chunks: 4              # optional: chosen from size and alpha/beta when absent
    weight: 2              # optional: higher weight is matched first on shared links
  - name: training-b
    ranks: [32, 33, 34, 35]
    collective: allgather
    size: 256MiB
```
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from choreo.collectives import Collective, Demand, parse_size
from choreo.errors import InputError
from choreo.topofile import read_document
from choreo.topology import Topology

TENANT_FIELDS = {"name", "ranks", "collective", "size", "chunks", "root", "weight"}


@dataclass(frozen=True)
class TenantSpec:
    """A tenant as written, before chunks are chosen for the fabric."""

    name: str
    ranks: tuple[int, ...]
    collective: Collective
    size: int
    chunks: int | None = None
    root: int = 0
    weight: float = 1.0

    def demand(self, chunks: int) -> Demand:
        return Demand(self.collective, self.ranks, self.size, self.chunks or chunks,
                      self.root, self.weight, self.name)


def parse_ranks(value: Any, fabric: Topology, where: str) -> tuple[int, ...]:
    """Ranks as ids, node names, ``a-b`` ranges or ``all`` (every live NPU, id order)."""
    if value == "all":
        return tuple(fabric.npus)
    items: Sequence[Any] = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, Sequence) or isinstance(items, bytes):
        raise InputError(f"{where}: expected a list of NPUs, a range 'a-b' or 'all'")
    by_name = {name: i for i, name in enumerate(fabric.names)} if fabric.names else {}
    ranks: list[int] = []
    for item in items:
        text = str(item).strip()
        if text in by_name:
            ranks.append(by_name[text])
        elif "-" in text and all(p.strip().isdigit() for p in text.split("-", 1)):
            lo, hi = (int(p) for p in text.split("-", 1))
            if hi < lo:
                raise InputError(f"{where}: range {text!r} runs backwards")
            ranks.extend(range(lo, hi + 1))
        elif text.isdigit():
            ranks.append(int(text))
        else:
            raise InputError(f"{where}: {text!r} is neither an NPU id, a range nor an NPU name")
    for r in ranks:
        if not 0 <= r < fabric.num_nodes or not fabric.is_npu(r):
            raise InputError(f"{where}: {r} is not an NPU of fabric {fabric.name!r}")
    return tuple(ranks)


def parse_tenants(doc: Any, fabric: Topology, where: str) -> tuple[list[TenantSpec], bool]:
    """Validate a tenants document; every error names the file and field."""
    if not isinstance(doc, dict) or "tenants" not in doc:
        raise InputError(f"{where}: expected a mapping with a 'tenants' list")
    unknown = set(doc) - {"tenants", "relay"}
    if unknown:
        raise InputError(f"{where}: unknown field(s) {sorted(unknown)} (allowed: tenants, relay)")
    relay = doc.get("relay", True)
    if not isinstance(relay, bool):
        raise InputError(f"{where}.relay: must be true or false")
    items = doc["tenants"]
    if not isinstance(items, list) or not items:
        raise InputError(f"{where}.tenants: must be a non-empty list")
    specs = []
    for i, item in enumerate(items):
        at = f"{where}.tenants[{i}]"
        if not isinstance(item, dict):
            raise InputError(f"{at}: must be a mapping")
        unknown = set(item) - TENANT_FIELDS
        if unknown:
            raise InputError(f"{at}: unknown field(s) {sorted(unknown)}")
        for required in ("ranks", "collective", "size"):
            if required not in item:
                raise InputError(f"{at}.{required}: is required")
        chunks = item.get("chunks")
        if chunks is not None and (not isinstance(chunks, int) or chunks < 1):
            raise InputError(f"{at}.chunks: must be a positive integer")
        weight = item.get("weight", 1.0)
        if not isinstance(weight, int | float) or not weight > 0:
            raise InputError(f"{at}.weight: must be a positive number")
        spec = TenantSpec(
            name=str(item.get("name", f"tenant{i}")),
            ranks=parse_ranks(item["ranks"], fabric, f"{at}.ranks"),
            collective=Collective.parse(str(item["collective"]), f"{at}.collective"),
            size=parse_size(item["size"], f"{at}.size"),
            chunks=chunks,
            root=int(item.get("root", 0)),
            weight=float(weight),
        )
        spec.demand(1)  # validates ranks, root and size with the field named
        specs.append(spec)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise InputError(f"{where}.tenants: tenant names must be unique")
    return specs, relay


def load_tenants(path: str | Path, fabric: Topology) -> tuple[list[TenantSpec], bool]:
    return parse_tenants(read_document(Path(path)), fabric, str(path))
