"""Packed schedules: compressed XML in ConfigMaps, the sidecar the webhook adds, and the sidecar's
own copying (``choreo unpack``) on a directory laid out as the kubelet lays out a ConfigMap."""

from __future__ import annotations

import base64
import gzip
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from api_helpers import job as _job
from api_helpers import valid

from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.msccl.lower import Lowering, Pack, lower
from choreo.msccl.packed import CODECS, Codec, pack_xml
from choreo.schedule import Schedule
from choreo.synth import synthesize
from choreo_operator import model, results, webhook
from choreo_operator.unpack import run, unpack


@pytest.fixture(scope="module")
def program() -> Schedule:
    """A real schedule: AllReduce over two DGX-H100 hosts."""
    fabric = build("dgx-h100-2")
    return synthesize(fabric, [Demand(Collective.ALLREDUCE, tuple(fabric.npus), 1 << 26, 2)])


@pytest.fixture(scope="module")
def lowering(program: Schedule) -> Lowering:
    """The program as the synthesizer lowers it."""
    return lower(program, 0)


@pytest.fixture(scope="module")
def xml(lowering: Lowering) -> str:
    return lowering.text


def _schedule(xml: str, packed: bool, ranks: int = 16) -> results.Schedule:
    return results.Schedule(results.Files({"grads-0.xml": xml}),
                            [{"rank": r} for r in range(ranks)], packed=packed)


def test_a_packed_config_map_holds_the_same_files_in_a_tenth_of_the_bytes(xml: str) -> None:
    job = _job("a")
    pods = {f"p{h}": (8 * h, 8 * h + 7) for h in range(2)}
    index = {p: h for h, p in enumerate(pods)}
    # Plain, the file is over the split size and goes per pod; packed, it fits one ConfigMap.
    split = len(xml) - 1
    _, (_, parts, plain) = results.config_maps(job, _schedule(xml, False), pods, index, "in",
                                               "fp", split_bytes=split)
    packed_schedule, (name, none, packed) = results.config_maps(
        job, _schedule(xml, True), pods, index, "in", "fp", split_bytes=split)
    assert len(parts) == 2 and not none and len(packed) == 1
    body = packed[0]
    assert set(body["binaryData"]) == {"grads-0.xml"}  # XML compressed
    assert set(body["data"]) == {results.RANKS_KEY}  # what env[].valueFrom may read stays text
    assert results.xml_files(body) == {"grads-0.xml": xml}
    assert results.data_bytes(body) < results.data_bytes(plain[0]) + results.data_bytes(
        plain[1]) < 1.2 * len(xml)
    assert results.data_bytes(body) * 5 < len(xml)
    raw = base64.b64decode(body["binaryData"]["grads-0.xml"])
    assert results.data_bytes(body) == (len(raw) + len("grads-0.xml")
                                        + len(results.RANKS_KEY) + len(body["data"]["ranks.json"]))
    # Not the plain schedule's object: a pod without the sidecar must never mount it.
    assert name != results.base_name(job.name, _schedule(xml, False).content_hash())
    assert packed_schedule.content_hash() == _schedule(xml, True).content_hash()


def test_packed_pieces_per_pod_inflate_to_the_plain_pieces(xml: str) -> None:
    job = _job("a")
    pods = {f"p{h}": (8 * h, 8 * h + 7) for h in range(2)}
    index = {p: h for h, p in enumerate(pods)}
    _, (_, plain_parts, plain) = results.config_maps(job, _schedule(xml, False), pods, index,
                                                     "in", "fp", split_bytes=10)
    _, (_, parts, packed) = results.config_maps(job, _schedule(xml, True), pods, index, "in",
                                                "fp", split_bytes=10)
    assert [p.first for p in parts] == [p.first for p in plain_parts] == [0, 8]
    for a, b, p in zip(plain, packed, parts, strict=True):
        assert results.xml_files(b) == results.xml_files(a)
        assert results.xml_files(b, p.prefix)["grads-0.xml"].count("<gpu ") == 8
        assert results.data_bytes(b) * 5 < results.data_bytes(a)


@pytest.mark.parametrize(("codec", "per_pod"), [(c, p) for c in CODECS for p in (False, True)])
def test_a_file_sent_in_members_is_cut_per_pod_without_inflating_it(
        lowering: Lowering, codec: Codec, per_pod: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The synthesizer sends a large file compressed one member per rank, or per pod where
    the request named the pods' ranks: the operator joins each pod's members and neither
    inflates nor compresses the file, yet every pod's ConfigMap holds what the cut of the
    text gives; plain pieces inflate only their own."""
    job = _job("a")
    pods = {f"p{h}": (8 * h, 8 * h + 7) for h in range(2)}
    index = {p: h for h, p in enumerate(pods)}
    xml = lowering.text
    part_ends = (8, 16) if per_pod else ()
    body, ends = lowering.packed(codec, part_ends)
    for packed in (True, False):
        _, (_, _, want) = results.config_maps(job, _schedule(xml, packed), pods, index, "in",
                                              "fp", split_bytes=10)
        files = results.Files()
        files.add("grads-0.xml", body, ends, part_ends)
        sent = results.Schedule(files, [{"rank": r} for r in range(16)], packed=packed)
        with monkeypatch.context() as m:
            if packed:  # nothing is inflated: the members are joined as they are
                m.setattr(results, "inflate_xml", _refuse)
            _, (_, parts, got) = results.config_maps(job, sent, pods, index, "in", "fp",
                                                     split_bytes=10)
        assert [p.first for p in parts] == [0, 8]
        assert [results.xml_files(b) for b in got] == [results.xml_files(b) for b in want]
        assert files.size("grads-0.xml") == len(xml.encode())
    # However the file is read first, its digest is its compressed bytes': one schedule,
    # one name.
    read_first = results.Files()
    read_first.add("grads-0.xml", body, ends, part_ends)
    assert read_first["grads-0.xml"] == xml
    assert read_first.digest("grads-0.xml") == files.digest("grads-0.xml")
    assert read_first.digest("grads-0.xml").startswith(f"{codec}:")


@pytest.mark.parametrize("part_ends", [(), (8, 16), (3, 16)])
def test_elements_compressed_where_they_are_written_are_the_members_python_writes(
        program: Schedule, lowering: Lowering, part_ends: tuple[int, ...]) -> None:
    """Lowered with a ``Pack``, the compiled pass hands back one zstd frame per part instead
    of the text: the file packs to the very bytes the text packs to, for those parts, and
    reads back as the same text; for other parts, or below ``from_bytes``, nothing changes."""
    packed = lower(program, 0, pack=Pack(part_ends))
    assert not packed.gpus and len(packed.members) == (len(part_ends) or 16)
    assert packed.size == len(lowering.gpus) and packed.text == lowering.text
    assert packed.packed("zstd", part_ends) == lowering.packed("zstd", part_ends)
    other = (4, 16) if part_ends != (4, 16) else ()
    assert packed.packed("zstd", other) == lowering.packed("zstd", other)
    assert packed.packed("gzip", part_ends) == lowering.packed("gzip", part_ends)
    small = lower(program, 0, pack=Pack(part_ends, from_bytes=len(lowering.gpus) + 1))
    assert small.gpus == lowering.gpus and not small.members


def _refuse(body: object) -> str:
    raise AssertionError("inflated a file sent in members")


def test_the_alias_switching_between_plain_and_packed_keeps_no_key_in_both(xml: str) -> None:
    job = _job("a")
    for packed in (False, True):
        schedule = _schedule(xml, packed)
        body = results.config_maps(job, schedule, {}, {}, "in", "fp")[1][2][0]
        alias = results.alias_body(job, body, schedule.content_hash())
        patch = results.alias_patch(job, alias)
        here, there = ("binaryData", "data") if packed else ("data", "binaryData")
        assert patch[there]["grads-0.xml"] is None  # removed where the other kind kept it
        assert patch[here]["grads-0.xml"] == alias[here]["grads-0.xml"]
        assert patch[here]["grads-1.xml"] is None and patch["data"]["ranks.json"]


def test_the_webhook_adds_the_sidecar_and_points_the_containers_at_its_copy() -> None:
    job = valid(model.job({
        "metadata": {"name": "a", "namespace": "ns", "uid": "u"},
        "spec": {"selector": {"matchLabels": {"t": "a"}}, "collectives": [
            {"name": "grads", "collective": "allreduce", "minBytes": 1, "maxBytes": 2}]},
        "status": {"configMap": "a-1", "files": ["grads-0.xml"]}}))
    pod = {"metadata": {"namespace": "ns", "labels": {"t": "a"}},
           "spec": {"initContainers": [{"name": "setup"}],
                    "containers": [{"name": "c"}, {"name": "d"}]}}
    plain = webhook.mutation(pod, [job])
    change = webhook.mutation(pod, [job], "registry.example/choreo:1")
    assert plain is not None and change is not None and "initContainers" not in plain
    sidecar, setup = change["initContainers"]
    assert setup == {"name": "setup"}  # it may read the files: the sidecar goes first
    assert sidecar["image"] == "registry.example/choreo:1"
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: it follows updates
    assert sidecar["args"][0] == "unpack"
    volumes = {v["name"]: v for v in change["volumes"]}
    assert volumes["choreo-schedule"]["configMap"]["name"] == "a-1"  # what collection reads
    assert volumes["choreo-files"] == {"name": "choreo-files", "emptyDir": {}}
    source = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    assert sidecar["args"][1:] == ["--source", source["choreo-schedule"],
                                   "--target", source["choreo-files"]]
    for c in change["containers"]:
        assert c["volumeMounts"] == [{"name": "choreo-files", "mountPath": "/etc/choreo",
                                      "readOnly": True}]
        assert c["env"] == plain["containers"][0]["env"]
    assert sidecar["startupProbe"]["exec"]["command"][-1] == "/etc/choreo/..data"


def _project(root: Path, version: str, files: dict[str, bytes]) -> None:
    """Lay ``files`` out as the kubelet projects a ConfigMap: a hidden copy, ``..data``
    naming it (swapped by a rename), and top-level links through ``..data``."""
    copy = root / version
    for rel, body in files.items():
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes(body)
    (root / "..data_tmp").symlink_to(version)
    (root / "..data_tmp").replace(root / "..data")
    for top in {rel.split("/")[0] for rel in files}:
        if not (root / top).is_symlink():
            (root / top).symlink_to(f"..data/{top}")


def test_unpack_inflates_a_projection_and_follows_its_swaps(tmp_path: Path,
                                                           lowering: Lowering) -> None:
    xml = lowering.text
    source, target = tmp_path / "packed", tmp_path / "files"
    source.mkdir()
    target.mkdir()
    # zstd in frames as the synthesizer sends it; gzip as operators before wrote it
    zstd, _ = lowering.packed("zstd")
    _project(source, "..v1", {"msccl/grads-0.xml": zstd,
                              "msccl/grads-1.xml": gzip.compress(b"<algo/>"),
                              "ranks.json": b"[]"})
    unpack(source, target)
    assert (target / "msccl" / "grads-0.xml").read_text() == xml
    assert (target / "msccl" / "grads-1.xml").read_text() == "<algo/>"
    assert (target / "ranks.json").read_bytes() == b"[]"
    first = os.readlink(target / "..data")
    # A copy cut short (swapped mid-read) is refused whole: the current one stays.
    _project(source, "..v1b", {"msccl/grads-0.xml": zstd[:-5], "ranks.json": b"[9]"})
    with pytest.raises(EOFError):
        unpack(source, target)
    assert os.readlink(target / "..data") == first
    assert (target / "ranks.json").read_bytes() == b"[]"
    _project(source, "..v2", {"msccl/grads-0.xml": b"<algo plain=\"1\"/>", "ranks.json": b"[1]"})
    unpack(source, target)
    assert os.listdir(target / "msccl") == ["grads-0.xml"]  # the stale file is gone
    assert (target / "msccl" / "grads-0.xml").read_bytes() == b"<algo plain=\"1\"/>"
    assert os.readlink(target / "..data") != first and not (target / first).exists()
    assert sorted(p.name for p in target.iterdir() if not p.name.startswith("..")) == [
        "msccl", "ranks.json"]


def test_unpack_of_an_empty_optional_volume_still_makes_the_folder(tmp_path: Path) -> None:
    """A pod admitted before its job's first schedule mounts the alias, which may not exist
    yet: the runtime is pointed at ``msccl/`` all the same, and the executor fails without it."""
    source, target = tmp_path / "packed", tmp_path / "files"
    source.mkdir()
    stop = threading.Event()
    stop.set()
    assert run(source, target, 0.01, stop) == 0
    assert (target / "msccl").is_dir() and not list((target / "msccl").iterdir())


def test_the_sidecar_process_follows_updates_and_stops_on_sigterm(tmp_path: Path,
                                                                    xml: str) -> None:
    source, target = tmp_path / "packed", tmp_path / "files"
    source.mkdir()
    _project(source, "..v1", {"ranks.json": b"[]"})
    proc = subprocess.Popen([sys.executable, "-m", "choreo_operator.unpack", "--source",
                             str(source), "--target", str(target), "--interval", "0.05"])
    try:
        def wait(check: object, what: str) -> None:
            deadline = time.monotonic() + 30
            while not check():  # type: ignore[operator]
                assert time.monotonic() < deadline, what
                assert proc.poll() is None, f"exited {proc.returncode}"
                time.sleep(0.05)

        wait(lambda: (target / "..data").is_symlink(), "the first copy")
        _project(source, "..v2", {"msccl/grads-0.xml": pack_xml(xml, "zstd"),
                                  "ranks.json": b"[0]"})
        path = target / "msccl" / "grads-0.xml"
        wait(lambda: path.exists() and path.read_text() == xml, "the update")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
