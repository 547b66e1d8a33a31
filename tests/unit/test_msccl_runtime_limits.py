"""What the MSCCL runtimes' own loaders do, one test per way a file could pass choreo's checks
and still fail there: legacy scratch allocated at communicator creation, legacy ``inplace`` as
an equality test, XML nodes counted per rank with every ``<gpu>``, ``depid`` in an int8_t,
RCCL's 64 threadblocks, legacy's required ``inplace``, and the hand-written tokenizer."""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
from msccl_helpers import schedule

from choreo.cli import main
from choreo.collectives import Collective, Demand
from choreo.errors import InputError
from choreo.generators import build
from choreo.msccl import layout, run, to_xml, validate
from choreo.msccl.lower import lower
from choreo.msccl.parse import parse
from choreo.msccl.xmlmodel import Algo, to_text
from choreo.schedule import Schedule
from choreo.synth import SynthOptions, synthesize


def model(xml: str) -> Algo:
    algo = parse(xml).algo
    assert algo is not None
    return copy.deepcopy(algo)


def rules(xml: str, dialect: str | None = None) -> set[str]:
    return {v.rule for v in validate(xml, dialect)}


def nodes_per_rank(algo: Algo) -> list[int]:
    """As the runtimes' parser stores them: the <algo>, every <gpu>, the rank's tbs and steps."""
    return [1 + len(algo.gpus) + len(g.tbs) + sum(len(tb.steps) for tb in g.tbs)
            for g in algo.gpus]


@cache
def big(chunks: int, size: int = 1 << 30) -> Schedule:
    fabric = build("dgx-h100-2")
    demand = Demand(Collective.ALLGATHER, tuple(fabric.npus), size, chunks)
    return synthesize(fabric, [demand], SynthOptions(restarts=1, relay=False, rail_gather=False))


# 1. legacy allocates maxBytes * s_chunks / nchunksperloop of scratch per rank at init ----------
def test_legacy_ranges_stop_where_scratch_would_grow_past_the_cap() -> None:
    sched = schedule("ring-8", "alltoall")
    done = lower(sched, dialect="legacy")
    algo = done.algo
    top = int(algo.attrs["maxBytes"])
    L = int(algo.attrs["nchunksperloop"])
    worst = max(g.s_chunks for g in algo.gpus)
    assert worst > 0, "the case must use scratch"
    assert top < layout.LEGACY_UNLIMITED and done.max_bytes == top - 1
    assert top * worst // L <= layout.LEGACY_SCRATCH_CAP < (top + L) * worst // L
    assert validate(done.text) == [] and run(done.text).ok
    # the file as it was written before: "unlimited" asks for terabytes of scratch
    old = re.sub(r'maxBytes="[0-9]+"', f'maxBytes="{layout.LEGACY_UNLIMITED}"', done.text)
    found = [v for v in validate(old) if v.rule == "scratch"]
    assert found and "GiB of scratch" in found[0].message and "maxBytes" in found[0].message


def test_legacy_range_too_large_for_its_scratch_from_the_start_is_refused() -> None:
    sched = schedule("ring-8", "alltoall")
    with pytest.raises(InputError, match="scratch per rank at communicator creation"):
        lower(sched, dialect="legacy", min_bytes=1 << 40)


def test_files_without_scratch_keep_the_whole_range() -> None:
    done = lower(schedule("ring-8", "allgather"), dialect="legacy")
    assert max(g.s_chunks for g in done.algo.gpus) == 0
    assert done.algo.attrs["maxBytes"] == str(layout.LEGACY_UNLIMITED)


# 2. legacy compares inplace with the call's kind; 6. and requires the attribute ---------------
def test_legacy_inplace_is_an_equality_test() -> None:
    sched = schedule("ring-8", "allreduce")
    ip = to_xml(sched, dialect="legacy", calls="in-place")
    oop = to_xml(sched, dialect="legacy", calls="out-of-place")
    assert model(ip).attrs["inplace"] == "1" and model(oop).attrs["inplace"] == "0"
    assert run(ip).modes == ["in-place"] and run(oop).modes == ["out-of-place"]
    assert run(ip).ok and run(oop).ok
    with pytest.raises(InputError, match="inplace attribute"):
        to_xml(sched, dialect="legacy", calls="both")
    with pytest.raises(InputError, match="out of place only"):
        to_xml(schedule("ring-8", "alltoall"), calls="in-place")


def test_cli_writes_both_legacy_files(tmp_path: Path) -> None:
    assert main(["synthesize", "-t", "ring-4", "-c", "allreduce", "-s", "1MiB", "--msccl-out",
                 str(tmp_path), "--dialect", "legacy"]) == 0
    names = sorted(p.name for p in tmp_path.glob("*.xml"))
    assert names == ["tenant0-allreduce-inplace.xml", "tenant0-allreduce.xml"]
    kinds = {n: model((tmp_path / n).read_text()).attrs["inplace"] for n in names}
    assert kinds == {"tenant0-allreduce-inplace.xml": "1", "tenant0-allreduce.xml": "0"}


def test_legacy_requires_inplace() -> None:
    xml = to_xml(schedule("ring-8", "allreduce"), dialect="legacy")
    assert "algo" not in rules(xml)
    found = [v for v in validate(xml.replace(' inplace="0"', "")) if v.rule == "algo"]
    assert found and "'inplace'" in found[0].message


# 3. nodes per rank: the <algo>, every <gpu> of the file, the rank's threadblocks and steps ----
def test_node_limit_counts_every_gpu_element() -> None:
    # 135 chunks: 4079 nodes on the busiest rank as the runtimes count them -> loads
    fits = lower(big(135), dialect="legacy")
    assert max(nodes_per_rank(fits.algo)) <= layout.RUNTIMES["legacy"].max_nodes
    assert validate(fits.text) == []
    # 136 chunks: 4103, of which 15 more than 2 + tbs + steps counts (16 <gpu> elements,
    # one <algo>): without them it would seem to fit
    with pytest.raises(InputError, match=r"needs 4103 XML nodes .*all 16 <gpu>.*stores 4095"):
        lower(big(136), dialect="legacy")


@pytest.mark.parametrize("dialect", ["executor", "legacy"])
def test_validator_fails_the_4096th_node(dialect: str) -> None:
    xml = to_xml(schedule("ring-8", "allgather", 8), dialect=dialect)
    algo = model(xml)
    g = algo.gpus[0]
    copies = next(tb for tb in g.tbs if tb.send < 0 and tb.recv < 0)
    limit = layout.RUNTIMES[dialect].max_nodes
    spare = limit - nodes_per_rank(algo)[0]
    tbs = [replace(copies, id=len(g.tbs) + k, steps=copies.steps[:1]) for k in range(spare // 2)]
    g.tbs.extend(tbs)
    if spare % 2:
        g.tbs.append(replace(copies, id=len(g.tbs), steps=[]))
    assert nodes_per_rank(algo)[0] == limit
    assert "limit" not in rules(to_text(algo), dialect)
    g.tbs.append(replace(copies, id=len(g.tbs), steps=[]))
    found = [v for v in validate(to_text(algo), dialect) if v.rule == "limit"]
    assert [(v.gpu, str(limit + 1) in v.message) for v in found] == [(0, True)]


# 4. depid is an int8_t in every runtime ---------------------------------------------------------
def test_dependency_targets_come_first_so_depids_fit() -> None:
    done = lower(schedule("dgx-h100-2", "allgather"), instances=16)
    depids = [st.depid for g in done.algo.gpus for tb in g.tbs for st in tb.steps]
    assert min(len(g.tbs) for g in done.algo.gpus) > 128  # ids past an int8_t exist
    assert 0 < max(depids) <= layout.RUNTIMES["executor"].max_depid
    for g in done.algo.gpus:  # every target sits before every threadblock nobody waits on
        targets = {st.depid for tb in g.tbs for st in tb.steps if st.depid >= 0}
        assert targets == set(range(len(targets)))
    assert validate(done.text) == [] and run(done.text).ok


def test_more_targets_than_an_int8_holds_are_refused() -> None:
    fabric = build("dgx-h100-2")
    demand = Demand(Collective.ALLREDUCE, tuple(fabric.npus), 1 << 30, 8)  # as the CLI picks
    sched = synthesize(fabric, [demand], SynthOptions(restarts=1, relay=False, rail_gather=False))
    with pytest.raises(InputError, match=r"threadblocks that others wait on.*int8_t"):
        lower(sched, instances=8)


def test_a_wrapped_depid_is_named_and_not_run() -> None:
    algo = model(to_xml(schedule("dgx-h100-2", "allreduce"), instances=8))
    g = algo.gpus[0]
    waiter = next(st for tb in g.tbs for st in tb.steps if st.depid >= 0)
    waiter.depid += 128  # what depid 0..127 + 128 means to an int8_t: the same threadblock
    while len(g.tbs) <= waiter.depid:
        g.tbs.append(replace(g.tbs[-1], id=len(g.tbs), send=-1, recv=-1, steps=[]))
    text = to_text(algo)
    found = [v for v in validate(text) if v.rule == "dep" and "int8_t" in v.message]
    assert found and found[0].gpu == 0
    result = run(text)
    assert not result.ok and result.steps == 0
    assert any("does not fit the runtime's int8_t" in e for e in result.errors)


# 5. RCCL's executor: 64 threadblocks per GPU ---------------------------------------------------
def test_rccl_profile_keeps_to_64_threadblocks() -> None:
    sched = schedule("dgx-h100-2", "allreduce")
    wide = to_xml(sched, instances=8)  # fine for NCCL's executor (1024)
    assert validate(wide, "executor") == []
    assert "tb" in rules(wide, "rccl")
    with pytest.raises(InputError, match="the rccl runtime allows 64"):
        to_xml(sched, dialect="rccl", instances=8)
    narrow = to_xml(sched, dialect="rccl", instances=4)
    assert "dialect=rccl" in narrow and validate(narrow) == [] and run(narrow).ok
    assert max(len(g.tbs) for g in model(narrow).gpus) <= 64


# 7. the runtimes' hand-written tokenizer -------------------------------------------------------
GOOD = to_xml(schedule("ring-4", "allgather"))


@pytest.mark.parametrize(("edit", "needle", "line"), [
    (lambda x: "\ufeff" + x, "byte order mark", 1),
    (lambda x: x.replace("\n  <gpu", "\n\t<gpu", 1), "a tab", 3),
    (lambda x: x.replace("<!-- ", "<!--", 1), "'<!--' not followed by a space", 1),
    (lambda x: x.replace(' ngpus="4"', '\n ngpus="4"', 1), "split across lines", 2),
    (lambda x: x.replace('ngpus="4"', "ngpus='4'", 1), "single-quoted", 2),
    (lambda x: x.replace('ngpus="4"', 'ngpus = "4"', 1), "spaces around '='", 2),
])
def test_what_the_runtime_tokenizer_rejects(edit, needle: str, line: int) -> None:  # type: ignore[no-untyped-def]
    assert validate(GOOD) == []
    found = [v for v in validate(edit(GOOD)) if v.rule == "token"]
    assert found, validate(edit(GOOD))
    assert needle in found[0].message and found[0].line == line


def test_comments_may_span_lines_and_hold_equals_signs() -> None:
    text = GOOD.replace("<!-- ", "<!-- note: a = b\n  ", 1)
    assert not any(v.rule == "token" for v in validate(text))
