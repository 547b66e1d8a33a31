"""The reconciler against an in-memory API and a scripted synthesizer."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from api_helpers import fabric, failure, job, valid
from kubernetes_asyncio.client import ApiException

from choreo.service.api import pb
from choreo.service.buckets import plan_buckets
from choreo_api import CollectiveJobStatus, DeviceFailure
from choreo_operator import metrics, model
from choreo_operator.model import NodeInfo, PodInfo
from choreo_operator.placement import place
from choreo_operator.planning import FabricCache, Inputs, plan_groups
from choreo_operator.reconciler import Reconciler, Settings
from choreo_operator.results import Trim
from choreo_operator.synthclient import Outcome, SynthesisError

XML = '<algo ngpus="{n}"></algo>'


def _padded(n: int, per_gpu: int) -> str:
    """An algorithm of ``n`` ranks whose every ``<gpu>`` takes ``per_gpu`` bytes."""
    gpus = "".join(f'<gpu id="{r}">{" " * per_gpu}</gpu>' for r in range(n))
    return f'<algo ngpus="{n}">{gpus}</algo>'


class FakeApi:
    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}
        self.patches: list[tuple[str, dict[str, Any]]] = []

    async def get(self, path: str) -> Any:
        prefix = path.split("?")[0] + "/"
        return {"items": [v for k, v in self.objects.items() if k.startswith(prefix)]}

    async def list_metadata(self, path: str) -> Any:
        """As the API server answers: an empty metadata-only list has ``items: null``."""
        listing = await self.get(path)
        return {"kind": "PartialObjectMetadataList", "items": listing["items"] or None}

    async def create(self, path: str, body: dict[str, Any]) -> Any:
        key = f"{path}/{body['metadata'].get('name', len(self.objects))}"
        if key in self.objects:
            raise ApiException(status=409, reason="exists")
        self.objects[key] = body
        return body

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> Any:
        self.patches.append((path, patch))
        return patch

    async def delete(self, path: str) -> Any:
        return self.objects.pop(path, None)

    def statuses(self, job: str) -> list[dict[str, Any]]:
        return [p["status"] for path, p in self.patches if path.endswith(f"/{job}/status")]

    def status(self, job: str) -> dict[str, Any]:
        """The job's status as the API server would hold it after every merge patch."""
        merged: dict[str, Any] = {}
        for s in self.statuses(job):
            merged.update(s)
        return merged

    def configmaps(self) -> list[str]:
        return sorted(k.rsplit("/", 1)[1] for k, v in self.objects.items()
                      if v.get("kind") == "ConfigMap" and v.get("immutable"))


class FakeSynth:
    def __init__(self, failures: list[SynthesisError] | None = None) -> None:
        self.calls: list[Any] = []
        self.failures = failures or []

    async def synthesize(self, request: Any, timeout: float) -> Any:
        self.calls.append(request)
        if self.failures:
            raise self.failures.pop(0)
        resp = pb.SynthesizeResponse(engine="greedy")
        for t in request.tenants:
            out = resp.tenants.add(name=t.name)
            for c in t.collectives:
                res = out.collectives.add(collective=c.collective)
                res.buckets.add(min_bytes=c.min_bytes, max_bytes=c.max_bytes,
                                representative_bytes=c.max_bytes, engine="rail-gather",
                                xml=XML.format(n=len(t.npus)),
                                prediction=pb.Prediction(busbw_bytes_per_second=1e10,
                                                         fraction_of_bound=0.8),
                                verification=pb.Verification(ok=True))
        return resp


def _inputs(failures: list[DeviceFailure], mounts: Mapping[str, tuple[str, ...]] | None = None,
            ) -> Inputs:
    """Tenants a and b on two nodes; ``mounts``: the ConfigMaps each tenant's pods mount."""
    coll = {"name": "grads", "collective": "allreduce", "minBytes": 1 << 20, "maxBytes": 1 << 22}
    jobs = [job(t, collectives=[coll]) for t in "ab"]
    pods = [PodInfo("ns", f"{t}{r}", f"{t}{r}", (("t", t),), f"n{r}", 4, None,
                    (("batch.kubernetes.io/job-completion-index", str(r)),),
                    (mounts or {}).get(t, ()), True)
            for t in "ab" for r in range(2)]
    nodes = {n: NodeInfo(n, True, 8) for n in ("n0", "n1")}
    return Inputs([fabric(2, type="rail", rails=1)], {}, failures, nodes, jobs, pods)


class CountingApi(FakeApi):
    """Remembers the name of every ConfigMap it is asked to create."""

    def __init__(self) -> None:
        super().__init__()
        self.creates: list[str] = []

    async def create(self, path: str, body: dict[str, Any]) -> Any:
        if body.get("kind") == "ConfigMap":
            self.creates.append(body["metadata"]["name"])
        return await super().create(path, body)


async def _landed(rec: Reconciler) -> None:
    """Wait for the syntheses under way to publish or give up."""
    for flight in list(rec.flights.running.values()):
        await flight.task


def _reconciler(api: FakeApi, synth: FakeSynth) -> tuple[Reconciler, dict[str, Any]]:
    """A reconciler whose inputs follow ``state``: its ``failures`` and, if set, ``mounts``."""
    state: dict[str, Any] = {"failures": []}
    rec = Reconciler(lambda: _inputs(state["failures"], state.get("mounts")), api, synth,
                     Settings(backoff_initial_seconds=0.01, backoff_max_seconds=0.02))
    return rec, state


def _run(failures_seq: list[list[DeviceFailure]], synth: FakeSynth,
         api: FakeApi) -> Reconciler:
    rec, state = _reconciler(api, synth)
    state["failures"] = failures_seq[0]

    async def main() -> None:
        for failures in failures_seq:
            state["failures"] = failures
            await rec.round({"failure"}, 0.0)
            await _landed(rec)
    asyncio.run(main())
    return rec


def test_one_request_per_group_and_nothing_when_nothing_changed() -> None:
    api, synth = FakeApi(), FakeSynth()
    _run([[], []], synth, api)
    assert len(synth.calls) == 1  # a and b share the NIC: one joint request, once
    assert sorted(t.name for t in synth.calls[0].tenants) == ["ns/a", "ns/b"]
    assert len(api.configmaps()) == 2
    final = api.status("a")
    assert final["phase"] == "Ready" and final["ranks"] == 8 and final["files"] == ["grads-0.xml"]
    # whose schedule runs: the bucket's engine, not the request's option (greedy)
    assert [c["engine"] for c in final["collectives"]] == ["rail-gather"]


def test_failure_then_resolution_restores_the_same_configmap() -> None:
    api, synth = FakeApi(), FakeSynth()
    gpu = failure("x", "n1", "gpu", gpu=1)
    _run([[], [gpu], [failure("x", "n1", "gpu", gpu=1, resolved=True)]], synth, api)
    names = [s["configMap"] for s in api.statuses("a") if "configMap" in s]
    assert len(synth.calls) == 3 and names[0] == names[-1] and names[1] != names[0]
    assert [len(t.npus) for t in synth.calls[1].tenants] == [7, 8]


def test_a_schedule_that_comes_back_while_mounted_is_not_sent_again() -> None:
    """Pods still mount the schedule from before the failure: when the GPU recovers, the
    status names that ConfigMap again without writing it a second time."""
    api, synth = CountingApi(), FakeSynth()
    creates = api.creates
    rec, state = _reconciler(api, synth)

    async def main() -> None:
        await rec.round({"failure"}, 0.0)
        await _landed(rec)
        first = api.status("a")["configMap"]
        state["mounts"] = {"a": (first,), "b": (api.status("b")["configMap"],)}
        state["failures"] = [failure("x", "n1", "gpu", gpu=1)]
        await rec.round({"failure"}, 0.0)
        await _landed(rec)
        assert api.status("a")["configMap"] != first
        creates.clear()
        state["failures"] = [failure("x", "n1", "gpu", gpu=1, resolved=True)]
        await rec.round({"failure"}, 0.0)
        await _landed(rec)
        assert api.status("a")["configMap"] == first and first in api.configmaps()
    asyncio.run(main())
    assert len(synth.calls) == 3
    assert creates == []  # neither the schedule's ConfigMaps nor the alias, which is patched


def test_a_replaced_schedule_stays_for_its_window_then_goes() -> None:
    """Nothing mounts the ConfigMaps here, yet the schedule a failure replaced stays for the
    window: the GPU recovers and the status names it again with nothing written. One
    schedule back at most: a second failure's publication collects the first's. Once the
    window passes, the round it asked for collects the replaced one."""
    api, synth = CountingApi(), FakeSynth()
    creates = api.creates
    state: dict[str, Any] = {"failures": []}
    rec = Reconciler(lambda: _inputs(state["failures"]), api, synth, Settings(
        backoff_initial_seconds=0.01, backoff_max_seconds=0.02, keep_replaced_seconds=0.5))

    async def publish(failures: list[DeviceFailure]) -> str:
        state["failures"] = failures
        await rec.round({"failure"}, 0.0)
        await _landed(rec)
        return str(api.status("a")["configMap"])

    async def main() -> None:
        first = await publish([])
        second = await publish([failure("x", "n1", "gpu", gpu=1)])
        assert second != first and {first, second} <= set(api.configmaps())
        creates.clear()
        assert await publish([failure("x", "n1", "gpu", gpu=1, resolved=True)]) == first
        assert creates == []  # the schedule came back whole: not a ConfigMap written
        assert {first, second} <= set(api.configmaps())
        third = await publish([failure("y", "n0", "gpu", gpu=2)])
        assert third not in (first, second)
        assert first in api.configmaps() and second not in api.configmaps()
        rec.debouncer.reasons.clear()
        await asyncio.sleep(0.6)
        assert "collect" in rec.debouncer.reasons  # the window's end asked for a round
        await rec.round({"collect"}, 0.0)
        assert third in api.configmaps() and first not in api.configmaps()
    asyncio.run(main())


def test_a_configmap_delete_that_times_out_leaves_the_publication_ready() -> None:
    """Collecting the old ConfigMaps is housekeeping after the status is written: a delete
    lost to a loaded API server neither marks the tenant Degraded nor counts as a failed
    synthesis, the collection stops at it instead of waiting a timeout for every other
    ConfigMap, and the job's next publication deletes what was left."""

    class SlowDeletes(FakeApi):
        down = True
        unanswered = 0

        async def delete(self, path: str) -> Any:
            if self.down and "/configmaps/" in path:
                self.unanswered += 1
                raise aiohttp.SocketTimeoutError("Timeout on reading data from socket")
            return await super().delete(path)

    api, synth = SlowDeletes(), FakeSynth()
    rec, state = _reconciler(api, synth)

    async def main() -> None:
        await rec.round({"failure"}, 0.0)
        await _landed(rec)
        first = api.status("a")["configMap"]
        state["failures"] = [failure("x", "n1", "gpu", gpu=1)]
        await rec.round({"failure"}, 0.0)
        await _landed(rec)
        after = api.status("a")
        reasons = {c["type"]: (c["status"], c["reason"]) for c in after["conditions"]}
        assert after["configMap"] != first and reasons["Ready"] == ("True", "Synthesized")
        assert reasons["Degraded"] == ("True", "DevicesFailed")  # the GPU, not the delete
        assert reasons["Synthesizing"] == ("False", "Done")
        assert first in api.configmaps()  # the delete timed out: still there
        # A second failure: two of a's ConfigMaps are unused, one delete is tried.
        state["failures"] = [failure("x", "n1", "gpu", gpu=1), failure("y", "n1", "gpu", gpu=2)]
        api.unanswered = 0
        await rec.round({"failure"}, 0.0)
        await _landed(rec)
        second = api.status("a")["configMap"]
        assert {first, after["configMap"], second} <= set(api.configmaps())
        assert api.unanswered == 1
        api.down = False
        state["failures"] = [failure("x", "n1", "gpu", gpu=1, resolved=True),
                             failure("y", "n1", "gpu", gpu=2, resolved=True)]
        await rec.round({"failure"}, 0.0)
        await _landed(rec)
        assert api.status("a")["configMap"] == first and first in api.configmaps()
        assert after["configMap"] not in api.configmaps() and second not in api.configmaps()
    asyncio.run(main())
    assert len(synth.calls) == 4  # no retry of a synthesis that was published


def test_synthesizer_down_degrades_then_recovers() -> None:
    api = FakeApi()
    synth = FakeSynth([SynthesisError(Outcome.RETRY, "UNAVAILABLE", "connection refused")] * 2)
    _run([[]], synth, api)
    phases = [s.get("phase") for s in api.statuses("a")]
    assert "Degraded" in phases and phases[-1] == "Ready" and len(synth.calls) == 3
    degraded = next(s for s in api.statuses("a") if s.get("phase") == "Degraded")
    reason = {c["type"]: c["reason"] for c in degraded["conditions"]}["Degraded"]
    assert reason == "SynthesizerUnavailable"


def test_retries_back_off_within_the_bound_and_stop_once_the_inputs_move_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sleep = asyncio.sleep
    delays: list[float] = []

    async def no_wait(seconds: float, *args: Any) -> Any:
        delays.append(seconds)
        return await sleep(0, *args)

    class MovingOn(FakeSynth):
        async def synthesize(self, request: Any, timeout: float) -> Any:
            self.calls.append(request)
            if len(self.calls) == 8:  # a newer round while this one is retrying
                rec.flights.current = dict.fromkeys(rec.flights.current, "newer inputs")
            raise SynthesisError(Outcome.RETRY, "UNAVAILABLE", "connection refused")

    api, synth = FakeApi(), MovingOn()
    rec = Reconciler(lambda: _inputs([]), api, synth,
                     Settings(backoff_initial_seconds=0.5, backoff_max_seconds=4.0))
    monkeypatch.setattr(asyncio, "sleep", no_wait)

    async def main() -> None:
        await rec.round({"job"}, 0.0)
        await _landed(rec)

    asyncio.run(main())
    assert len(synth.calls) == 8 and len(delays) == 7 and api.configmaps() == []
    assert 0.5 <= delays[0] <= 1.0 and delays[:4] == sorted(delays[:4])
    assert max(delays) == delays[-1] == 4.0
    messages = [c["message"] for s in api.statuses("a") for c in s["conditions"]
                if c["type"] == "Degraded"]
    assert f"retrying in {delays[0]:.1f} s" in messages[0]


def test_planning_is_a_pure_function_of_the_inputs() -> None:
    inputs = _inputs([])
    fab, _ = FabricCache().fabric(inputs)
    assert fab is not None
    placements = place(inputs.jobs, inputs.pods, fab)
    limits: dict[str, Any] = {"max_buckets": 4, "restarts": 2, "timeout_seconds": 60.0}
    plans, blocked = plan_groups(inputs.jobs, placements, fab, **limits)
    again, _ = plan_groups(inputs.jobs, placements, fab, **limits)
    [plan] = plans  # a and b share the NIC: one group, with a fallback for each alone
    assert not blocked and [p.inputs_hash for p in again] == [plan.inputs_hash]
    # Packed schedules are other ConfigMaps: a switch publishes every job again, while a
    # plain operator's hashes stay those recorded before packing existed.
    [packed], _ = plan_groups(inputs.jobs, placements, fab, packed=True, **limits)
    [plain], _ = plan_groups(inputs.jobs, placements, fab, packed=False, **limits)
    assert packed.inputs_hash != plan.inputs_hash == plain.inputs_hash
    assert [j.key for j in plan.members] == ["ns/a", "ns/b"] and len(plan.singles) == 2
    # Trims follow from the published files: they change what is asked, not the hash; and
    # they hold only while the collective's spec is the one they were learned for.
    [spec] = inputs.jobs[1].spec.collectives
    for learned, asked in ((spec, (1 << 21, 1 << 22, 2)),
                           (spec.model_copy(update={"max_bytes": 1 << 21}), None)):
        trims = {"ns/b": {"grads": Trim(learned, 1 << 21, 2)}}
        [trimmed], _ = plan_groups(inputs.jobs, placements, fab, trims=trims, **limits)
        [a, b] = trimmed.tenants
        assert a.collectives == plan.tenants[0].collectives and trimmed.options == plan.options
        assert trimmed.inputs_hash == plan.inputs_hash
        if asked is None:
            assert b.collectives == plan.tenants[1].collectives
        else:
            assert [(c.min_bytes, c.max_bytes, c.max_buckets) for c in b.collectives] == [asked]
    pods = [p for p in inputs.pods if not p.name.startswith("b")]
    plans, blocked = plan_groups(inputs.jobs, place(inputs.jobs, pods, fab), fab, **limits)
    assert blocked == {"ns/b": ("Pending", "NoPods", "no running pod matches the selector")}
    assert [[j.key for j in p.members] for p in plans] == [["ns/a"]]


def test_a_job_that_asks_for_the_portfolio_gets_it_for_its_group() -> None:
    """``spec.engine: Auto`` asks the synthesizer for the portfolio within the smallest
    ``engineSeconds`` of the group (its members are solved jointly); the inputs hash covers
    it, and a Greedy group's hash is the one recorded before the field existed."""
    inputs = _inputs([])
    fab, _ = FabricCache().fabric(inputs)
    assert fab is not None
    placements = place(inputs.jobs, inputs.pods, fab)
    limits: dict[str, Any] = {"max_buckets": 4, "restarts": 2, "timeout_seconds": 60.0}
    [greedy], _ = plan_groups(inputs.jobs, placements, fab, **limits)
    assert greedy.options.engine == "" and greedy.options.deadline_seconds == 60.0
    a, b = inputs.jobs
    asks = [a.model_copy(update={"spec": a.spec.model_copy(
        update={"engine": "Auto", "engine_seconds": 4.0})}), b]
    [auto], _ = plan_groups(asks, placements, fab, **limits)
    assert [j.key for j in auto.members] == ["ns/a", "ns/b"]  # still one group
    assert auto.options.engine == "auto" and auto.options.deadline_seconds == 4.0
    assert auto.inputs_hash != greedy.inputs_hash
    assert valid(model.job({"metadata": {"name": "x", "namespace": "ns"}, "spec": {
        "selector": {"matchLabels": {"t": "x"}}, "engine": "Auto", "collectives": [
            {"name": "g", "collective": "allreduce", "minBytes": 1, "maxBytes": 2}]}}
    )).spec.engine_seconds == 10.0


def test_a_failed_gpu_stays_in_the_request_fabric_so_rails_stay_aligned() -> None:
    """The request's fabric keeps a tenant's failed GPU, failed: every GPU keeps its place
    among its host's GPUs, which is its rail for the hierarchical plan. Dropped, the GPUs
    after it would shift one rail over on that host only."""
    from choreo.hierarchy import hosts_of

    coll = {"name": "grads", "collective": "allreduce", "minBytes": 1 << 20, "maxBytes": 1 << 22}
    pods = [PodInfo("ns", f"a{r}", f"a{r}", (("t", "a"),), f"n{r}", 8, None,
                    (("batch.kubernetes.io/job-completion-index", str(r)),), (), True)
            for r in range(2)]
    inputs = Inputs([fabric(2, type="rail", rails=8)], {}, [failure("f", "n0", "gpu", gpu=2)],
                    {n: NodeInfo(n, True, 8) for n in ("n0", "n1")},
                    [job("a", collectives=[coll])], pods)
    fab, _ = FabricCache().fabric(inputs)
    assert fab is not None
    [plan], _ = plan_groups(inputs.jobs, place(inputs.jobs, inputs.pods, fab), fab,
                            max_buckets=4, restarts=2, timeout_seconds=60.0)
    sub, [tenant] = plan.request_fabric, plan.tenants
    assert len(sub.all_npus) == 16 and len(tenant.npus) == 15
    [failed] = sub.failed
    assert sub.node_name(failed) == "n0/gpu2" and failed not in tenant.npus
    hosts = hosts_of(sub, tenant.npus)
    assert hosts is not None
    assert [[slot for slot, _ in h] for h in hosts] == [[0, 1, 3, 4, 5, 6, 7], list(range(8))]


def test_infeasible_keeps_the_old_schedule() -> None:
    api = FakeApi()
    synth = FakeSynth()
    _run([[]], synth, api)
    before = api.configmaps()
    synth.failures = [SynthesisError(Outcome.INFEASIBLE, "FAILED_PRECONDITION", "cut off")]
    _run([[failure("x", "n1", "gpu", gpu=0)]], synth, api)
    assert api.configmaps() == before
    assert api.status("a")["phase"] == "Infeasible"
    assert api.status("a")["configMap"] in before  # pods keep the last good schedule


def test_joint_request_refused_falls_back_to_one_per_tenant() -> None:
    api = FakeApi()
    synth = FakeSynth([SynthesisError(Outcome.REJECTED, "INVALID_ARGUMENT", "left its GPUs")])
    _run([[]], synth, api)
    assert [len(c.tenants) for c in synth.calls] == [2, 1, 1]
    final = api.status("b")
    assert final["phase"] == "Ready"
    ready = next(c for c in final["conditions"] if c["type"] == "Ready")
    assert "synthesized alone" in ready["message"] and "ns/a" in ready["message"]


def test_a_synthesis_task_that_fails_is_reported_and_retried() -> None:
    """An unexpected error while publishing must not leave the group's flight stuck."""

    class FlakyApi(FakeApi):
        broken = True

        async def create(self, path: str, body: dict[str, Any]) -> Any:
            if self.broken and body.get("kind") == "ConfigMap":
                self.broken = False
                raise ValueError("boom")
            return await super().create(path, body)

    api, synth = FlakyApi(), FakeSynth()
    rec = Reconciler(lambda: _inputs([]), api, synth,
                     Settings(backoff_initial_seconds=0.01, backoff_max_seconds=0.05))

    async def main() -> None:
        await rec.round({"job"}, 0.0)
        await _landed(rec)
        assert not rec.flights.running  # the failed flight is gone, so a later round starts anew
        reasons, _ = await asyncio.wait_for(rec.debouncer.wait(), 5)
        assert "retry" in reasons
        await rec.round(reasons, 0.0)
        await _landed(rec)

    asyncio.run(main())
    degraded = [s for s in api.statuses("a") if s.get("phase") == "Degraded"]
    assert degraded and "ValueError: boom" in str(degraded[0]["conditions"])
    assert len(synth.calls) == 2 and api.status("a")["phase"] == "Ready"


def test_a_schedule_too_large_for_configmaps_is_reported_once_not_retried() -> None:
    class HugeSynth(FakeSynth):
        async def synthesize(self, request: Any, timeout: float) -> Any:
            resp = await super().synthesize(request, timeout)
            for t in resp.tenants:
                for c in t.collectives:
                    for b in c.buckets:
                        b.xml = _padded(8, 1 << 20)
            return resp

    api, synth = FakeApi(), HugeSynth()
    rec = _run([[], []], synth, api)
    assert len(synth.calls) == 1  # the same inputs are not synthesized again
    assert not rec.flights.running and api.configmaps() == []
    final = api.status("a")
    reason = {c["type"]: c["reason"] for c in final["conditions"]}
    assert final["phase"] == "Degraded" and reason["Degraded"] == "ScheduleTooLarge"
    assert "1 MiB" in str(final["conditions"]) and final["lastSynthesis"]["inputsHash"]


def test_files_too_large_for_a_configmap_leave_the_smallest_sizes_to_nccl() -> None:
    """Four size buckets of 0.4 MiB per pod do not fit a ConfigMap: the two smallest ranges
    are left to NCCL at once (no second synthesis), and later requests ask only for the two
    kept, in two buckets, so the synthesizer no longer makes the files left out."""

    class BucketSynth(FakeSynth):
        """One ~0.4 MiB file per size bucket, the buckets the service would plan."""

        async def synthesize(self, request: Any, timeout: float) -> Any:
            resp = await super().synthesize(request, timeout)
            for t, out in zip(request.tenants, resp.tenants, strict=True):
                for c, res in zip(t.collectives, out.collectives, strict=True):
                    first = res.buckets[0]
                    del res.buckets[:]
                    count = c.max_buckets or request.options.max_buckets
                    for bk in plan_buckets(c.min_bytes, c.max_bytes, count, lambda _: 1):
                        b = res.buckets.add()
                        b.CopyFrom(first)
                        b.min_bytes, b.max_bytes = bk.lo, bk.hi
                        b.representative_bytes = bk.size
                        b.xml = _padded(len(t.npus), 100 << 10)  # 0.4 MiB a 4-GPU pod
            return resp

    api, synth = FakeApi(), BucketSynth()
    rec, state = _reconciler(api, synth)

    async def main() -> None:
        await rec.round({"job"}, 0.0)
        await _landed(rec)
        assert len(synth.calls) == 1 and not rec.flights.running
        first = api.status("a")
        assert first["phase"] == "Ready" and first["files"] == ["grads-2.xml", "grads-3.xml"]
        state["failures"] = [failure("x", "n1", "gpu", gpu=1)]
        await rec.round({"failure"}, 0.0)
        await _landed(rec)

    asyncio.run(main())
    planned = plan_buckets(1 << 20, 1 << 22, 4, lambda _: 1)
    [first], [again] = (call.tenants[0].collectives for call in synth.calls)
    assert (first.min_bytes, first.max_buckets) == (1 << 20, 0)
    assert (again.min_bytes, again.max_buckets) == (planned[2].lo, 2)
    assert [c.options.max_buckets for c in synth.calls] == [4, 4]  # b's buckets are its own
    final = api.status("a")  # Degraded: a GPU failed, the schedule uses the others
    assert final["phase"] == "Degraded" and final["files"] == ["grads-0.xml", "grads-1.xml"]
    [sizes] = [c["sizes"] for c in final["collectives"]]
    assert sizes[0] == {"minBytes": 1 << 20, "maxBytes": planned[2].lo - 1, "runs": "NCCL",
                        "reason": "ConfigMapLimit"}
    assert [(r["minBytes"], r["runs"]) for r in sizes[1:]] == [
        (planned[2].lo, "choreo"), (planned[3].lo, "choreo")]
    ready = next(c for c in final["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and "would not fit a pod's ConfigMap" in ready["message"]
    assert not any("FewerSizeBuckets" in str(s) for s in api.statuses("a"))

    # A restarted operator (or a new leader) reads the trim back from the status.
    def resumed() -> Inputs:
        inputs = _inputs([failure("x", "n1", "gpu", gpu=2)])
        jobs = [j.model_copy(update={"status": CollectiveJobStatus.model_validate(
            api.status(j.metadata.name))}) for j in inputs.jobs]
        return replace(inputs, jobs=jobs)

    restarted = Reconciler(resumed, api, synth, Settings())

    async def again_main() -> None:
        await restarted.round({"failure"}, 0.0)
        await _landed(restarted)

    asyncio.run(again_main())
    [third] = synth.calls[2].tenants[0].collectives
    assert (third.min_bytes, third.max_buckets) == (planned[2].lo, 2)


@pytest.mark.parametrize("lost", [
    ApiException(status=503, reason="etcdserver: leader changed"),
    aiohttp.ClientConnectionError("connection reset by peer")], ids=["503", "reset"])
def test_a_status_write_lost_to_an_api_restart_keeps_the_schedule_it_names(
        lost: Exception) -> None:
    """While the status still names the old ConfigMap, collecting must not delete it, and
    the new schedule is published again until the status says so."""

    class RestartingApi(FakeApi):
        down = False

        async def merge_patch(self, path: str, patch: dict[str, Any]) -> Any:
            if self.down and "configMap" in patch.get("status", {}):
                self.down = False
                raise lost
            return await super().merge_patch(path, patch)

    api, synth = RestartingApi(), FakeSynth()
    rec, state = _reconciler(api, synth)

    def named_exists() -> bool:
        return api.status("a")["configMap"] in api.configmaps()

    async def settle(reasons: set[str]) -> None:
        await rec.round(reasons, 0.0)
        await _landed(rec)
        await rec.publisher.collect(rec.read().jobs, [])  # nothing mounts anything: collect at will

    async def main() -> None:
        await settle({"job"})
        first = api.status("a")["configMap"]
        api.down = True
        state["failures"] = [failure("x", "n1", "gpu", gpu=1)]
        await settle({"failure"})
        assert api.status("a")["configMap"] == first and named_exists()
        reasons, _ = await asyncio.wait_for(rec.debouncer.wait(), 5)
        assert "retry" in reasons
        await settle(reasons)
        assert api.status("a")["configMap"] != first and named_exists()
        assert first not in api.configmaps()  # collected once nothing names it

    asyncio.run(main())


def test_a_stopped_reconciler_runs_again_and_redoes_what_was_cut_short() -> None:
    class SlowSynth(FakeSynth):
        started = 0

        async def synthesize(self, request: Any, timeout: float) -> Any:
            self.started += 1
            await asyncio.sleep(0.2)
            return await super().synthesize(request, timeout)

    api, synth = FakeApi(), SlowSynth()
    rec = Reconciler(lambda: _inputs([]), api, synth,
                     Settings(quiet_seconds=0.01, backoff_initial_seconds=0.01,
                              backoff_max_seconds=0.02))

    async def main() -> None:
        task = asyncio.create_task(rec.run())
        rec.poke("job")
        await asyncio.sleep(0.1)  # the synthesis is in flight
        task.cancel()
        await rec.stop()
        assert not rec.flights.running and api.status("a").get("phase") != "Ready"
        task = asyncio.create_task(rec.run())
        rec.poke("leader")
        for _ in range(100):
            await asyncio.sleep(0.02)
            if api.status("a").get("phase") == "Ready":
                break
        task.cancel()
        await rec.stop()

    asyncio.run(main())
    # the call cut short by stop() was made again, and that one finished
    assert api.status("a")["phase"] == "Ready" and synth.started == 2 and len(synth.calls) == 1


def test_objects_that_do_not_fit_the_api_are_reported_in_their_status() -> None:
    """What the API server should have refused (an older CRD, a hand-made body) is not used:
    its status says which field is wrong, in the words of ``choreo_api.problem``."""
    bodies = {
        "DeviceFailure": {"metadata": {"name": "bad-gpu"}, "spec": {
            "node": "n0", "source": "manual", "device": {"type": "gpu", "gpu": "three"}}},
        "CollectiveJob": {"metadata": {"name": "c", "namespace": "ns", "uid": "u",
                                       "generation": 2},
                          "spec": {"selector": {"matchLabels": {"t": "c"}}, "collectives": []}},
        "FabricTopology": {"metadata": {"name": "z", "generation": 1}, "spec": {
            "nodes": [{"name": "n0", "position": 0}], "interNode": {"type": "rail"}}},
        "NodeFabric": {"metadata": {"name": "n1", "namespace": "choreo-system"}, "spec": {
            "nodeName": "n1", "gpus": [{"index": 0}],
            "links": [{"src": 0, "dstGPU": 0, "kind": "warp", "bandwidthBytesPerSecond": 1}]}},
    }
    read = [model.device_failure(bodies["DeviceFailure"]), model.job(bodies["CollectiveJob"]),
            model.fabric_topology(bodies["FabricTopology"]),
            model.node_fabric(bodies["NodeFabric"])]
    api, synth = FakeApi(), FakeSynth()
    inputs = _inputs([])
    inputs.invalid = [i for i in read if isinstance(i, model.Invalid)]
    assert len(inputs.invalid) == len(read)
    rec = Reconciler(lambda: inputs, api, synth)
    asyncio.run(rec.round({"failure"}, 0.0))
    patches = {path.rsplit("/", 2)[1]: p["status"] for path, p in api.patches}

    def condition(name: str, kind: str) -> dict[str, Any]:
        return next(c for c in patches[name]["conditions"] if c["type"] == kind)

    applied = condition("bad-gpu", "Applied")
    assert (applied["status"], applied["reason"]) == ("False", "Invalid")
    assert applied["message"].startswith("spec.device.gpu: Input should be a valid integer")
    ready = condition("c", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert ready["message"].startswith("spec.collectives: ")
    assert patches["c"]["observedGeneration"] == 2
    assert condition("z", "Ready")["message"] == "spec.interNode: type rail needs rails"
    fabric_ready = condition("f", "Ready")
    assert fabric_ready["status"] == "False"
    assert ("NodeFabric choreo-system/n1 is ignored (the node keeps its preset): "
            "spec.links[0].kind: Input should be") in fabric_ready["message"]
    assert any(e.get("reason") == "InvalidSpec" for e in api.objects.values())
    # reported once: a round with the same inputs writes nothing more about them
    before = len(api.patches)
    asyncio.run(rec.round({"failure"}, 0.0))
    assert not [p for p in api.patches[before:]
                if any(n in p[0] for n in ("/bad-gpu/", "/c/", "/z/"))]


def test_what_the_status_names_survives_a_replica_with_an_older_view() -> None:
    """A replica that took over may still hold a job as it was before the last publication
    (its index lags the API server): its collector must not delete the ConfigMap the
    status names now."""

    class StatusApi(FakeApi):
        async def get(self, path: str) -> Any:
            if path.endswith("/collectivejobs/a/status"):
                return {"status": self.status("a")}
            return await super().get(path)

    api, synth = StatusApi(), FakeSynth()
    rec = Reconciler(lambda: _inputs([]), api, synth)

    async def main() -> None:
        await rec.round({"job"}, 0.0)
        await _landed(rec)
        named = api.status("a")["configMap"]
        successor = Reconciler(lambda: _inputs([]), api, synth)
        [job] = [j for j in successor.read().jobs if j.name == "a"]
        successor.reporter.state(job).keep = {"a-an-older-schedule"}  # what its stale index said
        await successor.publisher.collect(successor.read().jobs, [])
        assert named in api.configmaps()

    asyncio.run(main())


def test_a_failure_round_reuses_the_placements_and_a_pod_change_does_not() -> None:
    from choreo_operator.placement import Placer

    inputs = _inputs([])
    cache, placer = FabricCache(), Placer()
    healthy, _ = cache.fabric(inputs)
    first = placer.place(inputs.jobs, inputs.pods, healthy)
    failed, _ = cache.fabric(_inputs([failure("f", "n0", "gpu", gpu=0)]))
    assert failed is not None and failed is not healthy and failed.topology.failed
    again = placer.place(inputs.jobs, list(inputs.pods), failed)
    assert again is first  # a failure moves no pod: the same placements
    published = [j.model_copy(update={"status": CollectiveJobStatus(phase="Ready")})
                 for j in inputs.jobs]
    assert placer.place(published, inputs.pods, failed) is first  # nor does a job's status
    fresh = place(inputs.jobs, inputs.pods, failed)
    assert {k: (p.slots, p.pod_ranks, p.problems) for k, p in again.items()} == {
        k: (p.slots, p.pod_ranks, p.problems) for k, p in fresh.items()}
    moved = [replace(p, node="n1") if p.name == "a0" else p for p in inputs.pods]
    changed = placer.place(inputs.jobs, moved, failed)
    assert changed is not first  # a0 moved to n1: placed again, and b1 finds no GPU left
    assert {s.node for s in changed["ns/a"].slots} == {"n1"} and changed["ns/b"].problems
    rebuilt, _ = FabricCache().fabric(inputs)  # another FabricTopology: placed again
    assert placer.place(inputs.jobs, moved, rebuilt) is not changed
    fewer = [j.model_copy(update={"spec": j.spec.model_copy(update={"gpus_per_pod": 2})})
             if j.name == "a" else j for j in inputs.jobs]
    assert len(placer.place(fewer, moved, rebuilt)["ns/a"].slots) == 4  # a spec change: again


def _busy_synthesizer_run(request_slots: int) -> tuple[FakeApi, int, int]:
    """Six single-tenant groups asking at once a synthesizer that, like the real one, refuses
    a call while two are in flight: (the API, calls refused, most calls in flight)."""
    in_flight, most, refused = 0, 0, 0

    class BusySynth(FakeSynth):
        async def synthesize(self, request: Any, timeout: float) -> Any:
            nonlocal in_flight, most, refused
            if in_flight >= 2:
                refused += 1
                raise SynthesisError(Outcome.RETRY, "RESOURCE_EXHAUSTED", "all workers busy")
            in_flight += 1
            most = max(most, in_flight)
            try:
                await asyncio.sleep(0.01)
                return await super().synthesize(request, timeout)
            finally:
                in_flight -= 1

    api = FakeApi()
    _startup(api, BusySynth(), Settings(request_slots=request_slots,
                                        backoff_initial_seconds=0.01, backoff_max_seconds=0.02))
    return api, refused, most


GROUPS = "abcdef"


def _startup(api: FakeApi, synth: FakeSynth, settings: Settings) -> None:
    """An operator's first round over six single-tenant groups, until all are Ready."""
    coll = {"name": "grads", "collective": "allreduce", "minBytes": 1 << 20, "maxBytes": 1 << 22}
    pods = [PodInfo("ns", f"{t}0", f"{t}0", (("t", t),), f"n{i}", 8, None,
                    (("batch.kubernetes.io/job-completion-index", "0"),), (), True)
            for i, t in enumerate(GROUPS)]
    inputs = Inputs([fabric(len(GROUPS))], {}, [],
                    {f"n{i}": NodeInfo(f"n{i}", True, 8) for i in range(len(GROUPS))},
                    [job(t, collectives=[coll]) for t in GROUPS], pods)
    rec = Reconciler(lambda: inputs, api, synth, settings)

    async def main() -> None:
        await rec.round({"startup"}, 0.0)
        await _landed(rec)
    asyncio.run(main())
    for t in GROUPS:
        assert api.status(t)["phase"] == "Ready"


def test_answers_wait_for_their_publication_in_the_request_slot() -> None:
    """Answers faster than publications must not pile up in memory: a group keeps its
    request slot until its answer is published, so at most that many answers are held."""
    held, most = 0, 0

    class Counting(FakeSynth):
        async def synthesize(self, request: Any, timeout: float) -> Any:
            nonlocal held, most
            answer = await super().synthesize(request, timeout)
            held += 1
            most = max(most, held)
            return answer

    class SlowWrites(FakeApi):
        async def create(self, path: str, body: dict[str, Any]) -> Any:
            await asyncio.sleep(0.02 if body.get("kind") == "ConfigMap" else 0)
            return await super().create(path, body)

        async def merge_patch(self, path: str, patch: dict[str, Any]) -> Any:
            nonlocal held
            if path.endswith("/status") and "configMap" in (patch.get("status") or {}):
                held -= 1  # published
            return await super().merge_patch(path, patch)

    _startup(SlowWrites(), Counting(), Settings(request_slots=2, publish_slots=1))
    assert most == 2 and held == 0


def _degraded(api: FakeApi) -> int:
    return sum(s.get("phase") == "Degraded" for t in "abcdef" for s in api.statuses(t))


def test_groups_wait_their_turn_for_the_synthesizer_instead_of_being_refused() -> None:
    """With as many request slots as the synthesizer serves, no call is refused and no
    tenant is marked Degraded on the way; with more, calls are refused and retried."""
    api, refused, most = _busy_synthesizer_run(request_slots=2)
    assert (refused, most, _degraded(api)) == (0, 2, 0)
    api, refused, _ = _busy_synthesizer_run(request_slots=6)
    assert refused > 0 and _degraded(api) > 0


def test_rounds_are_counted_by_their_first_reason_and_timed() -> None:
    def sample(name: str, **labels: str) -> float:
        return metrics.REGISTRY.get_sample_value(name, labels) or 0.0

    before = (sample("choreo_reconcile_rounds_total", reason="failure"),
              sample("choreo_reconcile_rounds_total", reason="node"),
              sample("choreo_reconcile_round_duration_seconds_count"))
    rec, _ = _reconciler(FakeApi(), FakeSynth())

    async def main() -> None:
        await rec.round({"pods", "node", "failure"}, 0.0)  # the failure names it
        await rec.round({"node"}, 0.0)
        await _landed(rec)
    asyncio.run(main())
    after = (sample("choreo_reconcile_rounds_total", reason="failure"),
             sample("choreo_reconcile_rounds_total", reason="node"),
             sample("choreo_reconcile_round_duration_seconds_count"))
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 2]
