"""A broken rule, located precisely enough to fix by hand."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Violation:
    """``rule`` is a short stable keyword (tests and tools match on it); ``message`` says why."""

    line: int
    gpu: int | None
    tb: int | None
    step: int | None
    rule: str
    message: str

    def where(self) -> str:
        parts = [f"line {self.line}"]
        for name, value in (("gpu", self.gpu), ("tb", self.tb), ("step", self.step)):
            if value is not None:
                parts.append(f"{name} {value}")
        return " ".join(parts)

    def __str__(self) -> str:
        return f"{self.where()}: [{self.rule}] {self.message}"
