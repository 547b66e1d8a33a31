"""Broken files: the validator names the rule and place, the interpreter shows the effect, and
malformed input gives located messages instead of tracebacks."""

from __future__ import annotations

import copy
import re

import pytest
from msccl_helpers import schedule

from choreo.errors import InputError
from choreo.msccl import run, to_xml, validate
from choreo.msccl.parse import parse
from choreo.msccl.xmlmodel import Algo, Step, to_text


def model(topology: str = "ring-8", collective: str = "allreduce", chunks: int = 1) -> Algo:
    parsed = parse(to_xml(schedule(topology, collective, chunks)))
    assert parsed.algo is not None and parsed.usable
    return copy.deepcopy(parsed.algo)


def rules(algo: Algo) -> dict[str, list]:
    out: dict[str, list] = {}
    for v in validate(to_text(algo)):
        out.setdefault(v.rule, []).append(v)
    return out


def renumber(steps: list[Step]) -> None:
    for k, st in enumerate(steps):
        st.s = k


def test_missing_hasdep_is_named_and_hangs_the_waiter() -> None:
    algo = model()
    gpu = algo.gpus[0]
    waiter = next(st for tb in gpu.tbs for st in tb.steps if st.depid >= 0)
    target = gpu.tbs[waiter.depid].steps[waiter.deps]
    target.hasdep = 0
    found = rules(algo)
    assert [(v.gpu, v.tb, v.step) for v in found["hasdep"]] == [(0, waiter.depid, waiter.deps)]
    assert "never publishes" in found["hasdep"][0].message
    result = run(to_text(algo))
    assert not result.ok and result.stalls
    assert any("hasdep=0, so it is never published" in s.reason for s in result.stalls)


def test_reordered_sends_are_caught_by_both() -> None:
    algo = model("ring-8", "allgather", 2)
    tb = algo.gpus[0].tbs[0]
    i, j = [k for k, st in enumerate(tb.steps) if st.type == "s" and st.depid < 0][:2]
    assert tb.steps[i].dstoff != tb.steps[j].dstoff
    tb.steps[i], tb.steps[j] = tb.steps[j], tb.steps[i]
    renumber(tb.steps)
    found = rules(algo)
    assert found.keys() == {"order"}
    assert found["order"][0].gpu == 0 and found["order"][0].tb == tb.id
    assert "out of order" in found["order"][0].message
    result = run(to_text(algo))
    assert not result.ok
    assert any("expected input unit" in e for e in result.errors)


def test_wrong_receive_offset_breaks_the_result() -> None:
    algo = model("ring-8", "allgather", 1)
    gpu = algo.gpus[2]
    st = next(st for tb in gpu.tbs for st in tb.steps if st.type == "r")
    right = st.dstoff
    st.dstoff = (right + 1) % gpu.o_chunks
    result = run(to_text(algo))  # well-formed, so only executing it shows the damage
    assert not result.ok
    assert f"out-of-place: gpu 2 o[{right}]: never written" in result.errors


def test_offset_outside_the_buffer() -> None:
    algo = model()
    st = algo.gpus[1].tbs[0].steps[0]
    st.srcoff = algo.gpus[1].size(st.srcbuf) + 3
    found = rules(algo)
    assert [(v.gpu, v.tb, v.step) for v in found["offset"]] == [(1, 0, 0)]
    assert not run(to_text(algo)).ok


def test_dropped_step() -> None:
    algo = model()
    tb = algo.gpus[3].tbs[0]
    dropped = next(k for k, st in enumerate(tb.steps) if st.type in ("r", "rrc", "rcs", "rrs"))
    del tb.steps[dropped]
    found = rules(algo)
    assert "step" in found  # s no longer counts document positions
    assert any(v.gpu == 3 and v.tb == 0 for v in found["step"])
    assert "match" in found  # the connection now has one receive too few
    renumber(tb.steps)
    found = rules(algo)
    assert "match" in found and "step" not in found
    result = run(to_text(algo))
    assert not result.ok
    assert result.stalls or any("never received" in e for e in result.errors)


def test_dependency_cycle() -> None:
    algo = model()
    gpu = algo.gpus[0]
    a, b = gpu.tbs[0], gpu.tbs[1]
    a.steps[0].depid, a.steps[0].deps = b.id, 0
    b.steps[0].depid, b.steps[0].deps = a.id, 0
    a.steps[0].hasdep = b.steps[0].hasdep = 1
    found = rules(algo)
    assert list(found) == ["cycle"]
    assert "wait on each other in a cycle" in found["cycle"][0].message
    result = run(to_text(algo))
    stuck = {(s.gpu, s.tb, s.step) for s in result.stalls}
    assert {(0, a.id, 0), (0, b.id, 0)} <= stuck


def test_a_cycle_through_a_threadblocks_own_order_is_found() -> None:
    algo = model()
    gpu = algo.gpus[0]
    a, b = gpu.tbs[0], gpu.tbs[1]
    assert len(b.steps) >= 2
    a.steps[0].depid, a.steps[0].deps = b.id, 1  # b's step 1 runs only after its step 0 ...
    b.steps[0].depid, b.steps[0].deps = a.id, 0  # ... which waits for a's step 0
    a.steps[0].hasdep = b.steps[1].hasdep = 1
    found = rules(algo)
    assert list(found) == ["cycle"]
    message = found["cycle"][0].message
    assert f"tb {b.id} step 1" in message and f"tb {b.id} step 0" in message
    assert f"tb {a.id} step 0" in message


@pytest.mark.parametrize(("edit", "rule"), [
    (lambda t: t.replace('<step s="0" ', '<step s="0" extra="1" ', 1), "attr"),
    (lambda t: t.replace('type="s"', f'type="{"s" * 300}"', 1), "limit"),
    (lambda t: t.replace('type="s"', 'type="send"', 1), "type"),
    (lambda t: t.replace('srcbuf="i"', 'srcbuf="x"', 1), "offset"),
    (lambda t: t.replace('cnt="1"', 'cnt="0x1"', 1), "attr"),
])
def test_every_step_attribute_is_still_read_and_checked(edit, rule: str) -> None:  # type: ignore[no-untyped-def]
    text = to_xml(schedule("ring-8", "allgather", 1))
    assert validate(text) == []
    assert rule in {v.rule for v in validate(edit(text))}


def test_steps_read_without_per_attribute_checks_equal_those_read_with_them() -> None:
    text = to_xml(schedule("ring-8", "allreduce", 2))
    padded = re.sub(r'( (?:s|srcoff|dstoff|cnt|depid|deps|hasdep)="-?[0-9]+)"', r'\1 "', text)
    assert padded.count(' "') >= 7 * text.count("<step ")  # every step takes the checked path
    plain, checked = parse(text), parse(padded)
    assert plain.violations == checked.violations == []
    assert plain.algo == checked.algo


def test_send_in_a_threadblock_without_send_peer() -> None:
    algo = model()
    tb = next(tb for tb in algo.gpus[0].tbs if tb.send >= 0)
    tb.send = -1
    found = rules(algo)
    assert "send" in found and found["send"][0].tb == tb.id
    assert "match" in found


def test_nop_chain_must_end_in_a_step_with_a_dependency() -> None:
    algo = model()
    tb = algo.gpus[0].tbs[0]
    tb.steps.insert(0, Step(0, "nop", "i", -1, "o", -1, 0, 1, 0, 0))
    renumber(tb.steps)
    tb.steps[1].depid = tb.steps[1].deps = -1
    algo.gpus[0].tbs[1].steps[0].hasdep = 1
    found = rules(algo)
    assert any("must itself have a dependency" in v.message for v in found["nop"])


def test_too_many_steps_for_the_executor() -> None:
    algo = model()
    tb = algo.gpus[0].tbs[0]
    tb.steps.extend(Step(0, "nop", "i", -1, "o", -1, 0, 1, 0, 0) for _ in range(70))
    renumber(tb.steps)
    found = rules(algo)
    assert any("allows 64 steps" in v.message for v in found["step"])


def test_legacy_spelling_and_ranges() -> None:
    xml = to_xml(schedule("ring-8", "reducescatter"), dialect="legacy")
    assert 'coll="reduce_scatter"' in xml
    assert validate(xml) == []
    broken = re.sub(r'maxBytes="[0-9]+"', 'maxBytes="0"', xml)
    assert [v.rule for v in validate(broken)] == ["range"]
    wrong = validate(xml.replace('coll="reduce_scatter"', 'coll="reducescatter"'), "legacy")
    assert any("legacy spells it reduce_scatter" in v.message for v in wrong)


GOOD_HEAD = ('<algo name="x" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" '
             'coll="allgather" inplace="1" outofplace="1" minBytes="0" maxBytes="0">')


@pytest.mark.parametrize(("text", "rule", "line", "needle"), [
    ("", "xml", 1, "not well-formed"),
    ("<algo", "xml", 1, "not well-formed"),
    ('<?xml version="1.0"?>\n' + GOOD_HEAD + "</algo>", "xml", 1, "declaration"),
    (GOOD_HEAD + '\n<gpu id="0" i_chunks="1" o_chunks="2">\n</gpu></algo>', "attr", 2,
     "'s_chunks'"),
    (GOOD_HEAD + '\n<gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0">\n<tb id="0" send="1" '
     'recv="-1" chan="0">\n<step s="0" type="s" srcbuf="i" srcoff="zero" dstbuf="o" dstoff="0" '
     'cnt="1" depid="-1" deps="-1" hasdep="0"/></tb></gpu></algo>', "attr", 4, "srcoff"),
    (GOOD_HEAD + '\n<gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0"><banana/></gpu></algo>',
     "structure", 2, "<banana>"),
    ('<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" '
     'deps="-1" hasdep="0"/>', "structure", 1, "as the document element"),
    (GOOD_HEAD + '\n<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" '
     'depid="-1" deps="-1" hasdep="0"/></algo>', "structure", 2, "inside <algo>"),
    # the inner </tb> closes the unexpected element, not the <tb> around it
    (GOOD_HEAD + '\n<gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0">\n<tb id="0" send="1" '
     'recv="-1" chan="0">\n<tb id="1" send="-1" recv="-1" chan="0"></tb>\n<step s="0" type="s" '
     'srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>'
     '</tb></gpu></algo>', "structure", 4, "unexpected <tb> inside <tb>"),
])
def test_malformed_input_is_located(text: str, rule: str, line: int, needle: str) -> None:
    found = [v for v in validate(text) if v.rule == rule]
    assert found, validate(text)
    assert found[0].line == line and needle in found[0].message
    assert str(found[0]).startswith(f"line {line}")
    with pytest.raises(InputError, match=f"line {line}"):
        run(text)


def test_step_violation_names_gpu_tb_step_and_line() -> None:
    text = (GOOD_HEAD + '\n<gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0">\n<tb id="0" '
            'send="1" recv="-1" chan="0">\n<step s="0" type="s" srcbuf="i" srcoff="0" '
            'dstbuf="o" dstoff="0" cnt="99" depid="-1" deps="-1" hasdep="0"/></tb></gpu></algo>')
    v = next(v for v in validate(text) if v.rule == "cnt")
    assert (v.line, v.gpu, v.tb, v.step) == (4, 0, 0, 0)
    assert str(v).startswith("line 4 gpu 0 tb 0 step 0: [cnt]")


def test_a_count_no_runtime_takes_is_refused_not_followed() -> None:
    """cnt=2**31 on one step: the interpreter built a list of that many values until memory
    ran out; the runtime's limit is named instead."""
    algo = model()
    step = algo.gpus[0].tbs[0].steps[0]
    step.cnt = 1 << 31
    with pytest.raises(InputError, match=rf"line {step.line}: cnt=2147483648 must be in 0..71"):
        run(to_text(algo))


def test_a_loop_too_large_to_follow_is_refused() -> None:
    algo = model()
    algo.attrs["nchunksperloop"] = str(1 << 24)
    with pytest.raises(InputError, match=r"ngpus=8 x nchunksperloop=16777216 is 134,217,728 "
                       r"chunks, more than the interpreter follows \(16,777,216\)"):
        run(to_text(algo))
