"""The Synthesize RPC against a real server: results, cache, streaming and every bad input."""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from service_helpers import Running, quick_request

from choreo.generators import build
from choreo.service.api import MAX_MESSAGE_BYTES, pb
from choreo.service.client import (
    RequestOptions,
    TenantRequest,
    bucket_body,
    bucket_xml,
    build_request,
)
from choreo.service.convert import fabric_to_proto
from choreo.service.status import details_of
from choreo.topology import NodeKind, Topology, duplex


def _fail(served: Running, request: pb.SynthesizeRequest | bytes) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        served.client.synthesize(request, timeout=60)
    return info.value


def test_ok_returns_xml_predictions_and_verdict_per_bucket(served: Running) -> None:
    from choreo import msccl

    fabric = build("3d-rfs-16")
    resp = served.client.synthesize(quick_request("ok-tenant", seed=11), timeout=120)
    assert not resp.cache_hit
    assert resp.fabric_fingerprint == fabric.fingerprint()
    assert resp.engine == "greedy"
    [tenant] = resp.tenants
    assert tenant.name == "ok-tenant"
    [coll] = tenant.collectives
    assert coll.collective == "allreduce"
    assert len(coll.buckets) == 2
    assert coll.buckets[0].min_bytes == 1 << 20 and coll.buckets[-1].max_bytes == 64 << 20
    assert coll.buckets[0].max_bytes + 1 == coll.buckets[1].min_bytes  # contiguous
    names = {b.file_name for b in coll.buckets}
    assert len(names) == 2
    for b in coll.buckets:
        assert b.min_bytes <= b.representative_bytes <= b.max_bytes
        assert b.verification.ok and b.verification.transfers > 0
        p = b.prediction
        assert p.time_seconds > 0 and p.algbw_bytes_per_second > 0
        assert p.busbw_bytes_per_second == pytest.approx(p.algbw_bytes_per_second * 2 * 15 / 16)
        assert 0 < p.fraction_of_bound <= 1.0 + 1e-9
        assert p.lower_bound_seconds == pytest.approx(p.fraction_of_bound * p.time_seconds)
        assert msccl.validate(b.xml) == [], b.file_name
    # larger messages get more bandwidth out of the same fabric
    assert (coll.buckets[1].prediction.algbw_bytes_per_second
            > coll.buckets[0].prediction.algbw_bytes_per_second)


def test_several_tenants_and_collectives_share_one_fabric(served: Running) -> None:
    from choreo import msccl

    fabric = build("3d-rfs-16")
    request = build_request(fabric, [
        TenantRequest.one("train", list(range(8)), "allreduce", 1 << 20, 256 << 20, weight=2.0),
        TenantRequest.one("infer", list(range(15, 7, -1)), "allgather", 4 << 20),
    ], RequestOptions(max_buckets=3))
    request.tenants[0].collectives.add(collective="reducescatter", min_bytes=8 << 20)
    # A collective's own bucket count overrides the request's, for it alone.
    request.tenants[0].collectives.add(collective="allgather", min_bytes=1 << 20,
                                       max_bytes=64 << 20, max_buckets=2)
    resp = served.client.synthesize(request, timeout=120)
    train, infer = resp.tenants
    assert (train.name, infer.name) == ("train", "infer")
    assert [c.collective for c in train.collectives] == ["allreduce", "reducescatter",
                                                         "allgather"]
    assert [len(c.buckets) for c in train.collectives] == [3, 1, 2]
    assert [c.collective for c in infer.collectives] == ["allgather"]
    assert len(infer.collectives[0].buckets) == 1
    for t in resp.tenants:
        for c in t.collectives:
            for b in c.buckets:
                assert b.verification.ok and b.prediction.time_seconds > 0
                assert msccl.validate(b.xml) == [], b.file_name
                assert 'ngpus="8"' in b.xml
    files = [b.file_name for t in resp.tenants for c in t.collectives for b in c.buckets]
    assert len(set(files)) == len(files)
    assert files[0].startswith("0-allreduce-train") and files[3].startswith("1-reducescatter")
    assert files[4].startswith("2-allgather-train")


def test_gathers_under_a_spine_get_the_rail_plan_jointly(served: Running) -> None:
    """Two AllGather tenants with two nodes in every block of a 2:1 spine: the served
    schedule is the rail plan that crosses the spine once per block, ahead of NCCL for both,
    verified, and its files pass the validator."""
    from choreo import msccl

    fabric = build("dgx-h100-spine-4x4")
    tenants = [TenantRequest.one(f"t{t}", [g for b in range(4) for i in range(2)
                                           for g in range(8 * (4 * b + 2 * t + i),
                                                          8 * (4 * b + 2 * t + i) + 8)],
                                 "allgather", 1 << 30) for t in range(2)]
    resp = served.client.synthesize(build_request(fabric, tenants), timeout=120)
    for tenant in resp.tenants:
        [bucket] = tenant.collectives[0].buckets
        assert bucket.engine == "rail-gather" and bucket.verification.ok
        assert bucket.prediction.speedup_vs_nccl > 1.15
        assert msccl.validate(bucket.xml) == [], bucket.file_name


def test_legacy_gets_an_in_place_and_an_out_of_place_file_per_range(served: Running) -> None:
    from choreo import msccl

    request = build_request(build("3d-rfs-16"), [
        TenantRequest.one("old", list(range(8)), "allreduce", 1 << 20, 256 << 20)],
        RequestOptions(dialect="legacy", max_buckets=4))
    [coll] = served.client.synthesize(request, timeout=120).tenants[0].collectives
    kinds = [(b.min_bytes, b.max_bytes, 'inplace="1"' in b.xml) for b in coll.buckets]
    ranges = sorted({(lo, hi) for lo, hi, _ in kinds})
    assert len(ranges) == 2  # four files: the legacy runtime loads no more
    assert sorted(kinds) == sorted((lo, hi, ip) for lo, hi in ranges for ip in (False, True))
    for b in coll.buckets:
        assert msccl.validate(b.xml, "legacy") == [], b.file_name
        assert msccl.run(b.xml).ok
    assert len({b.file_name for b in coll.buckets}) == 4


def test_sizes_nccl_runs_faster_get_no_file_unless_asked(served: Running) -> None:
    """One H100 node, AllReduce: NCCL's NVLS (in-switch reduction, which MSCCL cannot use)
    wins at large sizes, choreo at small ones. Shipping a file where NCCL is faster would slow
    the job down; the bucket says so instead, and ship_slower_than_nccl ships it anyway."""
    from choreo import msccl

    tenants = [TenantRequest.one("one-node", build("dgx-h100-1").npus, "allreduce", 1 << 20,
                                 1 << 30)]
    gated = served.client.synthesize(build_request(build("dgx-h100-1"), tenants,
                                                   RequestOptions(max_buckets=2)), timeout=120)
    [coll] = gated.tenants[0].collectives
    small, large = coll.buckets
    for b in coll.buckets:
        p = b.prediction
        assert p.nccl_choice and p.nccl_time_seconds > 0
        assert p.speedup_vs_nccl == pytest.approx(p.nccl_time_seconds / p.time_seconds)
        assert b.nccl_runs == (p.speedup_vs_nccl < 1)
        assert (b.xml == "" and b.file_name == "") == b.nccl_runs
    assert not small.nccl_runs and msccl.validate(small.xml) == []
    assert large.nccl_runs and large.prediction.nccl_choice.startswith("nvls/")
    assert large.max_bytes == 1 << 30 and small.max_bytes + 1 == large.min_bytes

    forced = served.client.synthesize(build_request(
        build("dgx-h100-1"), tenants, RequestOptions(max_buckets=2, ship_slower_than_nccl=True)),
        timeout=120)
    [coll] = forced.tenants[0].collectives
    assert [b.nccl_runs for b in coll.buckets] == [False, False]
    assert msccl.validate(coll.buckets[1].xml) == []
    assert coll.buckets[1].prediction == large.prediction
    assert forced.result_id != gated.result_id


@pytest.mark.parametrize("encoding", [pb.Options.XML_GZIP, pb.Options.XML_ZSTD])
def test_compressed_encodings_carry_the_same_xml_smaller(served: Running, encoding: int) -> None:
    plain = served.client.synthesize(quick_request("gz", seed=17), timeout=120)
    request = quick_request("gz", seed=17)
    request.options.xml_encoding = encoding  # type: ignore[assignment]
    packed = served.client.synthesize(request, timeout=120)
    assert not packed.cache_hit  # a different answer, cached separately
    for a, b in zip(plain.tenants[0].collectives[0].buckets,
                    packed.tenants[0].collectives[0].buckets, strict=True):
        assert b.xml == "" and a.xml_gzip == a.xml_zstd == b""
        assert bool(b.xml_zstd) == (encoding == pb.Options.XML_ZSTD) != bool(b.xml_gzip)
        assert bucket_xml(b) == a.xml
        assert len(bucket_body(b)) * 5 < len(a.xml)
    assert packed.ByteSize() * 3 < plain.ByteSize()


def test_second_identical_request_is_a_fast_cache_hit(served: Running) -> None:
    request = quick_request("cache-tenant", seed=12)
    t0 = time.perf_counter()
    first = served.client.synthesize(request, timeout=120)
    fresh = time.perf_counter() - t0
    hits_before = served.server.metrics.cache_hits._value.get()
    t0 = time.perf_counter()
    second = served.client.synthesize(request, timeout=30)
    cached = time.perf_counter() - t0
    assert not first.cache_hit and second.cache_hit
    second.cache_hit = False
    assert second == first
    assert cached < fresh / 5, (cached, fresh)
    assert served.server.metrics.cache_hits._value.get() == hits_before + 1


def test_idempotency_key_and_deadline_do_not_change_the_cache_key(served: Running) -> None:
    served.client.synthesize(quick_request("key-tenant", seed=13, key="a"), timeout=120)
    again = served.client.synthesize(quick_request("key-tenant", seed=13, key="b",
                                                   deadline=99), timeout=30)
    assert again.cache_hit
    other = served.client.synthesize(quick_request("key-tenant", seed=14, key="b"), timeout=120)
    assert not other.cache_hit


def test_portfolio_engine_within_the_deadline_hint(served: Running) -> None:
    request = quick_request("auto-tenant", topology="ring-8", lo=1 << 20, hi=1 << 20,
                            deadline=8.0)
    request.options.engine = "auto"
    t0 = time.perf_counter()
    resp = served.client.synthesize(request, timeout=60)
    assert time.perf_counter() - t0 < 8.0
    [bucket] = resp.tenants[0].collectives[0].buckets
    assert bucket.verification.ok and bucket.engine
    assert resp.engine == "auto"
    greedy = quick_request("auto-tenant", topology="ring-8", lo=1 << 20, hi=1 << 20,
                           deadline=8.0)
    assert served.client.synthesize(greedy, timeout=60).result_id != resp.result_id


def test_known_result_id_is_answered_not_modified(served: Running) -> None:
    full = served.client.synthesize(quick_request("etag", seed=18), timeout=120)
    assert len(full.result_id) == 64
    again = quick_request("etag", seed=18)
    again.known_result_id = full.result_id
    short = served.client.synthesize(again, timeout=30)
    assert short.not_modified and short.result_id == full.result_id
    assert len(short.tenants) == 0 and short.ByteSize() < 300
    assert short.fabric_fingerprint == full.fabric_fingerprint
    stale = quick_request("etag", seed=19)
    stale.known_result_id = full.result_id
    other = served.client.synthesize(stale, timeout=120)
    assert not other.not_modified and other.result_id != full.result_id
    assert other.tenants[0].collectives[0].buckets


def test_result_ids_hold_across_servers_without_solving(
        served: Running, server_factory: Callable[..., Running]) -> None:
    full = served.client.synthesize(quick_request("portable", seed=20), timeout=120)
    fresh = server_factory(workers=1, queue=1)
    request = quick_request("portable", seed=20)
    request.known_result_id = full.result_id
    assert fresh.client.synthesize(request, timeout=30).not_modified
    assert fresh.server.metrics.cache_misses._value.get() == 0
    request.known_result_id = ""
    again = fresh.client.synthesize(request, timeout=120)
    assert again.result_id == full.result_id and not again.cache_hit


def test_stream_reports_progress_then_the_result(served: Running) -> None:
    events = list(served.client.stream(quick_request("stream-tenant", seed=15), timeout=120))
    stages = [e.progress.stage for e in events if e.WhichOneof("event") == "progress"]
    assert stages[0] == "queued"
    assert {"started", "synthesizing", "evaluating", "lowering"} <= set(stages)
    assert events[-1].WhichOneof("event") == "result"
    assert all(e.WhichOneof("event") == "progress" for e in events[:-1])
    done = [e.progress.done for e in events if e.progress.total]
    assert done == sorted(done)
    result = events[-1].result
    assert "<algo" in result.tenants[0].collectives[0].buckets[0].xml
    cached = list(served.client.stream(quick_request("stream-tenant", seed=15), timeout=30))
    assert len(cached) == 1 and cached[0].result.cache_hit


def _bad_requests() -> list[tuple[str, pb.SynthesizeRequest | bytes, str]]:
    fabric = build("3d-rfs-16")
    good = quick_request("bad")
    cases: list[tuple[str, pb.SynthesizeRequest | bytes, str]] = []

    def case(name: str, field: str, edit: object) -> None:
        req = pb.SynthesizeRequest()
        req.CopyFrom(good)
        edit(req)  # type: ignore[operator]
        cases.append((name, req, field))

    cases.append(("not protobuf", b"\xff\xff\xff\xff garbage", "request"))
    case("no fabric", "fabric", lambda r: r.ClearField("fabric"))
    case("no tenants", "tenants", lambda r: r.ClearField("tenants"))
    case("empty npu list", "tenants[0].npus", lambda r: r.tenants[0].ClearField("npus"))
    case("npu not in fabric", "tenants[0].npus[1]", lambda r: r.tenants[0].npus.__setitem__(1, 999))
    case("switch as npu", "tenants[0].npus[0]",
         lambda r: r.tenants[0].npus.__setitem__(0, fabric.switches[0]))
    case("npu twice", "tenants[0].npus[1]", lambda r: r.tenants[0].npus.__setitem__(1, 0))
    case("zero bytes", "tenants[0].collectives[0].min_bytes",
         lambda r: setattr(r.tenants[0].collectives[0], "min_bytes", 0))
    case("over 1 TiB", "tenants[0].collectives[0].max_bytes",
         lambda r: setattr(r.tenants[0].collectives[0], "max_bytes", (1 << 40) + 1))
    case("range backwards", "tenants[0].collectives[0].max_bytes",
         lambda r: setattr(r.tenants[0].collectives[0], "max_bytes", 1))
    case("unknown collective", "tenants[0].collectives[0].collective",
         lambda r: setattr(r.tenants[0].collectives[0], "collective", "allsmash"))
    case("no collectives", "tenants[0].collectives",
         lambda r: r.tenants[0].ClearField("collectives"))
    case("zero chunks", "tenants[0].collectives[0].chunks",
         lambda r: setattr(r.tenants[0].collectives[0], "chunks", 0))
    case("too many buckets", "tenants[0].collectives[0].max_buckets",
         lambda r: setattr(r.tenants[0].collectives[0], "max_buckets", 17))
    case("no tenant name", "tenants[0].name", lambda r: setattr(r.tenants[0], "name", ""))
    case("negative weight", "tenants[0].weight", lambda r: setattr(r.tenants[0], "weight", -1))
    case("relay through others", "tenants[0].relay",
         lambda r: setattr(r.tenants[0], "relay", pb.Tenant.RELAY_THROUGH_OTHERS))
    case("parts not increasing", "tenants[0].part_ends[1]",
         lambda r: r.tenants[0].part_ends.extend([4, 4, len(r.tenants[0].npus)]))
    case("parts short of the ranks", "tenants[0].part_ends[0]",
         lambda r: r.tenants[0].part_ends.append(len(r.tenants[0].npus) - 1))
    case("unknown xml encoding", "options.xml_encoding",
         lambda r: setattr(r.options, "xml_encoding", 7))
    case("zero bandwidth", "fabric.links[3].bandwidth_bytes_per_second",
         lambda r: setattr(r.fabric.links[3], "bandwidth_bytes_per_second", 0))
    case("link to nowhere", "fabric.links[0].dst",
         lambda r: setattr(r.fabric.links[0], "dst", 10_000))
    case("unknown link kind", "fabric.links[2].kind",
         lambda r: setattr(r.fabric.links[2], "kind", "carrier-pigeon"))
    case("no nodes", "fabric.nodes", lambda r: r.fabric.ClearField("nodes"))
    case("failed node out of range", "fabric.failed_nodes[0]",
         lambda r: r.fabric.failed_nodes.append(5000))
    case("unknown engine", "options.engine", lambda r: setattr(r.options, "engine", "oracle"))
    case("unknown dialect", "options.dialect", lambda r: setattr(r.options, "dialect", "xla"))
    case("unknown protocol", "options.proto", lambda r: setattr(r.options, "proto", "LL256"))
    case("too many restarts", "options.restarts",
         lambda r: setattr(r.options, "restarts", 10_000))
    case("negative deadline", "options.deadline_seconds",
         lambda r: setattr(r.options, "deadline_seconds", -1))

    def duplicate_tenant(r: pb.SynthesizeRequest) -> None:
        r.tenants.append(r.tenants[0])

    case("duplicate tenant", "tenants[1].name", duplicate_tenant)
    return cases


@pytest.mark.parametrize(("name", "request_", "field"), _bad_requests(),
                         ids=[c[0] for c in _bad_requests()])
def test_invalid_argument_names_the_field(served: Running, name: str,
                                          request_: pb.SynthesizeRequest | bytes,
                                          field: str) -> None:
    err = _fail(served, request_)
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, (name, err.details())
    bad = details_of(err)["BadRequest"]
    assert [v.field for v in bad.field_violations] == [field]  # type: ignore[attr-defined]
    assert err.details().startswith(field)


def test_disconnected_tenant_is_failed_precondition(served: Running) -> None:
    fabric = build("ring-8")
    snapshot = fabric_to_proto(fabric)
    for link in snapshot.links:  # cut the ring between 1|2 and 5|6: two halves
        if {link.src, link.dst} in ({1, 2}, {5, 6}):
            link.healthy = False
    tenants = [TenantRequest.one("halves", [0, 1, 2, 3], "allgather", 1 << 20)]
    err = _fail(served, build_request(snapshot, tenants))
    assert err.code() is grpc.StatusCode.FAILED_PRECONDITION
    details = details_of(err)
    info = details["ErrorInfo"]
    assert info.reason == "TENANT_DISCONNECTED"  # type: ignore[attr-defined]
    assert info.metadata["tenant"] == "halves"  # type: ignore[attr-defined]
    [violation] = details["PreconditionFailure"].violations  # type: ignore[attr-defined]
    assert violation.subject == "tenants[0]"
    assert "disconnected" in err.details()


def test_failed_npu_is_failed_precondition(served: Running) -> None:
    snapshot = fabric_to_proto(build("ring-8"))
    snapshot.failed_nodes.append(2)
    err = _fail(served, build_request(snapshot, [TenantRequest.one("t", [0, 1, 2], "allgather",
                                                                   1 << 20)]))
    assert err.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert details_of(err)["ErrorInfo"].reason == "NPU_FAILED"  # type: ignore[attr-defined]



def test_an_exact_model_too_large_is_invalid_argument_and_the_worker_lives(
        served: Running) -> None:
    """engine milp on a 23-rank AllToAll of switch2d-8x4: refused with the model's size, not
    a worker grown to the machine's memory and killed (INTERNAL "worker died")."""
    fabric = build("switch2d-8x4")
    tenants = [TenantRequest.one("big", fabric.npus[:23], "alltoall", 16 << 20, chunks=2)]
    request = build_request(fabric, tenants, RequestOptions(engine="milp",
                                                             deadline_seconds=20))
    err = _fail(served, request)
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert "engine milp" in err.details() and "above its limit" in err.details()
    resp = served.client.synthesize(quick_request("after"), timeout=60)
    assert resp.tenants[0].collectives[0].buckets


def test_a_schedule_that_fails_verification_ships_no_file(served: Running) -> None:
    """Links eighteen orders of magnitude apart (1 B/s beside 1e15 B/s, alphas of 100 s)
    are beyond float64: greedy's schedule for a 1-byte AllReduce fails verification. The
    bucket carries the verdict and leaves the size to NCCL; no file is handed out."""
    pairs = [(0, 1, 0.0, 1.0), (0, 2, 100.0, 1e3), (0, 3, 1.0, 1e15), (0, 4, 0.0, 1e15),
             (3, 4, 1e-3, 1e3), (0, 5, 1e-3, 1.0), (1, 5, 1e-12, 1e3), (2, 5, 1.0, 1.0),
             (4, 5, 1.0, 1e15)]
    fabric = Topology("unlike", (NodeKind.NPU,) * 5 + (NodeKind.SWITCH,), tuple(
        lk for a, b, alpha, bw in pairs for lk in duplex(a, b, alpha, bw)))
    request = build_request(fabric, [TenantRequest.one("t", [0, 1, 4], "allreduce", 1,
                                                       chunks=1)],
                            RequestOptions(ship_slower_than_nccl=True))
    [bucket] = served.client.synthesize(request, timeout=60).tenants[0].collectives[0].buckets
    assert not bucket.verification.ok and bucket.verification.errors
    assert bucket.nccl_runs and not bucket.xml and not bucket.xml_gzip and not bucket.file_name

def test_request_over_the_size_limit_is_refused_by_the_server(served: Running) -> None:
    big = quick_request("big")
    big.fabric.name = "x" * (MAX_MESSAGE_BYTES + (1 << 20))
    # a client that would send it, so the refusal is the server's
    with grpc.insecure_channel(served.address, options=[
            ("grpc.max_send_message_length", 2 * MAX_MESSAGE_BYTES)]) as channel:
        call = channel.unary_unary("/choreo.synthesizer.v1.Synthesizer/Synthesize",
                                   request_serializer=pb.SynthesizeRequest.SerializeToString,
                                   response_deserializer=pb.SynthesizeResponse.FromString)
        with pytest.raises(grpc.RpcError) as info:
            call(big, timeout=60)
    err = info.value
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Received message larger than max" in err.details()
    ok = served.client.synthesize(quick_request("after-big", seed=21), timeout=120)
    assert ok.tenants[0].collectives[0].buckets[0].verification.ok


def test_server_keeps_serving_while_bad_requests_pour_in(served: Running) -> None:
    bad = [r for _, r, _ in _bad_requests()]
    codes: list[grpc.StatusCode] = []

    def hammer() -> None:
        for _ in range(3):
            for req in bad:
                try:
                    served.client.synthesize(req, timeout=30)
                except grpc.RpcError as err:
                    codes.append(err.code())

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    good = served.client.synthesize(quick_request("survivor", seed=16), timeout=120)
    for t in threads:
        t.join(timeout=120)
    assert good.tenants[0].collectives[0].buckets[0].verification.ok
    assert len(codes) == 4 * 3 * len(bad)
    assert set(codes) == {grpc.StatusCode.INVALID_ARGUMENT}


def _remote_args(served: Running, *argv: str) -> argparse.Namespace:
    """Parse with the real ``choreo`` parser plus what ``register`` adds to it."""
    from choreo.cli import _parser
    from choreo.service.cli import register

    parser = _parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if "serve" not in sub.choices:
        register(sub)
    return parser.parse_args(["synthesize", "--remote", served.address, "-t", "3d-rfs-16",
                              "-c", "allgather", "-s", "16MiB", "--restarts", "2", *argv])


def test_remote_cli_writes_xml_and_summary(served: Running, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from choreo import msccl
    from choreo.service.cli import remote_synthesize

    out, xml_dir = tmp_path / "out", tmp_path / "msccl"
    args = _remote_args(served, "-o", str(out), "--msccl-out", str(xml_dir),
                        "--max-size", "256MiB")
    assert remote_synthesize(args) == 0
    printed = capsys.readouterr().out
    assert "tenant0: allgather" in printed and "verified" in printed
    xmls = sorted(xml_dir.glob("*.xml"))
    assert len(xmls) == 4  # 16..256 MiB in the default 4 buckets
    for path in xmls:
        assert msccl.validate(path.read_text()) == []
        assert (out / path.name).read_text() == path.read_text()
    summary = json.loads((out / "summary.json").read_text())
    buckets = summary["tenants"][0]["collectives"][0]["buckets"]
    assert [b["fileName"] for b in buckets] == [p.name for p in xmls]
    assert all("xml" not in b and b["verification"]["ok"] for b in buckets)
    assert int(buckets[0]["minBytes"]) == 16 << 20 and int(buckets[-1]["maxBytes"]) == 256 << 20


def test_remote_cli_writes_a_node_file_each_for_a_communicator_over_1024_ranks(
        served: Running, tmp_path: Path) -> None:
    from choreo import msccl
    from choreo.service.cli import remote_synthesize

    xml_dir = tmp_path / "msccl"
    args = _remote_args(served, "-t", "dgx-h100-130", "-s", "64MiB", "--msccl-out",
                        str(xml_dir))
    assert remote_synthesize(args) == 0
    [folder] = list(xml_dir.iterdir())  # no whole file: no runtime loads 1,040 <gpu>
    assert folder.is_dir() and len(list(folder.iterdir())) == 130
    text = (folder / "node77.xml").read_text()
    assert text.count("<gpu ") == 8 and msccl.validate(text) == []


def test_remote_cli_reports_the_status_and_field(served: Running) -> None:
    from choreo.errors import ChoreoError
    from choreo.service.cli import remote_synthesize

    with pytest.raises(ChoreoError, match=r"INVALID_ARGUMENT: tenants\[0\]\.collectives\[0\]"
                                          r"\.chunks: .*\(field: tenants\[0\]\.collectives"
                                          r"\[0\]\.chunks\)"):
        remote_synthesize(_remote_args(served, "--chunks", "2000"))
