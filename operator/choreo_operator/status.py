"""Conditions and phases, following the Kubernetes convention (a list keyed by type)."""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from typing import Any

TYPES = ("Ready", "Synthesizing", "Degraded", "Infeasible")
_REASON = re.compile(r"[^A-Za-z0-9_]")

Update = tuple[bool, str, str]  # status, reason, message


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def reason_text(reason: str) -> str:
    """A reason the CRD's pattern accepts (CamelCase, no spaces)."""
    cleaned = _REASON.sub("", reason) or "Unknown"
    return cleaned if cleaned[0].isalpha() else f"R{cleaned}"


def merge(old: Sequence[Mapping[str, Any]], updates: Mapping[str, Update],
          generation: int) -> list[dict[str, Any]]:
    """Apply ``updates``; lastTransitionTime moves only when a status flips."""
    by_type = {c["type"]: dict(c) for c in old}
    for kind, (value, reason, message) in updates.items():
        status = "True" if value else "False"
        prev = by_type.get(kind)
        changed = prev is None or prev.get("status") != status
        by_type[kind] = {
            "type": kind, "status": status, "reason": reason_text(reason),
            "message": message[:32000], "observedGeneration": generation,
            "lastTransitionTime": now() if changed or prev is None
            else prev.get("lastTransitionTime", now()),
        }
    order = {t: i for i, t in enumerate(TYPES)}
    return sorted(by_type.values(), key=lambda c: (order.get(c["type"], 99), c["type"]))


def is_true(conditions: Sequence[Mapping[str, Any]], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def phase(conditions: Sequence[Mapping[str, Any]]) -> str:
    for kind in ("Infeasible", "Degraded", "Synthesizing", "Ready"):
        if is_true(conditions, kind):
            return kind
    return "Pending"


def same(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    """Equal apart from timestamps."""
    def strip(cs: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted((c.get("type"), c.get("status"), c.get("reason"), c.get("message"),
                       c.get("observedGeneration")) for c in cs)
    return strip(a) == strip(b)
