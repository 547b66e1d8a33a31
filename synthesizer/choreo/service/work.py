"""One request's work: synthesize every size bucket, judge it, lower it to MSCCL XML.

Runs inside a worker process and returns the serialized ``SynthesizeResponse``, so the
server can cache and send the bytes without touching them again.

Tenants in one request share the fabric, so they are synthesized jointly, one solve per
*round*: round (j, b) holds every tenant's j-th collective at its b-th size bucket (a tenant
with fewer buckets repeats its last). Only a tenant's own NPUs may forward its data, because
an MSCCL program may name nothing but the tenant's GPUs.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

import grpc

from choreo.collectives import Demand
from choreo.errors import InfeasibleError, InputError
from choreo.hierarchy import applies
from choreo.msccl.buckets import BucketFile, plan_files
from choreo.msccl.layout import max_buckets
from choreo.msccl.lower import Pack, lowerable
from choreo.msccl.packed import Codec, pack_xml
from choreo.nccl.compare import versus, versus_nccl
from choreo.report import Known, evaluate, known
from choreo.schedule import Schedule
from choreo.service.api import pb
from choreo.service.buckets import SizeBucket, plan_buckets
from choreo.service.convert import TenantSpec, Work
from choreo.service.status import RequestError, invalid
from choreo.synth import SynthOptions, auto_chunks, synthesize
from choreo.topology import Topology

MAX_ERRORS = 10
# Files from this size of text are compressed one member per part (a rank, or a pod's ranks
# the client named). Smaller ones, a tenth of that compressed, usually fit a ConfigMap
# whole, where members would only cost room (a 64-GPU file: a fifth more bytes per rank).
MEMBERS_FROM_BYTES = 8 << 20

Say = Callable[[str, str, int, int], None]  # stage, message, done, total


@dataclass
class _Solved:
    bucket: SizeBucket
    round: int
    member: int  # the tenant's index among the round's demands
    schedule: Schedule


@dataclass(frozen=True)
class _Solve:
    """One round: every member tenant's demand, synthesized jointly."""

    work: Work
    demands: tuple[Demand, ...]
    rounds: int

    def run(self) -> Schedule:
        return _solve(self.work, list(self.demands), self.rounds)


@dataclass(frozen=True)
class _Known:
    """What judging one round needs that its schedule does not change (``report.Known``):
    found while the round is solved, by the other process where there is a helper."""

    fabric: Topology
    demands: tuple[Demand, ...]

    def run(self) -> Known:
        return known(self.fabric, self.demands)


@dataclass(frozen=True)
class _Judge:
    """Verify and simulate one round's schedule: per tenant its prediction (against NCCL as
    it runs too), and the verdict. Plain values come back (the generated message classes do
    not pickle). ``found``: the round's ``Known``, where it was found beside the solve."""

    schedule: Schedule
    found: Known | None = None

    def run(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        found = self.found if self.found and self.found.serves(self.schedule.demands) else None
        ev = evaluate(self.schedule, baselines=False, found=found)
        predictions = []
        for t, (tr, demand) in enumerate(zip(ev.tenants, self.schedule.demands, strict=True)):
            p = dict(time_seconds=tr.time, algbw_bytes_per_second=tr.algbw,
                     busbw_bytes_per_second=tr.busbw, lower_bound_seconds=tr.bound,
                     fraction_of_bound=tr.fraction_of_bound, bound_kind=tr.bound_kind)
            vs = (versus(found.nccl[t], tr.time) if found is not None
                  else versus_nccl(self.schedule.fabric, demand, tr.time))
            if vs is not None:
                p.update(nccl_time_seconds=vs.nccl_s, nccl_choice=vs.choice,
                         speedup_vs_nccl=vs.speedup)
            predictions.append(p)
        return predictions, dict(ok=ev.verdict.ok, errors=ev.verdict.errors[:MAX_ERRORS],
                                 transfers=len(self.schedule))


@dataclass(frozen=True)
class _Encode:
    """Lower one bucket's file to MSCCL XML, compressed if the client asked."""

    file: BucketFile
    codec: Codec | None
    part_ends: tuple[int, ...] = ()  # the tenant's parts; empty: one per rank

    def run(self) -> tuple[str | bytes, list[int], int | None]:
        """The file's body, where its members end (a large file: one member per part, so
        the operator cuts it per pod without compressing again), and the upper end of the
        range it serves (legacy files stop where their scratch would grow too large)."""
        # zstd members are compressed where the compiled pass writes the elements
        pack = (Pack(self.part_ends, MEMBERS_FROM_BYTES) if self.codec == "zstd" else None)
        done = self.file.lowering(pack)
        if self.codec is None:
            return done.text, [], done.max_bytes
        if done.size < MEMBERS_FROM_BYTES:
            return pack_xml(done.text, self.codec), [], done.max_bytes
        body, ends = done.packed(self.codec, self.part_ends)
        return body, ends, done.max_bytes


Task = _Solve | _Known | _Judge | _Encode


def run(work: Work, say: Say, helper: Connection | None = None) -> bytes:
    """The whole request; choreo's errors become the status a client should see."""
    try:
        return _run(work, say, helper)
    except InfeasibleError as err:
        raise RequestError(grpc.StatusCode.FAILED_PRECONDITION, str(err),
                           reason="INFEASIBLE") from None
    except InputError as err:
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, str(err),
                           violations=[("request", str(err))]) from None


def _run(work: Work, say: Say, helper: Connection | None) -> bytes:
    started = time.perf_counter()
    fabric, tenants, opts = work.fabric, work.tenants, work.options
    plans = [[plan_buckets(c.min_bytes, c.max_bytes, _buckets(work, t, j), _chunker(work, t, j))
              for j, c in enumerate(t.collectives)] for t in tenants]
    rounds = [(j, b) for j in range(max(len(t.collectives) for t in tenants))
              for b in range(max(len(p[j]) for p in plans if len(p) > j))]
    total = 2 * len(rounds) + sum(len(p) for tenant in plans for p in tenant)  # progress steps
    # Rounds are independent solves, then judging and lowering each result are independent
    # too: the worker and its helper process share both stages.
    solves: list[Task] = []
    slots: dict[tuple[int, int], list[tuple[SizeBucket, int, int]]] = {}
    for r, (j, b) in enumerate(rounds):
        members = [i for i, t in enumerate(tenants) if len(t.collectives) > j]
        picked = [plans[i][j][min(b, len(plans[i][j]) - 1)] for i in members]
        solves.append(_Solve(work, tuple(
            Demand(tenants[i].collectives[j].collective, tenants[i].npus, bk.size, bk.chunks,
                   tenants[i].collectives[j].root, tenants[i].weight, tenants[i].name)
            for i, bk in zip(members, picked, strict=True)), len(rounds)))
        for k, (i, bk) in enumerate(zip(members, picked, strict=True)):
            if b < len(plans[i][j]):  # else it only kept the others company
                slots.setdefault((i, j), []).append((bk, r, k))
    # What judging needs that the schedules do not change is found beside the solves.
    knowns: list[Task] = [_Known(fabric, s.demands) for s in solves if isinstance(s, _Solve)]
    rounds_solved = 0

    def solving(_done: int, task: Task) -> None:
        nonlocal rounds_solved
        if isinstance(task, _Solve):
            rounds_solved += 1
            say("synthesizing", f"{rounds_solved} of {len(rounds)} rounds solved",
                rounds_solved, total)

    first_stage = _share(solves + knowns, helper, solving)
    schedules: list[Schedule] = first_stage[:len(rounds)]
    found: list[Known] = first_stage[len(rounds):]
    solved = {key: [_Solved(bk, r, k, schedules[r]) for bk, r, k in items]
              for key, items in slots.items()}
    files = {key: _files(items, work, f"tenants[{key[0]}].collectives[{key[1]}]")
             for key, items in solved.items()}
    judges: list[Task] = [_Judge(s, k) for s, k in zip(schedules, found, strict=True)]
    every = [(key, b) for key in solved for b in range(len(files[key]))]
    # One round leaves the helper idle while its schedule is judged: the files are lowered
    # meanwhile (here, where it was solved; the helper judges), and those NCCL is predicted
    # to beat are dropped unsent.
    ahead = helper is not None and len(schedules) == 1
    encodes: list[Task] = ([_encode(files[key][b], work, key[0]) for key, b in every]
                           if ahead else [])
    what = "schedules judged and files lowered" if ahead else "schedules judged"
    first = _share(judges + encodes, helper, lambda done, task: say(
        "lowering" if isinstance(task, _Encode) else "evaluating",
        f"{done} of {len(judges) + len(encodes)} {what}", len(rounds) + done, total))
    judged = first[:len(judges)]
    early = dict(zip(every, first[len(judges):], strict=True)) if ahead else {}

    def nccl_runs(s: _Solved) -> bool:
        """NCCL is predicted faster for this bucket (it gets no file, unless asked to), or
        its schedule failed verification (it never gets one: the verdict says why)."""
        if not judged[s.round][1]["ok"]:
            return True
        speedup = judged[s.round][0][s.member].get("speedup_vs_nccl")
        return not opts.ship_slower_than_nccl and speedup is not None and speedup < 1

    lowered = [(key, b) for key in solved for b, f in enumerate(files[key])
               if not nccl_runs(solved[key][f.bucket])]
    encoded = {kb: early[kb] for kb in lowered} if ahead else dict(zip(lowered, _share(
        [_encode(files[key][b], work, key[0]) for key, b in lowered], helper,
        lambda done, _task: say("lowering", f"{done} of {len(lowered)} files lowered",
                                2 * len(rounds) + done, total)), strict=True))
    response = pb.SynthesizeResponse(fabric_fingerprint=fabric.fingerprint(), engine=opts.engine,
                                     result_id=work.result_id)
    for i, t in enumerate(tenants):
        out = response.tenants.add(name=t.name)
        for j, c in enumerate(t.collectives):
            res = out.collectives.add(collective=c.collective.value)
            # The lowering names files after the tenant; keep a tenant's collectives apart.
            prefix = f"{j}-{c.collective.value}-" if len(t.collectives) > 1 else ""
            left_to_nccl: set[int] = set()
            for b, f in enumerate(files[(i, j)]):
                s = solved[(i, j)][f.bucket]
                predictions, verification = judged[s.round]
                common = dict(min_bytes=s.bucket.lo, representative_bytes=s.bucket.size,
                              chunks=s.schedule.demands[s.member].chunks,
                              prediction=pb.Prediction(**predictions[s.member]),
                              verification=pb.Verification(**verification),
                              engine=s.schedule.engine)
                if ((i, j), b) not in encoded:
                    if f.bucket not in left_to_nccl:  # one entry per range, whatever the kinds
                        left_to_nccl.add(f.bucket)
                        res.buckets.add(max_bytes=s.bucket.hi, nccl_runs=True, **common)
                    continue
                body, ends, served = _lowered(encoded[((i, j), b)],
                                              f"tenants[{i}].collectives[{j}]")
                bucket = res.buckets.add(
                    max_bytes=s.bucket.hi if served is None else served,
                    file_name=prefix + f.name, **common)
                if isinstance(body, bytes) and opts.codec == "zstd":
                    bucket.xml_zstd = body
                    bucket.xml_zstd_frame_ends.extend(ends)
                elif isinstance(body, bytes):
                    bucket.xml_gzip = body
                    bucket.xml_gzip_member_ends.extend(ends)
                else:
                    bucket.xml = body
    response.synthesis_seconds = time.perf_counter() - started
    return response.SerializeToString()


def _encode(file: BucketFile, work: Work, tenant: int) -> _Encode:
    return _Encode(file, work.options.codec, work.tenants[tenant].part_ends)


def _share(tasks: list[Task], helper: Connection | None,
           progress: Callable[[int, Task], None]) -> list[Any]:
    """Run ``tasks`` here and in the helper process, each taking the next task whenever it is
    free (a thread hands them to the helper and waits for its answers, which releases the
    GIL). Longest first, so neither side is left with a long one at the end; the first here.
    Results (or the exception a task raised) by task index."""
    results: list[Any] = [None] * len(tasks)
    todo = collections.deque(sorted(range(len(tasks)), key=lambda k: -_cost(tasks[k])))
    lock = threading.Lock()
    done = 0

    def take() -> int | None:
        with lock:
            return todo.popleft() if todo else None

    def finished(k: int, result: Any) -> None:
        nonlocal done
        with lock:
            results[k] = result
            done += 1
            progress(done, tasks[k])

    def lend(conn: Connection) -> None:
        while (k := take()) is not None:
            try:
                conn.send(tasks[k])
                result = conn.recv()
            except Exception:  # the helper died (or cannot take it): the task goes back
                with lock:
                    todo.appendleft(k)
                return
            finished(k, result)

    # The longest task runs here: its result stays in this process. A 1,024-GPU schedule
    # the helper solved took 0.08 s to unpickle here, and as much again in the helper to
    # lower it; solved here, it is lowered here while the helper judges a copy.
    k = take()
    feeder = threading.Thread(target=lend, args=(helper,), daemon=True) if helper else None
    if feeder is not None:
        feeder.start()
    while True:
        if k is None:
            if feeder is None or not feeder.is_alive():
                break
            feeder.join()  # it may hand back a task if the helper dies
            feeder = None
            k = take()
            continue
        result: Any
        try:
            result = tasks[k].run()
        except Exception as err:
            result = err
        finished(k, result)
        k = take()
    for task, r in zip(tasks, results, strict=True):
        if isinstance(r, BaseException) and not isinstance(task, _Encode):
            raise r
    return results  # a file's error is raised where the file is used (``_lowered``)


def _cost(task: Task) -> float:
    """Rough relative run time: lowering costs about twice what judging does per transfer;
    a solve, by its demands' chunks."""
    if isinstance(task, _Solve):
        return float(sum(d.num_chunks * d.n for d in task.demands))
    if isinstance(task, _Known):  # after every solve: the solves stay here first
        return 0.0
    if isinstance(task, _Encode):
        return 2.0 * float(task.file.schedule.count.sum())
    return float(task.schedule.count.sum())


def _lowered(result: Any, where: str) -> tuple[str | bytes, list[int], int | None]:
    """A lowering's result; a schedule the runtime could not run (too many steps for the
    channels, a collective the dialect lacks) is the request's fault."""
    if isinstance(result, InputError):
        raise invalid(where, f"cannot be lowered to MSCCL: {result}")
    if isinstance(result, BaseException):
        raise result
    return result


def _solve(work: Work, demands: list[Demand], rounds: int) -> Schedule:
    """Greedy directly; the other engines through the portfolio, sharing the time budget
    (a safety margin kept for evaluation and lowering) evenly among the rounds."""
    opts = work.options
    # Several MSCCL instances split every transfer's chunk: the rail plan's transfers move
    # chunk ranges, which the lowering then refuses.
    rail = opts.instances == 1
    runs = partial(lowerable, dialect=opts.dialect, instances=opts.instances, proto=opts.proto)
    if opts.engine == "greedy":
        return synthesize(work.fabric, demands, SynthOptions(
            restarts=opts.restarts, seed=opts.seed, relay=False, rail_gather=rail,
            accept=runs))
    from choreo.portfolio import PortfolioOptions, solve

    budget = 0.6 * opts.engine_seconds / rounds
    return solve(work.fabric, demands, opts.engine, budget, PortfolioOptions(
        restarts=opts.restarts, seed=opts.seed, relay=False, rail_gather=rail, accept=runs))


def _hierarchical(work: Work, t: TenantSpec, j: int) -> bool:
    demand = Demand(t.collectives[j].collective, t.npus, 1)
    return applies(work.fabric, demand)


def _buckets(work: Work, t: TenantSpec, j: int) -> int:
    """The hierarchical plan's program has the same steps at every size (only its slices
    change), so one file serves the whole range; that keeps a 1000-GPU tenant's
    resynthesis to one solve, one check and one lowering. The legacy runtime loads at most
    four files, two per bucket where it needs in-place and out-of-place ones."""
    if _hierarchical(work, t, j):
        return 1
    c = t.collectives[j]
    wanted = c.max_buckets or work.options.max_buckets
    most = max_buckets(c.collective, work.options.dialect)
    return wanted if most is None else min(most, wanted)


def _chunker(work: Work, t: TenantSpec, j: int) -> Callable[[int], int]:
    c = t.collectives[j]
    if c.chunks is not None:
        fixed = c.chunks
        return lambda _size: fixed
    if _hierarchical(work, t, j):
        return lambda _size: 1  # the plan cuts its own slices (choreo.hierarchy.slicing)
    return lambda size: auto_chunks(work.fabric, c.collective, size, len(t.npus))


def _files(solved: list[_Solved], work: Work, where: str) -> list[BucketFile]:
    """One MSCCL file per bucket, each serving its sizes ``lo..hi`` (inclusive)."""
    opts = work.options
    buckets = [(s.bucket.lo, s.bucket.hi, s.schedule) for s in solved]
    try:
        files = plan_files(buckets, solved[0].member, dialect=opts.dialect,
                           instances=opts.instances, proto=opts.proto)
    except InputError as err:
        raise invalid(where, f"cannot be lowered to MSCCL: {err}") from None
    if {f.bucket for f in files} != set(range(len(solved))):
        raise RuntimeError(f"{where}: {len(files)} MSCCL files for {len(solved)} buckets")
    return files
