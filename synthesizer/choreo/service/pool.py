"""A bounded queue in front of a fixed number of worker processes.

Each worker slot is a thread that owns one process: it takes the oldest queued job, sends it
over the pipe and relays progress until the result arrives. When the job is cancelled, is
superseded or runs past its deadline, the slot kills the process at once and starts a fresh
one (forked from a preloaded forkserver, so that takes milliseconds), so abandoned work never
keeps a worker busy. A full queue is refused up front with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import grpc

from choreo.service.convert import Work
from choreo.service.status import RequestError

log = logging.getLogger("choreo.service")

POLL_SECONDS = 0.01


@dataclass
class Event:
    """A progress report, as shown to streaming clients."""

    stage: str
    message: str
    done: int
    total: int
    elapsed: float


class Job:
    """One unit of work and everyone waiting for it (identical requests share one job)."""

    def __init__(self, work: Work, key: str, deadline: float | None) -> None:
        self.work = work
        self.key = key
        self.deadline = deadline  # time.monotonic() value, None for none
        self.created = time.monotonic()
        self.started: float | None = None
        self.result: bytes | None = None
        self.error: RequestError | None = None
        self.events: list[Event] = []
        self._cond = threading.Condition()
        self._cancel: RequestError | None = None
        self._waiters = 0

    # ---- waiting ---------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.result is not None or self.error is not None

    def attach(self, deadline: float | None) -> None:
        """One more waiter; the job lives as long as its most patient waiter."""
        with self._cond:
            self._waiters += 1
            if self._waiters > 1:
                self.deadline = (None if deadline is None or self.deadline is None
                                 else max(self.deadline, deadline))

    def detach(self) -> None:
        """A waiter left; the last one to leave an unfinished job cancels it."""
        with self._cond:
            self._waiters -= 1
            last = self._waiters <= 0
        if last:
            self.cancel(RequestError(grpc.StatusCode.CANCELLED, "the client went away",
                                     reason="CANCELLED"))

    def wait(self, seen: int, timeout: float | None) -> list[Event]:
        """Events after the first ``seen``, waiting up to ``timeout`` for news or the end."""
        with self._cond:
            self._cond.wait_for(lambda: self.finished or len(self.events) > seen, timeout)
            return self.events[seen:]

    # ---- state changes (slot thread, or anyone cancelling) --------------------------------
    def cancel(self, reason: RequestError) -> None:
        """Ask the job to stop; a queued job ends at once, a running one when its slot sees it."""
        with self._cond:
            if self.finished or self._cancel is not None:
                return
            self._cancel = reason
            if self.started is None:
                self.error = reason
            self._cond.notify_all()

    @property
    def cancel_reason(self) -> RequestError | None:
        return self._cancel

    def begin(self) -> bool:
        """Mark the job running; False if it ended (was cancelled) while queued."""
        with self._cond:
            if self.finished:
                return False
            self.started = time.monotonic()
            return True

    def progress(self, stage: str, message: str, done: int, total: int) -> None:
        with self._cond:
            self.events.append(Event(stage, message, done, total,
                                     time.monotonic() - self.created))
            self._cond.notify_all()

    def finish(self, result: bytes | None = None, error: RequestError | None = None) -> None:
        with self._cond:
            if not self.finished:
                self.result, self.error = result, error
            self._cond.notify_all()


def deadline_error() -> RequestError:
    return RequestError(grpc.StatusCode.DEADLINE_EXCEEDED,
                        "synthesis did not finish before the deadline", reason="DEADLINE")


@dataclass
class PoolStats:
    """Callbacks the pool reports through (metrics live elsewhere)."""

    queue_depth: Callable[[int], None] = lambda _n: None
    busy: Callable[[int], None] = lambda _n: None
    duration: Callable[[float], None] = lambda _s: None


@dataclass
class _Slot:
    index: int
    process: BaseProcess | None = None
    helper: BaseProcess | None = None  # the worker's second process (judging, lowering)
    conn: Connection | None = None
    thread: threading.Thread | None = None
    ready: threading.Event = field(default_factory=threading.Event)


class WorkerPool:
    """``workers`` processes, at most ``queue`` jobs waiting for one of them."""

    def __init__(self, workers: int, queue: int, warmup_topology: str = "",
                 stats: PoolStats | None = None, nice: int = 0) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        if queue < 0:
            raise ValueError("queue must be non-negative")
        self.workers = workers
        self.queue_limit = queue
        self.warmup_topology = warmup_topology
        self.nice = nice
        self.stats = stats or PoolStats()
        self._ctx = mp.get_context("forkserver")
        self._ctx.set_forkserver_preload(["choreo.service.worker"])
        self._pending: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._closing = False
        self._busy = 0
        self._slots = [_Slot(i) for i in range(workers)]

    # ---- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        for slot in self._slots:
            slot.thread = threading.Thread(target=self._serve, args=(slot,),
                                           name=f"choreo-slot-{slot.index}", daemon=True)
            slot.thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """True once every worker has started and warmed up."""
        end = None if timeout is None else time.monotonic() + timeout
        for slot in self._slots:
            left = None if end is None else max(0.0, end - time.monotonic())
            if not slot.ready.wait(left):
                return False
        return True

    def close(self) -> None:
        """Cancel queued jobs, stop the slots and kill their processes."""
        with self._cond:
            self._closing = True
            queued = list(self._pending)
            self._pending.clear()
            self._cond.notify_all()
        for job in queued:
            job.cancel(RequestError(grpc.StatusCode.UNAVAILABLE, "the server is shutting down",
                                    reason="SHUTTING_DOWN"))
        self.stats.queue_depth(0)
        for slot in self._slots:
            if slot.thread is not None:
                slot.thread.join(timeout=5)
            self._kill(slot)

    # ---- submission -------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue ``job`` or refuse it: RESOURCE_EXHAUSTED when the queue is full."""
        with self._cond:
            if self._closing:
                raise RequestError(grpc.StatusCode.UNAVAILABLE, "the server is shutting down",
                                   reason="SHUTTING_DOWN")
            self._drop_cancelled()
            if self._busy + len(self._pending) >= self.workers + self.queue_limit:
                raise RequestError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"all {self.workers} workers are busy and {self.queue_limit} requests are "
                    "queued; retry later", reason="QUEUE_FULL",
                    metadata={"workers": str(self.workers), "queue": str(self.queue_limit)})
            self._pending.append(job)
            self.stats.queue_depth(len(self._pending))
            self._cond.notify()

    @property
    def depth(self) -> int:
        with self._cond:
            return len(self._pending)

    def _drop_cancelled(self) -> None:
        if any(j.finished for j in self._pending):
            kept = [j for j in self._pending if not j.finished]
            self._pending.clear()
            self._pending.extend(kept)

    def _take(self) -> Job | None:
        with self._cond:
            while True:
                self._drop_cancelled()
                if self._closing:
                    return None
                if self._pending:
                    job = self._pending.popleft()
                    self._busy += 1
                    self.stats.queue_depth(len(self._pending))
                    self.stats.busy(self._busy)
                    return job
                self._cond.wait(timeout=0.5)

    def _release(self) -> None:
        with self._cond:
            self._busy -= 1
            self.stats.busy(self._busy)

    # ---- one slot ---------------------------------------------------------------------------
    def _spawn(self, slot: _Slot) -> None:
        from choreo.service import worker

        lend, borrow = self._ctx.Pipe()
        helper = self._ctx.Process(target=worker.helper_main,
                                   args=(borrow, self.warmup_topology, self.nice),
                                   name=f"choreo-helper-{slot.index}", daemon=True)
        helper.start()
        borrow.close()
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=worker.main,
                                 args=(child, self.warmup_topology, self.nice, lend),
                                 name=f"choreo-worker-{slot.index}", daemon=True)
        proc.start()
        child.close()
        lend.close()
        slot.process, slot.helper, slot.conn = proc, helper, parent

    def _kill(self, slot: _Slot) -> None:
        for proc in (slot.process, slot.helper):
            if proc is not None:
                proc.kill()
                proc.join(timeout=5)
        if slot.conn is not None:
            slot.conn.close()
        slot.process = slot.helper = slot.conn = None

    def _await_ready(self, slot: _Slot) -> bool:
        """Wait for the fresh worker's hello; False if it died or we are closing."""
        assert slot.conn is not None and slot.process is not None
        while not self._closing:
            try:
                if slot.conn.poll(0.1):
                    msg = slot.conn.recv()
                    if msg[0] == "ready":
                        return True
                    if msg[0] == "log":
                        log.warning("worker %d: %s", slot.index, msg[1])
                elif not slot.process.is_alive():
                    return False
            except (EOFError, OSError):
                return False
        return False

    def _serve(self, slot: _Slot) -> None:
        failures = 0
        while not self._closing:
            self._spawn(slot)
            if not self._await_ready(slot):
                self._kill(slot)
                failures += 1
                time.sleep(min(5.0, 0.1 * 2**failures))
                continue
            failures = 0
            slot.ready.set()
            while not self._closing:
                job = self._take()
                if job is None:
                    break
                try:
                    healthy = self._run(slot, job)
                finally:
                    self._release()
                if not healthy:
                    self._kill(slot)
                    break
        self._kill(slot)

    def _run(self, slot: _Slot, job: Job) -> bool:
        """Run one job; False when the worker had to be killed (or died) and needs replacing."""
        assert slot.conn is not None and slot.process is not None
        if job.deadline is not None and time.monotonic() >= job.deadline:
            job.finish(error=deadline_error())
            return True
        if not job.begin():
            return True
        began = time.monotonic()
        job.progress("started", f"worker {slot.index}", 0, 0)
        try:
            slot.conn.send(job.work)
            while True:
                stop = job.cancel_reason
                if stop is None and job.deadline is not None and time.monotonic() >= job.deadline:
                    stop = deadline_error()
                if stop is not None or self._closing:
                    job.finish(error=stop or RequestError(
                        grpc.StatusCode.UNAVAILABLE, "the server is shutting down",
                        reason="SHUTTING_DOWN"))
                    return False
                if not slot.conn.poll(POLL_SECONDS):
                    if not slot.process.is_alive():
                        raise EOFError
                    continue
                msg = slot.conn.recv()
                if msg[0] == "progress":
                    job.progress(*msg[1:])
                elif msg[0] == "ok":
                    self.stats.duration(time.monotonic() - began)
                    job.finish(result=msg[1])
                    return True
                elif msg[0] == "error":
                    job.finish(error=msg[1])
                    return True
        except (EOFError, OSError, BrokenPipeError):
            job.finish(error=RequestError(
                grpc.StatusCode.INTERNAL, "the worker process died during synthesis "
                f"(exit code {slot.process.exitcode})", reason="WORKER_DIED"))
            return False
