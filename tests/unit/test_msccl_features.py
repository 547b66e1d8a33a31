"""Buckets, instances, step spilling, per-node split, relay rejection and the CLI."""

from __future__ import annotations

import gzip
import itertools
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import zstandard
from msccl_helpers import schedule

from choreo.cli import main
from choreo.collectives import Collective, Demand
from choreo.errors import InputError
from choreo.generators import build
from choreo.msccl import (
    MAX_CONFIGMAP_BYTES,
    bucket_files,
    fits_configmap,
    run,
    split_per_node,
    to_xml,
    validate,
)
from choreo.msccl.lower import lower
from choreo.msccl.packed import (
    CODECS,
    Codec,
    codec_of,
    inflate,
    inflate_xml,
    pack_xml,
    plain_size,
    split_members,
)
from choreo.msccl.parse import parse
from choreo.msccl.xmlmodel import Gpu
from choreo.schedule import Schedule
from choreo.verify import verify


def header(xml: str) -> dict[str, str]:
    algo = parse(xml).algo
    assert algo is not None
    return algo.attrs


# ---- buckets -------------------------------------------------------------------------------

RANGES = [(0, 65535), (65536, (1 << 20) - 1), (1 << 20, None)]


def buckets(chunks: tuple[int, ...] = (1, 2, 4)) -> list[tuple[int, int | None, Schedule]]:
    return [(lo, hi, schedule("ring-8", "allreduce", c))
            for (lo, hi), c in zip(RANGES, chunks, strict=True)]


def test_executor_buckets_are_inclusive_with_zero_unlimited() -> None:
    files = bucket_files(list(reversed(buckets())))
    names = [n for n, _ in files]
    assert names == sorted(names) == ["allreduce-00.xml", "allreduce-01.xml", "allreduce-02.xml"]
    got = [(header(x)["minBytes"], header(x)["maxBytes"], header(x)["nchunksperloop"])
           for _, x in files]
    assert got == [("0", "65535", "8"), ("65536", "1048575", "16"), ("1048576", "0", "32")]
    for _, xml in files:
        assert validate(xml) == [] and run(xml).ok


def test_legacy_buckets_are_exclusive_never_zero_and_written_per_kind_of_call() -> None:
    files = bucket_files(buckets()[:2], dialect="legacy")
    assert [n for n, _ in files] == ["allreduce-00-inplace.xml", "allreduce-00.xml",
                                     "allreduce-01-inplace.xml", "allreduce-01.xml"]
    got = [(header(x)["minBytes"], header(x)["maxBytes"], header(x)["inplace"])
           for _, x in files]
    assert got == [("0", "65536", "1"), ("0", "65536", "0"),
                   ("65536", "1048576", "1"), ("65536", "1048576", "0")]
    for _, xml in files:
        assert validate(xml) == []
        result = run(xml)
        assert result.ok and result.modes == [
            "in-place" if header(xml)["inplace"] == "1" else "out-of-place"]
    with pytest.raises(InputError, match="at most 2 bucket"):
        bucket_files(buckets(), dialect="legacy")


def test_legacy_alltoall_needs_one_file_per_bucket() -> None:
    four = [(k * 10, k * 10 + 9, schedule("ring-4", "alltoall", 1)) for k in range(4)]
    files = bucket_files(four, dialect="legacy")
    assert [header(x)["inplace"] for _, x in files] == ["0"] * 4
    assert all(validate(x) == [] for _, x in files)


def test_bucket_errors() -> None:
    overlapping = [(0, 1000, schedule("ring-8", "allreduce", 1)),
                   (1000, None, schedule("ring-8", "allreduce", 2))]
    with pytest.raises(InputError, match="overlaps the next one starting at 1000"):
        bucket_files(overlapping)
    open_middle = [(0, None, schedule("ring-8", "allreduce", 1)),
                   (10, None, schedule("ring-8", "allreduce", 2))]
    with pytest.raises(InputError, match="overlaps"):
        bucket_files(open_middle)
    mixed = [(0, 10, schedule("ring-8", "allreduce", 1)),
             (11, None, schedule("ring-8", "allgather", 1))]
    with pytest.raises(InputError, match="same collective"):
        bucket_files(mixed)
    five = [(k * 10, k * 10 + 9, schedule("ring-8", "allreduce", 1)) for k in range(5)]
    assert len(bucket_files(five)) == 5
    with pytest.raises(InputError, match="at most 4"):
        bucket_files(five, dialect="legacy")


def test_range_arguments_are_checked() -> None:
    sched = schedule("ring-8", "allreduce", 1)
    with pytest.raises(InputError, match="max_bytes"):
        to_xml(sched, min_bytes=100, max_bytes=99)
    with pytest.raises(InputError, match="dialect"):
        to_xml(sched, dialect="nccl")
    with pytest.raises(InputError, match="proto"):
        to_xml(sched, proto="ll")
    assert header(to_xml(sched, proto="LL128"))["proto"] == "LL128"


# ---- instances and step spilling ---------------------------------------------------------------

def test_instances_split_chunks_and_replicate_threadblocks() -> None:
    sched = schedule("ring-8", "allgather", 1)
    one, three = lower(sched).algo, lower(sched, instances=3).algo
    assert int(three.attrs["nchannels"]) == 3 * int(one.attrs["nchannels"])
    assert int(three.attrs["nchunksperloop"]) == 3 * int(one.attrs["nchunksperloop"])
    for g1, g3 in zip(one.gpus, three.gpus, strict=True):
        assert len(g3.tbs) == 3 * len(g1.tbs)
        assert g3.o_chunks == 3 * g1.o_chunks
        chans = {(tb.send, tb.recv): set() for tb in g3.tbs}
        for tb in g3.tbs:
            chans[(tb.send, tb.recv)].add(tb.chan)
        assert all(len(c) == 3 for c in chans.values())
    xml = to_xml(sched, instances=3)
    assert validate(xml) == [] and run(xml).ok


def test_executor_spills_long_threadblocks_across_channels() -> None:
    sched = schedule("ring-8", "allreduce", 8)
    legacy = lower(sched, dialect="legacy")
    assert legacy.epochs == 1 and legacy.max_steps > 64  # the schedule really is long
    ex = lower(sched)
    assert ex.epochs > 1 and ex.max_steps <= 64
    assert int(ex.algo.attrs["nchannels"]) == ex.epochs * ex.base_channels
    assert max(len(tb.steps) for g in ex.algo.gpus for tb in g.tbs) <= 64
    xml = to_xml(sched)
    assert validate(xml) == [] and run(xml).ok
    assert validate(to_xml(sched, dialect="legacy")) == []


def test_too_many_channels_is_an_input_error() -> None:
    with pytest.raises(InputError, match="channels"):
        to_xml(schedule("ring-8", "allreduce", 8), instances=32)


# ---- per-node split ----------------------------------------------------------------------------

def test_split_per_node_keeps_each_nodes_gpus() -> None:
    xml = to_xml(schedule("dgx-h100-2", "allreduce", 1))
    nodes = ["node-a"] * 8 + ["node-b"] * 8
    parts = split_per_node(xml, nodes)
    assert list(parts) == ["node-a", "node-b"]
    for name, part in parts.items():
        algo = parse(part).algo
        assert algo is not None
        assert [g.id for g in algo.gpus] == [r for r in range(16) if nodes[r] == name]
        assert algo.attrs == header(xml)
        assert validate(part) == []
        assert len(part) < len(xml)
        assert any(v.rule == "gpu" for v in validate(part, partial=False))
    assert fits_configmap(xml) and MAX_CONFIGMAP_BYTES == 1 << 20
    with pytest.raises(InputError, match="ngpus"):
        split_per_node(xml, nodes[:-1])
    with pytest.raises(InputError, match="not well-formed"):
        split_per_node("<algo", nodes)
    with pytest.raises(InputError, match="plain MSCCL"):
        split_per_node(xml.replace("<gpu ", "<!-- <gpu id='0'> --><gpu ", 1), nodes)
    with pytest.raises(InputError, match="not <algo>"):
        split_per_node("<x><algo ngpus='16'/></x>", nodes)
    # Unparsed, the cut still refuses text it would not cut into whole elements.
    assert split_per_node(xml, nodes, check_xml=False) == parts
    cut_short = xml[:xml.rindex("</gpu>")]
    with pytest.raises(InputError, match="never closed"):
        split_per_node(cut_short, nodes, check_xml=False)
    with pytest.raises(InputError, match="end with </algo>"):
        split_per_node(xml.replace("</algo>", "<extra/></algo>"), nodes, check_xml=False)
    with pytest.raises(InputError, match="other than <gpu>"):
        split_per_node(xml.replace("<gpu ", "<note/><gpu ", 1), nodes, check_xml=False)
    with pytest.raises(InputError, match="nested"):
        split_per_node(xml.replace("</gpu>", '<gpu id="1"/></gpu>', 1), nodes, check_xml=False)


def test_split_per_node_cuts_the_gpus_out_unchanged() -> None:
    """Each node's file holds exactly the original ``<gpu>`` elements, byte for byte."""
    xml = to_xml(schedule("dgx-h100-2", "allgather", 2))
    nodes = [f"n{r % 3}" for r in range(16)]  # ranks of a node need not be adjacent
    parts = split_per_node(xml, nodes)
    whole = parse(xml).algo
    assert whole is not None
    for name, part in parts.items():
        algo = parse(part).algo
        assert algo is not None
        assert _without_lines(algo.gpus) == _without_lines(
            [g for g in whole.gpus if nodes[g.id] == name])


def _without_lines(gpus: list[Gpu]) -> list[tuple[object, ...]]:
    return [(g.id, g.i_chunks, g.o_chunks, g.s_chunks,
             [(t.id, t.send, t.recv, t.chan, [replace(st, line=0) for st in t.steps])
              for t in g.tbs]) for g in gpus]


def test_members_inflate_as_gzip_inflates_them_and_a_damaged_one_is_refused() -> None:
    # members longer than the pieces inflate reads at a time, and some shorter
    rng = np.random.default_rng(3)
    raw = [rng.bytes(n) for n in (0, 5, 70_000, 200_000, 1, 131_072)]
    body = b"".join(gzip.compress(r, compresslevel=1, mtime=0) for r in raw)
    assert inflate(body) == gzip.decompress(body) == b"".join(raw)
    assert inflate(b"") == b""
    with pytest.raises(EOFError):
        inflate(body[:-3])  # the last member's trailer cut off
    with pytest.raises(zlib.error):
        inflate(body[:-1] + bytes([body[-1] ^ 1]))  # its length check damaged


def test_zstd_frames_inflate_as_zstd_inflates_them_and_a_damaged_one_is_refused() -> None:
    rng = np.random.default_rng(4)
    raw = [rng.bytes(n) for n in (0, 5, 70_000, 200_000, 1, 131_072)] + [b"<step/>" * 30_000]
    body = b"".join(zstandard.ZstdCompressor(write_checksum=True).compress(r) for r in raw)
    reader = zstandard.ZstdDecompressor().decompressobj(read_across_frames=True)
    assert inflate(body) == reader.decompress(body) == b"".join(raw)
    with pytest.raises(EOFError):
        inflate(body[:-3])  # the last frame's checksum cut off
    with pytest.raises(zstandard.ZstdError):
        inflate(body[:-1] + bytes([body[-1] ^ 1]))  # its checksum damaged


@pytest.mark.parametrize("codec", CODECS)
def test_a_file_compressed_per_rank_is_cut_per_node_by_joining_members(codec: Codec) -> None:
    """The lowering keeps each rank's element apart; compressed one member per rank, the
    file inflates whole, and each node's file is its new head, its ranks' members as they
    are and the tail: the same text the cut of the whole file gives, packed or plain."""
    low = lower(schedule("dgx-h100-2", "allreduce", 2), 0)
    assert len(low.gpu_ends) == 16 and low.gpu_ends[-1] == len(low.gpus)
    for rank, (a, b) in enumerate(itertools.pairwise([0, *low.gpu_ends])):
        element = low.gpus[a:b].decode()
        assert element.startswith(f'  <gpu id="{rank}" ') and element.endswith("</gpu>\n")
    assert low.text == f"{low.head}\n{low.gpus.decode()}</algo>\n"
    body, ends = low.packed(codec)
    assert codec_of(body) == codec
    assert len(ends) == 18 and ends[-1] == len(body)
    assert inflate_xml(body) == low.text
    assert plain_size(body, ends) == len(low.text.encode())
    nodes = ["node-a"] * 8 + ["node-b"] * 8
    want = split_per_node(low.text, nodes)
    plain = split_members(body, ends, nodes, packed=False)
    packed = split_members(body, ends, nodes, packed=True)
    assert plain == want
    assert {k: inflate_xml(v) for k, v in packed.items()} == want
    assert all(codec_of(v) == codec for v in packed.values() if isinstance(v, bytes))
    assert all(validate(part) == [] for part in plain.values())
    whole = pack_xml(low.text, codec)
    # The members cost a little room: each restarts the compressor.
    assert len(whole) < len(body) < 1.6 * len(whole)
    # A head that is not ASCII (a tenant's name in the comment) is encoded on its own.
    named = replace(low, head=low.head.replace("<!-- ", "<!-- tenant=Zürich-ü ", 1))
    assert named.text != low.text
    body_named, ends_named = named.packed(codec)
    assert inflate_xml(body_named) == named.text
    assert split_members(body_named, ends_named, nodes, packed=False) == split_per_node(
        named.text, nodes)
    with pytest.raises(InputError, match="not contiguous"):
        split_members(body, ends, [f"n{r % 2}" for r in range(16)], packed=True)
    with pytest.raises(InputError, match="17 members for 16 parts of 16 ranks"):
        split_members(body, ends[1:], nodes, packed=True)
    with pytest.raises(InputError, match="does not inflate"):
        split_members(body[:-1] + b"x", ends, nodes, packed=False)


@pytest.mark.parametrize("codec", CODECS)
def test_a_file_compressed_per_part_is_cut_into_whole_parts_only(codec: Codec) -> None:
    """Parts of several ranks (a pod's) compress together, in fewer bytes than per rank, and
    a node made of whole parts gets the same file; one that splits a part is refused."""
    low = lower(schedule("dgx-h100-2", "allreduce", 2), 0)
    nodes = ["node-a"] * 8 + ["node-b"] * 8
    per_rank, _ = low.packed(codec)
    body, ends = low.packed(codec, (8, 16))
    assert len(ends) == 4 and len(body) < len(per_rank)
    assert inflate_xml(body) == low.text
    assert plain_size(body, ends) == len(low.text.encode())
    want = split_per_node(low.text, nodes)
    assert split_members(body, ends, nodes, packed=False, part_ends=(8, 16)) == want
    packed = split_members(body, ends, nodes, packed=True, part_ends=(8, 16))
    assert {k: inflate_xml(v) for k, v in packed.items()} == want
    # four pods of four ranks cannot be cut from parts of eight
    with pytest.raises(InputError, match="not whole parts"):
        split_members(body, ends, [f"n{r // 4}" for r in range(16)], packed=True,
                      part_ends=(8, 16))
    with pytest.raises(InputError, match="4 members for 4 parts"):
        split_members(body, ends, nodes, packed=True, part_ends=(4, 8, 12, 16))


# ---- relays -------------------------------------------------------------------------------------

def test_transfer_through_an_npu_outside_the_tenant_is_rejected() -> None:
    fabric = build("ring-4")
    demand = Demand(Collective.BROADCAST, (0, 1, 2), 1000, 1)
    sched = Schedule(fabric, fabric, (demand,), tenant=np.zeros(3), chunk=np.zeros(3),
                     src=np.array([0, 0, 3]), dst=np.array([1, 3, 2]), link=np.zeros(3),
                     start=np.array([0.0, 0.0, 1.0]), end=np.array([1.0, 1.0, 2.0]),
                     op=np.zeros(3))
    with pytest.raises(InputError, match=r"transfer 1 \(NPU 0 -> NPU 3\) touches NPU 3"):
        to_xml(sched)


def test_incomplete_schedule_is_rejected() -> None:
    sched = schedule("ring-8", "allgather", 1)
    partial = sched.select(np.arange(len(sched)) < len(sched) - 1)
    with pytest.raises(InputError, match="never reaches rank"):
        to_xml(partial)


# ---- CLI ----------------------------------------------------------------------------------------

def test_synthesize_writes_checked_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "msccl"
    code = main(["synthesize", "-t", "ring-8", "-c", "allgather", "-s", "1MiB", "--restarts",
                 "1", "--no-baselines", "--msccl-out", str(out), "--instances", "2"])
    assert code == 0
    xml = (out / "tenant0-allgather.xml").read_text()
    assert header(xml)["nchunksperloop"] == str(8 * 2 * int(parse(xml).algo.comment.split(
        "chunks=")[1].split()[0]))
    assert main(["msccl", "validate", str(out / "tenant0-allgather.xml")]) == 0
    assert main(["msccl", "run", str(out / "tenant0-allgather.xml")]) == 0
    assert "computes the collective" in capsys.readouterr().out


def test_synthesize_writes_nothing_when_lowering_fails(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    code = main(["synthesize", "-t", "ring-8", "-c", "gather", "-s", "1MiB", "--restarts", "1",
                 "--no-baselines", "--msccl-out", str(tmp_path / "m"), "--out",
                 str(tmp_path / "o"), "--dialect", "legacy"])
    assert code == 2
    assert "legacy runtime has no gather" in capsys.readouterr().err
    assert not (tmp_path / "m").exists() and not (tmp_path / "o").exists()


def test_cli_reports_violations_and_bad_files(tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text(to_xml(schedule("ring-8", "allreduce", 1)).replace('hasdep="1"',
                                                                      'hasdep="0"', 1))
    assert main(["msccl", "validate", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "[hasdep]" in out and "gpu 0 tb" in out
    assert main(["msccl", "run", str(bad)]) == 1
    assert "DEADLOCK" in capsys.readouterr().out
    garbage = tmp_path / "garbage.xml"
    garbage.write_text("<algo><gpu")
    assert main(["msccl", "run", str(garbage)]) == 2
    assert "error:" in capsys.readouterr().err
    assert main(["msccl", "validate", str(tmp_path / "missing.xml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_overlapping_transfers_of_one_pair_take_separate_connections() -> None:
    """Two sends of one pair that overlap in time (parallel links) need two connections; a
    later one reuses the first connection that is free by its start."""
    fabric = build("ring-4")
    demand = Demand(Collective.BROADCAST, (0, 1), 3000, 3)
    sched = Schedule(fabric, fabric, (demand,), tenant=np.zeros(3), chunk=np.arange(3),
                     src=np.zeros(3), dst=np.ones(3), link=np.zeros(3),
                     start=np.array([0.0, 0.5, 1.0]), end=np.array([1.0, 1.5, 2.0]),
                     op=np.zeros(3))
    xml = to_xml(sched)
    sender = next(g for g in parse(xml).algo.gpus if g.id == 0)
    sends = sorted((t.chan, len(t.steps)) for t in sender.tbs if t.send == 1)
    assert sends == [(0, 2), (1, 1)]
    assert run(xml).ok


def test_every_piece_of_a_cut_send_names_a_scratch_slot_its_parser_accepts() -> None:
    """A send of more than ``MAX_CNT`` chunks is cut into steps. Its destination offset
    names the receiver's slot, which the sender's parser checks against the sender's own
    scratch: rank 1 (80 chunks of scratch) sends 80 chunks to rank 2's scratch from offset
    20, so its second step's offset (91) is past the end, and must be written -1, as a
    first step's is (found in the 16,384-GPU ReduceScatter's node files)."""
    fabric = build("fc-5")
    c = 40
    demand = Demand(Collective.SCATTER, (0, 1, 2, 3, 4), 5 * c * 1000, c, root=0)
    rows = [  # (first chunk, chunks, src, dst, start): ranks 1 and 2 relay
        (3 * c, 2 * c, 0, 1, 0.0), (c, 20, 0, 2, 0.0), (c, 20, 2, 1, 1.0),
        (c + 20, c - 20, 0, 1, 1.0), (3 * c, 2 * c, 1, 2, 1.0), (2 * c, c, 0, 2, 1.0),
        (3 * c, c, 2, 3, 2.0), (4 * c, c, 2, 4, 2.0)]
    first, count, src, dst, start = (np.array(col) for col in zip(*rows, strict=True))
    links = [next(k for k in fabric.out_links(a) if fabric.links[k].dst == b)
             for a, b in zip(src.tolist(), dst.tolist(), strict=True)]
    sched = Schedule(fabric, fabric, (demand,), tenant=np.zeros(len(rows)), chunk=first,
                     src=src, dst=dst, link=np.array(links), start=start.astype(float),
                     end=start + 0.9, op=np.zeros(len(rows)), count=count)
    assert verify(sched).ok
    xml = to_xml(sched, calls="out-of-place")
    sender = next(g for g in parse(xml).algo.gpus if g.id == 1)
    sends = [(st.dstbuf, st.dstoff, st.cnt) for t in sender.tbs if t.send == 2
             for st in t.steps if st.type == "s"]
    assert sends == [("s", 20, 71), ("s", -1, 9)]
    assert validate(xml) == []
    assert run(xml).ok


def test_a_ranks_own_data_is_copied_in_ranged_steps() -> None:
    """Its own shard's chunks lie side by side in the input and the output, so one ``cpy``
    of ``cnt`` chunks copies them (a step of each chunk filled the threadblock's 64 steps
    from 64 chunks on: a Scatter of 80 chunks a piece was refused); with two instances an
    instance's chunk units are apart, so each is copied alone."""
    sched = schedule("ring-8", "allgather", 8)
    xml = to_xml(sched)
    for g in parse(xml).algo.gpus:
        assert [(st.srcoff, st.dstoff, st.cnt) for tb in g.tbs for st in tb.steps
                if st.type == "cpy"] == [(0, 8 * g.id, 8)]
    assert validate(xml) == [] and run(xml).ok
    two = to_xml(sched, instances=2)
    copies = [st.cnt for tb in parse(two).algo.gpus[3].tbs for st in tb.steps
              if st.type == "cpy"]
    assert copies == [1] * 16
    assert run(two).ok
