"""One request's work: synthesize every size bucket, judge it, lower it to MSCCL XML.

Runs inside a worker process and returns the serialized ``SynthesizeResponse``, so the
server can cache and send the bytes without touching them again.

Tenants in one request share the fabric, so they are synthesized jointly, one solve per
*round*: round (j, b) holds every tenant's j-th collective at its b-th size bucket (a tenant
with fewer buckets repeats its last). Only a tenant's own NPUs may forward its data, because
an MSCCL program may name nothing but the tenant's GPUs.
"""

from __future__ import annotations

import gzip
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from choreo.collectives import Demand
from choreo.errors import InfeasibleError, InputError
from choreo.hierarchy import applies, slices_for
from choreo.report import evaluate
from choreo.schedule import Schedule
from choreo.service.api import pb
from choreo.service.buckets import SizeBucket, plan_buckets
from choreo.service.convert import TenantSpec, Work
from choreo.service.status import RequestError, invalid
from choreo.synth import SynthOptions, auto_chunks, synthesize

MAX_ERRORS = 10

Say = Callable[[str, str, int, int], None]  # stage, message, done, total


@dataclass
class _Solved:
    bucket: SizeBucket
    schedule: Schedule
    prediction: pb.Prediction
    verification: pb.Verification


def run(work: Work, say: Say) -> bytes:
    """The whole request; choreo's errors become the status a client should see."""
    try:
        return _run(work, say)
    except InfeasibleError as err:
        raise RequestError(grpc.StatusCode.FAILED_PRECONDITION, str(err),
                           reason="INFEASIBLE") from None
    except InputError as err:
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, str(err),
                           violations=[("request", str(err))]) from None


def _run(work: Work, say: Say) -> bytes:
    started = time.perf_counter()
    fabric, tenants, opts = work.fabric, work.tenants, work.options
    plans = [[plan_buckets(c.min_bytes, c.max_bytes, _buckets(work, t, j), _chunker(work, t, j))
              for j, c in enumerate(t.collectives)] for t in tenants]
    rounds = [(j, b) for j in range(max(len(t.collectives) for t in tenants))
              for b in range(max(len(p[j]) for p in plans if len(p) > j))]
    total = len(rounds) * 2 + sum(len(p) for p in plans)
    done = 0
    solved: dict[tuple[int, int], list[_Solved]] = {}
    for j, b in rounds:
        members = [i for i, t in enumerate(tenants) if len(t.collectives) > j]
        picked = [plans[i][j][min(b, len(plans[i][j]) - 1)] for i in members]
        demands = [
            Demand(tenants[i].collectives[j].collective, tenants[i].npus, bk.size, bk.chunks,
                   tenants[i].collectives[j].root, tenants[i].weight, tenants[i].name)
            for i, bk in zip(members, picked, strict=True)
        ]
        say("synthesizing", f"collective {j} bucket {b}", done, total)
        sched = _solve(work, demands, len(rounds))
        done += 1
        say("evaluating", f"collective {j} bucket {b}", done, total)
        ev = evaluate(sched, baselines=False)
        done += 1
        errors = list(ev.verdict.errors[:MAX_ERRORS])
        for k, (i, bk) in enumerate(zip(members, picked, strict=True)):
            if b >= len(plans[i][j]):
                continue  # this tenant's range has fewer buckets; it only kept others company
            tr = ev.tenants[k]
            solved.setdefault((i, j), []).append(_Solved(
                bk, sched,
                pb.Prediction(time_seconds=tr.time, algbw_bytes_per_second=tr.algbw,
                              busbw_bytes_per_second=tr.busbw, lower_bound_seconds=tr.bound,
                              fraction_of_bound=tr.fraction_of_bound, bound_kind=tr.bound_kind),
                pb.Verification(ok=ev.verdict.ok, errors=errors, transfers=len(sched)),
            ))
    response = pb.SynthesizeResponse(fabric_fingerprint=fabric.fingerprint(), engine=opts.engine,
                                     result_id=work.result_id)
    for i, t in enumerate(tenants):
        out = response.tenants.add(name=t.name)
        for j, c in enumerate(t.collectives):
            members = [m for m, u in enumerate(tenants) if len(u.collectives) > j]
            say("lowering", f"{t.name} {c.collective.value}", done, total)
            files = _lower(solved[(i, j)], members.index(i), work, f"tenants[{i}].collectives[{j}]")
            done += len(solved[(i, j)])
            res = out.collectives.add(collective=c.collective.value)
            # The lowering names files after the tenant; keep a tenant's collectives apart.
            prefix = f"{j}-{c.collective.value}-" if len(t.collectives) > 1 else ""
            for s, (file_name, xml) in zip(solved[(i, j)], files, strict=True):
                bucket = res.buckets.add(
                    min_bytes=s.bucket.lo, max_bytes=s.bucket.hi,
                    representative_bytes=s.bucket.size, chunks=s.bucket.chunks,
                    file_name=prefix + file_name, prediction=s.prediction,
                    verification=s.verification, engine=s.schedule.engine)
                if opts.gzip:
                    bucket.xml_gzip = gzip.compress(xml.encode(), compresslevel=6, mtime=0)
                else:
                    bucket.xml = xml
    response.synthesis_seconds = time.perf_counter() - started
    return response.SerializeToString()


def _solve(work: Work, demands: list[Demand], rounds: int) -> Schedule:
    """Greedy directly; the other engines through the portfolio, sharing the time budget
    (a safety margin kept for evaluation and lowering) evenly among the rounds."""
    opts = work.options
    if opts.engine == "greedy":
        return synthesize(work.fabric, demands, SynthOptions(restarts=opts.restarts,
                                                             seed=opts.seed, relay=False))
    from choreo.portfolio import PortfolioOptions, solve

    budget = 0.6 * opts.engine_seconds / rounds
    return solve(work.fabric, demands, opts.engine, budget,
                 PortfolioOptions(restarts=opts.restarts, seed=opts.seed, relay=False))


def _hierarchical(work: Work, t: TenantSpec, j: int) -> bool:
    demand = Demand(t.collectives[j].collective, t.npus, 1)
    return applies(work.fabric, demand)


def _buckets(work: Work, t: TenantSpec, j: int) -> int:
    """The hierarchical plan's program has the same steps at every size (only its slices
    change), so one file serves the whole range; that keeps a 1000-GPU tenant's
    resynthesis to one solve, one check and one lowering."""
    return 1 if _hierarchical(work, t, j) else work.options.max_buckets


def _chunker(work: Work, t: TenantSpec, j: int) -> Callable[[int], int]:
    c = t.collectives[j]
    if c.chunks is not None:
        fixed = c.chunks
        return lambda _size: fixed
    if _hierarchical(work, t, j):
        return lambda size: slices_for(size, len(t.npus))
    return lambda size: auto_chunks(work.fabric, c.collective, size, len(t.npus))


def _lower(solved: list[_Solved], tenant: int, work: Work,
           where: str) -> list[tuple[str, str]]:
    """One MSCCL XML file per bucket, each serving its sizes ``lo..hi`` (inclusive).

    A schedule the runtime could not run (too many steps for the channels, a collective the
    dialect lacks) is the request's fault: INVALID_ARGUMENT on that collective.
    """
    from choreo import msccl

    opts = work.options
    buckets = [(s.bucket.lo, s.bucket.hi, s.schedule) for s in solved]
    try:
        files = msccl.bucket_files(buckets, tenant, dialect=opts.dialect,
                                   instances=opts.instances, proto=opts.proto)
    except InputError as err:
        raise invalid(where, f"cannot be lowered to MSCCL: {err}") from None
    if len(files) != len(solved):
        raise RuntimeError(f"{where}: {len(files)} MSCCL files for {len(solved)} buckets")
    return list(files)
