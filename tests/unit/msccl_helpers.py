"""Shared fixtures for the MSCCL tests: small synthesized schedules, cached per process."""

from __future__ import annotations

from functools import cache

from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.schedule import Schedule
from choreo.synth import SynthOptions, synthesize

SIZE = 1 << 20


@cache
def schedule(topology: str, collective: str, chunks: int = 1, root: int = 0) -> Schedule:
    fabric = build(topology)
    demand = Demand(Collective(collective), tuple(fabric.npus), SIZE, chunks, root=root)
    return synthesize(fabric, [demand], SynthOptions(restarts=1, relay=False))
