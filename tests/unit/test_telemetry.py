"""choreo.telemetry: NCCL bandwidth definitions, the torch.distributed path, the endpoint."""

from __future__ import annotations

import sys
import types
import urllib.request
from collections.abc import Iterator

import pytest

from choreo.collectives import Collective
from choreo.errors import InputError
from choreo.telemetry import Measurement, Reporter, bus_factor, size_of

GB = 1e9


@pytest.fixture
def reporter() -> Iterator[Reporter]:
    r = Reporter(port=None, namespace="team-a", job="llm", rank=3)
    yield r
    r.close()


def sample(r: Reporter, name: str, collective: str) -> float | None:
    return r.registry.get_sample_value(
        name, {"namespace": "team-a", "job": "llm", "collective": collective, "rank": "3"})


@pytest.mark.parametrize(
    ("collective", "n", "factor"),
    [("allreduce", 8, 2 * 7 / 8), ("allgather", 8, 7 / 8), ("reducescatter", 4, 3 / 4),
     ("alltoall", 16, 15 / 16), ("broadcast", 8, 1.0), ("reduce", 2, 1.0)],
)
def test_bus_factor_matches_nccl_tests(collective: str, n: int, factor: float) -> None:
    assert bus_factor(Collective.parse(collective), n) == pytest.approx(factor)


def test_record_sets_algbw_and_busbw(reporter: Reporter) -> None:
    m = reporter.record("allreduce", 4 * 10**9, 0.5, world_size=8)
    assert m.algbw == pytest.approx(8 * GB)
    assert m.busbw == pytest.approx(8 * GB * 1.75)
    assert sample(reporter, "choreo_measured_busbw_bytes_per_second", "allreduce") == (
        pytest.approx(14 * GB))
    assert sample(reporter, "choreo_measured_algbw_bytes_per_second", "allreduce") == (
        pytest.approx(8 * GB))
    reporter.record("all-reduce", 10**9, 1.0, world_size=8)
    assert sample(reporter, "choreo_measured_collectives_total", "allreduce") == 2
    assert sample(reporter, "choreo_measured_collective_seconds_total", "allreduce") == (
        pytest.approx(1.5))


def test_measure_times_the_block(reporter: Reporter, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([10.0, 10.25])
    monkeypatch.setattr("choreo.telemetry.time.perf_counter", lambda: next(clock))
    with reporter.measure("allgather", 2 * 10**9, world_size=4):
        pass
    assert sample(reporter, "choreo_measured_busbw_bytes_per_second", "allgather") == (
        pytest.approx(8 * GB * 3 / 4))


def test_name_labels_the_series_like_the_prediction(reporter: Reporter) -> None:
    with reporter.measure("allreduce", 1 << 20, world_size=4, name="grads"):
        pass
    assert sample(reporter, "choreo_measured_collectives_total", "grads") == 1
    assert sample(reporter, "choreo_measured_collectives_total", "allreduce") is None


def test_failed_collective_records_nothing(reporter: Reporter) -> None:
    with pytest.raises(RuntimeError), reporter.measure("allreduce", 1024, world_size=2):
        raise RuntimeError("NCCL error")
    assert sample(reporter, "choreo_measured_collectives_total", "allreduce") is None


class FakeTensor:
    def numel(self) -> int:
        return 1000

    def element_size(self) -> int:
        return 2


def test_size_of_tensor_like_and_errors() -> None:
    assert size_of(FakeTensor()) == 2000
    assert size_of(types.SimpleNamespace(nbytes=64)) == 64
    assert size_of(7) == 7
    with pytest.raises(InputError, match="size"):
        size_of("1GiB")
    with pytest.raises(InputError, match="size"):
        size_of(True)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"world_size": 1}, "at least 2 ranks"), ({"world_size": None}, "world_size"),
     ({"world_size": 8, "seconds": 0.0}, "seconds"),
     ({"world_size": 8, "collective": "allsum"}, "unknown collective")],
)
def test_bad_input_names_the_field(reporter: Reporter, kwargs: dict, match: str) -> None:
    args = {"collective": "allreduce", "size": 1024, "seconds": 1.0, **kwargs}
    with pytest.raises(InputError, match=match):
        reporter.record(args["collective"], args["size"], args["seconds"], args["world_size"])


def test_job_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHOREO_JOB", raising=False)
    with pytest.raises(InputError, match="CHOREO_JOB"):
        Reporter(port=None)


def test_labels_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHOREO_JOB", "bert")
    monkeypatch.setenv("POD_NAMESPACE", "ml")
    monkeypatch.delenv("CHOREO_NAMESPACE", raising=False)
    monkeypatch.setenv("RANK", "5")
    r = Reporter(port=None)
    assert (r.namespace, r.job, r.rank) == ("ml", "bert", 5)


def test_torch_distributed_supplies_rank_and_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    dist = types.ModuleType("torch.distributed")
    dist.is_available = lambda: True  # type: ignore[attr-defined]
    dist.is_initialized = lambda: True  # type: ignore[attr-defined]
    dist.get_rank = lambda: 2  # type: ignore[attr-defined]
    dist.get_world_size = lambda: 4  # type: ignore[attr-defined]
    synced: list[int] = []
    cuda = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                                 synchronize=lambda: synced.append(1))
    torch = types.ModuleType("torch")
    torch.distributed = dist  # type: ignore[attr-defined]
    torch.cuda = cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    r = Reporter(port=None, namespace="ns", job="j")
    with r.measure("reducescatter", FakeTensor()):
        pass
    assert r.rank == 2
    assert len(synced) == 2, "GPU work is synchronised before and after the collective"
    value = r.registry.get_sample_value(
        "choreo_measured_collectives_total",
        {"namespace": "ns", "job": "j", "collective": "reducescatter", "rank": "2"})
    assert value == 1


def test_measurement_is_plain_arithmetic() -> None:
    m = Measurement(Collective.BROADCAST, 10**9, 8, 0.1)
    assert (m.algbw, m.busbw) == (pytest.approx(10 * GB), pytest.approx(10 * GB))


def test_endpoint_serves_the_series() -> None:
    with Reporter(port=0, addr="127.0.0.1", namespace="team-a", job="llm", rank=0) as r:
        r.record("allreduce", 10**9, 0.1, world_size=2)
        assert r.port is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{r.port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
    assert ('choreo_measured_busbw_bytes_per_second{collective="allreduce",job="llm",'
            'namespace="team-a",rank="0"} 1e+10') in body
