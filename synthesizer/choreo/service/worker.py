"""The worker process: receives ``Work`` over a pipe, sends progress and the result back.

Synthesis runs in separate processes so that a cancelled, superseded or overdue request can
be stopped at once by killing its process, whatever the engine is doing, and so that Python
work (verification, lowering) of one request never holds up another's GIL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import traceback
from multiprocessing.connection import Connection
from typing import Any

import grpc

from choreo.service.convert import Work
from choreo.service.status import RequestError


def warm_up(topology: str) -> None:
    """One small solve, so the first real request pays no first-call costs."""
    if not topology:
        return
    from choreo.collectives import Collective, Demand
    from choreo.generators import build
    from choreo.report import evaluate
    from choreo.synth import SynthOptions, synthesize

    fabric = build(topology)
    demand = Demand(Collective.ALLREDUCE, tuple(fabric.npus), 1 << 20)
    evaluate(synthesize(fabric, [demand], SynthOptions(restarts=1, relay=False)),
             baselines=False)
    with contextlib.suppress(ImportError):
        from choreo import msccl  # noqa: F401  (imported now rather than during a request)


def helper_main(conn: Connection, warmup_topology: str, nice: int = 0) -> None:
    """Run the tasks a worker lends (``work.Task``: judging, lowering) until the pipe closes.
    A task's exception is sent back as its result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if nice > 0:
        os.nice(nice)
    from choreo.service import work  # noqa: F401  (the task types unpickle from it)

    with contextlib.suppress(Exception):
        warm_up(warmup_topology)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        try:
            result = task.run()
        except Exception as err:
            result = err
        conn.send(result)


def main(conn: Connection, warmup_topology: str, nice: int = 0,
         helper: Connection | None = None) -> None:
    """Serve one request at a time until the pipe closes; the parent kills us to cancel.

    ``nice`` lowers the worker's CPU priority: on a busy pod the server process, which
    answers cache hits and health checks, should win the CPU over background solving.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when workers stop
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if nice > 0:
        os.nice(nice)
    from choreo.service import work

    try:
        warm_up(warmup_topology)
    except Exception as err:  # a broken warm-up must not keep the server from serving
        conn.send(("log", f"warm-up failed: {type(err).__name__}: {err}"))
    conn.send(("ready",))

    def say(stage: str, message: str, done: int, total: int) -> None:
        conn.send(("progress", stage, message, done, total))

    while True:
        try:
            job: Work = conn.recv()
        except (EOFError, OSError):
            return
        reply: tuple[Any, ...]
        try:
            reply = ("ok", work.run(job, say, helper))
        except RequestError as err:
            reply = ("error", err)
        except Exception as err:
            reply = ("error", RequestError(
                grpc.StatusCode.INTERNAL, f"synthesis failed: {type(err).__name__}: {err}",
                reason="INTERNAL", metadata={"traceback": traceback.format_exc()[-2000:]}))
        conn.send(reply)
