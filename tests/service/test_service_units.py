"""The service's pure parts: size buckets, the byte-bounded cache, conversions, generated code."""

from __future__ import annotations

import itertools
import multiprocessing
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from service_helpers import quick_request

from choreo.collectives import MAX_SIZE, Collective
from choreo.generators import build
from choreo.msccl.packed import Codec, codec_of
from choreo.service import protos, work, worker
from choreo.service.api import pb
from choreo.service.buckets import plan_buckets
from choreo.service.cache import Memo, ResultCache, cache_key
from choreo.service.client import (
    RequestOptions,
    TenantRequest,
    bucket_body,
    bucket_member_ends,
    bucket_xml,
    build_request,
)
from choreo.service.convert import (
    DIALECTS,
    ENGINES,
    PROTOCOLS,
    Work,
    fabric_from_proto,
    fabric_to_proto,
    options_from_proto,
    spec_key,
    tenants_from_proto,
)
from choreo.service.flights import scope_of
from choreo.service.status import RequestError
from choreo.synth import auto_chunks


@pytest.mark.parametrize(("lo", "hi", "most"), [(1 << 20, 1 << 30, 4), (1, MAX_SIZE, 6),
                                                (4096, 4096, 4), (1, 3, 8), (100, 1000, 1)])
def test_buckets_cover_the_range_contiguously(lo: int, hi: int, most: int) -> None:
    buckets = plan_buckets(lo, hi, most, lambda size: 1 + size.bit_length() // 8)
    assert buckets[0].lo == lo and buckets[-1].hi == hi
    assert 1 <= len(buckets) <= most
    for a, b in itertools.pairwise(buckets):
        assert a.hi + 1 == b.lo
    for b in buckets:
        assert b.lo <= b.size <= b.hi
        assert b.chunks == 1 + b.size.bit_length() // 8


def test_buckets_pick_more_chunks_for_larger_sizes() -> None:
    fabric = build("3d-rfs-64")
    buckets = plan_buckets(1 << 20, 8 << 30, 4,
                           lambda s: auto_chunks(fabric, Collective.ALLREDUCE, s, 64))
    chunks = [b.chunks for b in buckets]
    assert chunks == sorted(chunks) and chunks[0] < chunks[-1]


def test_cache_evicts_least_recently_used_by_bytes() -> None:
    cache = ResultCache(max_bytes=100)
    cache.put("a", b"x" * 40)
    cache.put("b", b"y" * 40)
    assert cache.get("a") == b"x" * 40  # a is now the most recent
    cache.put("c", b"z" * 40)
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    assert cache.size == 80 and len(cache) == 2
    cache.put("huge", b"h" * 101)
    assert cache.get("huge") is None and cache.size == 80
    cache.put("a", b"x" * 10)
    assert cache.size == 50


def test_memo_is_bounded_by_count() -> None:
    memo: Memo[int] = Memo(2)
    memo.put("a", 1)
    memo.put("b", 2)
    memo.get("a")
    memo.put("c", 3)
    assert memo.get("b") is None and memo.get("a") == 1 and memo.get("c") == 3


@pytest.mark.parametrize("name", ["3d-rfs-16", "dgx-h100-2", "torus-4x4x4", "dgx1"])
def test_fabric_round_trip_keeps_the_fingerprint(name: str) -> None:
    fabric = build(name)
    back = fabric_from_proto(fabric_to_proto(fabric))
    assert back.fingerprint() == fabric.fingerprint()
    assert back == fabric


def test_unhealthy_links_and_failed_nodes_survive_the_round_trip() -> None:
    from choreo.transforms import apply_failures

    fabric = apply_failures(build("ring-8"), "npu:3,link:0-1")
    back = fabric_from_proto(fabric_to_proto(fabric))
    assert back.failed == frozenset({3})
    assert [lk.healthy for lk in back.links] == [lk.healthy for lk in fabric.links]
    assert not all(lk.healthy for lk in back.links)


def test_cache_key_ignores_defaults_spelled_out() -> None:
    implicit = pb.SynthesizeRequest(tenants=[pb.Tenant(
        name="t", npus=[0, 1], collectives=[pb.CollectiveSpec(collective="allreduce",
                                                              min_bytes=1024)])])
    explicit = pb.SynthesizeRequest(
        tenants=[pb.Tenant(name="t", npus=[0, 1], weight=1.0, collectives=[pb.CollectiveSpec(
            collective="AllReduce", min_bytes=1024, max_bytes=1024)])],
        options=pb.Options(engine="greedy", restarts=4, dialect="executor", instances=1,
                           proto="Simple", max_buckets=4, deadline_seconds=30))

    def key(req: pb.SynthesizeRequest) -> str:
        return cache_key("fp", spec_key(tenants_from_proto(req.tenants),
                                        options_from_proto(req.options)[0]))

    assert key(implicit) == key(explicit)
    explicit.options.seed = 1
    assert key(implicit) != key(explicit)
    assert cache_key("fp2", b"") != cache_key("fp", b"")


def test_scope_is_the_key_or_the_tenant_set() -> None:
    assert scope_of("", ["b", "a"]) == scope_of("", ["a", "b"])
    assert scope_of("", ["a"]) != scope_of("", ["a", "b"])
    assert scope_of("k", ["a"]) == scope_of("k", ["z"])


def test_request_error_packs_field_violations() -> None:
    from google.rpc import error_details_pb2, status_pb2
    from grpc_status import rpc_status

    err = RequestError(grpc.StatusCode.INVALID_ARGUMENT, "tenants: empty",
                       violations=[("tenants", "empty")], reason="BAD")
    status = err.to_status()
    key = rpc_status.GRPC_DETAILS_METADATA_KEY
    [(_, blob)] = [m for m in status.trailing_metadata if m[0] == key]
    decoded = status_pb2.Status.FromString(blob)
    bad = error_details_pb2.BadRequest()
    assert decoded.details[0].Unpack(bad)
    assert bad.field_violations[0].field == "tenants"
    assert decoded.code == 3


def test_options_agree_with_the_lowering_and_the_portfolio() -> None:
    from choreo import portfolio
    from choreo.msccl import layout

    assert DIALECTS == layout.DIALECTS
    assert PROTOCOLS == layout.PROTOCOLS
    assert set(ENGINES) == set(portfolio.ENGINES)


def test_generated_code_is_fresh_and_regenerates_when_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    protos.ensure()
    assert not protos.is_stale()
    monkeypatch.setattr(protos, "GEN_DIR", tmp_path / "gen")
    assert protos.is_stale()
    protos.generate()
    names = {p.name for p in (tmp_path / "gen").iterdir()}
    assert {"synthesizer_pb2.py", "synthesizer_pb2.pyi", "synthesizer_pb2_grpc.py",
            "__init__.py", ".stamp"} <= names
    grpc_code = (tmp_path / "gen" / "synthesizer_pb2_grpc.py").read_text()
    assert "from . import synthesizer_pb2" in grpc_code
    assert not protos.is_stale()


def _helper_work() -> Work:
    req = quick_request("helped", topology="dgx-h100-2", lo=1 << 20, hi=256 << 20)
    req.options.max_buckets = 4
    options, _ = options_from_proto(req.options)
    return Work(fabric_from_proto(req.fabric), tenants_from_proto(req.tenants), options, "k")


def _without_timing(raw: bytes) -> pb.SynthesizeResponse:
    response = pb.SynthesizeResponse.FromString(raw)
    response.synthesis_seconds = 0.0
    return response


def test_a_helper_process_changes_nothing_but_who_does_the_work() -> None:
    """Solves, judging and lowering shared with a real helper process give the very response
    the worker computes alone; a helper that dies mid-request leaves its tasks to the worker."""
    ctx = multiprocessing.get_context("forkserver")
    lend, borrow = ctx.Pipe()
    helper = ctx.Process(target=worker.helper_main, args=(borrow, "", 0), daemon=True)
    helper.start()
    borrow.close()
    try:
        job = _helper_work()
        alone = _without_timing(work.run(job, lambda *_: None))
        assert len(alone.tenants[0].collectives[0].buckets) == 4
        assert all(b.verification.ok for b in alone.tenants[0].collectives[0].buckets)
        shared = _without_timing(work.run(job, lambda *_: None, lend))
        assert shared == alone
        helper.kill()
        helper.join(timeout=10)
        orphaned = _without_timing(work.run(job, lambda *_: None, lend))
        assert orphaned == alone
    finally:
        helper.kill()
        helper.join(timeout=10)
        lend.close()


@pytest.mark.parametrize(("codec", "part_ends"), [("gzip", ()), ("zstd", ()), ("zstd", (8, 16))])
def test_large_files_come_compressed_one_member_per_part(
        codec: Codec, part_ends: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """A file from the size where it will be cut per pod comes in members (its head, each
    rank's element or each part's the tenant named, its tail) whose ends the bucket lists;
    the text is the plain answer's."""
    job = _helper_work()
    plain = _without_timing(work.run(job, lambda *_: None)).tenants[0].collectives[0].buckets
    tenants = tuple(replace(t, part_ends=part_ends) for t in job.tenants)
    packed = Work(job.fabric, tenants, replace(job.options, codec=codec), job.result_id)
    monkeypatch.setattr(work, "MEMBERS_FROM_BYTES", 0)
    members = _without_timing(work.run(packed, lambda *_: None)).tenants[0].collectives[0]
    assert [b.file_name for b in members.buckets] == [b.file_name for b in plain]
    assert sum(bool(b.file_name) for b in plain) >= 2  # the others: NCCL is faster there
    for a, b in ((a, b) for a, b in zip(plain, members.buckets, strict=True) if a.file_name):
        ends = bucket_member_ends(b)
        assert len(ends) == len(part_ends or range(16)) + 2 and not b.xml
        assert ends[-1] == len(bucket_body(b))
        assert bool(b.xml_zstd) == (codec == "zstd") != bool(b.xml_gzip)
        assert codec_of(b.xml_zstd or b.xml_gzip) == codec
        assert bucket_xml(b) == a.xml
    monkeypatch.setattr(work, "MEMBERS_FROM_BYTES", 1 << 40)
    whole = _without_timing(work.run(packed, lambda *_: None)).tenants[0].collectives[0]
    assert all(not bucket_member_ends(b) and bucket_xml(b) == a.xml
               for a, b in zip(plain, whole.buckets, strict=True))


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_a_request_gets_a_schedule_its_runtime_can_run(collective: str) -> None:
    """An MI250 request in RCCL's dialect (64 threadblocks a rank): the packed trees, which
    need 71 and 86, were refused as not lowerable; the engines now keep only what it runs."""
    fabric = build("mi250")
    req = build_request(fabric, [TenantRequest.one("amd", fabric.npus, collective, 1 << 30,
                                                   1 << 30)], RequestOptions("rccl"))
    options, _ = options_from_proto(req.options)
    job = Work(fabric_from_proto(req.fabric), tenants_from_proto(req.tenants), options, "k")
    bucket = _without_timing(work.run(job, lambda *_: None)).tenants[0].collectives[0].buckets[0]
    assert bucket.verification.ok and bucket.file_name and bucket.xml
    assert bucket.engine == "plane-gather"
