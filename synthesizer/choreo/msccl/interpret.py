"""Execute an MSCCL XML file the way the runtime does, on symbolic buffers.

Every threadblock of every rank runs its steps in order. A step first waits for its
dependency (the runtime's per-threadblock flag holds the index of the last completed step with
``hasdep="1"``; ``depid``/``deps`` waits until it reaches ``deps``), then for a message from its
receive peer on its channel (connections are FIFOs per sender, receiver and channel, matched in
order), then for room on its send connection (``FIFO_CHUNKS`` chunk messages in flight). Values
are symbolic: a data chunk is (origin rank, input unit); a partial reduction is (unit, set of
contributing ranks), and adding a rank twice or mixing units is an error. At the end every
output must hold exactly what the collective promises, in each call mode the file declares
(in-place aliases input and output).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from choreo.errors import InputError
from choreo.msccl import layout
from choreo.msccl.parse import comment_fields, detect_dialect, parse
from choreo.msccl.xmlmodel import READS_SRC, RECVS, SENDS, WRITES_DST, Algo, Step, Tb

MAX_MESSAGES = 30
# Ranks x chunks of one loop the interpreter follows (a 1024-GPU AllReduce file has 6.3 M); a
# file claiming more is refused, not followed until memory runs out.
MAX_CELLS = 1 << 24

# Values: ("d", origin rank, input unit) or ("r", unit, contributor bitmask, problem text).
Value = tuple


@dataclass(frozen=True)
class Stall:
    """Where a deadlocked threadblock stopped, and what it waits for."""

    gpu: int
    tb: int
    step: int
    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: gpu {self.gpu} tb {self.tb} step {self.step}: {self.reason}"


@dataclass
class RunResult:
    coll: str
    ngpus: int
    modes: list[str]
    steps: int = 0
    errors: list[str] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and not self.stalls

    def __str__(self) -> str:
        if self.ok:
            return (f"{self.coll} on {self.ngpus} GPUs: completes and computes the collective "
                    f"({', '.join(self.modes)}; {self.steps} steps executed)")
        lines = []
        if self.stalls:
            lines.append(f"DEADLOCK: {len(self.stalls)} threadblock(s) never finish")
            lines += [f"  {s}" for s in self.stalls[:MAX_MESSAGES]]
        lines += [f"  {e}" for e in self.errors[:MAX_MESSAGES]]
        if len(self.errors) > MAX_MESSAGES:
            lines.append(f"  ... and {len(self.errors) - MAX_MESSAGES} more")
        return "\n".join(lines)


def run(xml_text: str, *, capacity: int = layout.FIFO_CHUNKS, root: int | None = None,
        dialect: str | None = None) -> RunResult:
    """Interpret ``xml_text``; InputError if it cannot even be read (with line and place)."""
    parsed = parse(xml_text)
    if not parsed.usable or parsed.algo is None:
        shown = "; ".join(str(v) for v in parsed.violations[:5])
        raise InputError(f"cannot interpret the file: {shown}")
    algo = parsed.algo
    coll = layout.parse_coll(algo.coll)
    if coll is None:
        raise InputError(f"line {algo.line}: cannot interpret coll={algo.coll!r} "
                         "(no fixed postcondition)")
    n, L = algo.ngpus, algo.nchunksperloop
    if n < 1 or L < 1 or len(algo.gpus) != n or sorted(g.id for g in algo.gpus) != list(range(n)):
        raise InputError(f"line {algo.line}: ngpus={n} must be positive and match the <gpu> ids "
                         f"0..{n - 1} (found {len(algo.gpus)} <gpu>); a per-node split file "
                         "cannot be run alone")
    if n * L > MAX_CELLS:
        raise InputError(f"line {algo.line}: ngpus={n} x nchunksperloop={L} is {n * L:,} "
                         f"chunks, more than the interpreter follows ({MAX_CELLS:,})")
    for g in algo.gpus:
        for tb in g.tbs:
            for st in tb.steps:
                if not 0 <= st.cnt <= layout.MAX_CNT:
                    raise InputError(f"line {st.line}: cnt={st.cnt} must be in "
                                     f"0..{layout.MAX_CNT}")
    units = layout.Units(coll, n, L)
    if units.needs_piece_divisible and L % n:
        raise InputError(f"line {algo.line}: nchunksperloop={L} is not a multiple of "
                         f"ngpus={n}, which {algo.coll} needs")
    rt = layout.runtime(detect_dialect(algo, dialect))
    modes = []
    if rt.legacy:  # ``inplace`` is compared with the call's kind; ``outofplace`` is not read
        modes.append("in-place" if algo.attrs.get("inplace") == "1" else "out-of-place")
    else:
        if algo.attrs.get("outofplace") == "1":
            modes.append("out-of-place")
        if algo.attrs.get("inplace") == "1":
            modes.append("in-place")
    the_root = root if root is not None else _root(algo, coll)
    result = RunResult(algo.coll, n, modes)
    result.errors.extend(_mis_stored(algo, rt))
    if result.errors:  # the runtime would not run what the file says: nothing to compute
        return result
    for mode in modes:
        _Machine(algo, units, the_root, mode == "in-place", capacity, result).execute()
    return result


def _mis_stored(algo: Algo, rt: layout.Runtime) -> list[str]:
    """Steps the runtime would store differently from what they say: a ``depid`` past its
    int8_t wraps to another threadblock."""
    return [f"line {st.line}: gpu {g.id} tb {tb.id} step {st.s}: depid={st.depid} does not fit "
            f"the runtime's int8_t (at most {rt.max_depid}); it would wait on tb "
            f"{layout.stored_depid(st.depid)}"
            for g in algo.gpus for tb in g.tbs for st in tb.steps if st.depid > rt.max_depid]


def _root(algo: Algo, coll: layout.Collective) -> int:
    """The root is not in the XML: choreo's comment says it, else the lone rank that never
    receives (broadcast, scatter) or never sends (reduce, gather)."""
    hinted = comment_fields(algo).get("root", "")
    if hinted.isdigit():
        return int(hinted)
    if coll in (layout.Collective.BROADCAST, layout.Collective.SCATTER):
        lone = [g.id for g in algo.gpus if all(tb.recv < 0 for tb in g.tbs)]
    elif coll in (layout.Collective.REDUCE, layout.Collective.GATHER):
        lone = [g.id for g in algo.gpus if all(tb.send < 0 for tb in g.tbs)]
    else:
        return 0
    return lone[0] if len(lone) == 1 else 0


class _Machine:
    def __init__(self, algo: Algo, units: layout.Units, root: int, inplace: bool, capacity: int,
                 result: RunResult) -> None:
        self.algo, self.units, self.root, self.inplace = algo, units, root, inplace
        self.capacity = max(1, capacity)
        self.result = result
        self.mode = "in-place" if inplace else "out-of-place"
        self.combining = units.coll.combining
        self.full = (1 << units.n) - 1
        self.sizes = {g.id: g for g in algo.gpus}
        # In place, a rank's input units lo..hi-1 are its output units from lo + shift (the
        # same memory; ``Units.inplace_alias`` is such a range for every collective).
        self.alias: dict[int, tuple[int, int, int]] = {}
        for g in algo.gpus:
            alias = units.inplace_alias(g.id, root) if inplace else {}
            if alias:
                lo, hi = min(alias), max(alias) + 1
                shift = alias[lo] - lo
                assert len(alias) == hi - lo and all(alias[k] == k + shift for k in alias)
                self.alias[g.id] = (lo, hi, shift)
        # Each rank's buffers, a cell a chunk (None: never written); room for what the
        # collective's input and the in-place aliases reach even where the file declares
        # less (its steps are still checked against what it declares).
        self.mem: dict[tuple[int, str], list[Value | None]] = {}
        for g in algo.gpus:
            lo, hi, shift = self.alias.get(g.id, (0, 0, 0))
            self.mem[(g.id, "i")] = [None] * max(g.size("i"), units.in_units)
            self.mem[(g.id, "o")] = [None] * max(g.size("o"), hi + shift, units.out_units)
            self.mem[(g.id, "s")] = [None] * g.size("s")
        self.initial: dict[int, list[Value]] = {}
        for g in algo.gpus:
            if not units.has_input(g.id, root):
                continue
            k_units = range(units.in_units)
            values: list[Value] = ([("r", k, 1 << g.id, "") for k in k_units] if self.combining
                                   else [("d", g.id, k) for k in k_units])
            self.initial[g.id] = values
            for cells, a, b, k in self._segments(g.id, "i", 0, units.in_units):
                cells[a:b] = values[k:k + b - a]
        self.fifo: dict[tuple[int, int, int], deque] = {}

    def error(self, text: str) -> None:
        self.result.errors.append(f"{self.mode}: {text}")

    def _segments(self, gpu: int, buf: str, off: int, cnt: int
                  ) -> list[tuple[list[Value | None], int, int, int]]:
        """Where ``buf[off..off+cnt-1]`` of ``gpu`` lives: (cells, first, end, its first
        index in ``buf``) per piece, in order (in place, input units may be output cells)."""
        if buf == "i" and gpu in self.alias:
            lo, hi, shift = self.alias[gpu]
            a, b = max(off, lo), min(off + cnt, hi)
            if a < b:
                inside, out = self.mem[(gpu, "o")], self.mem[(gpu, "i")]
                pieces = [(out, off, a, off)] if off < a else []
                pieces.append((inside, a + shift, b + shift, a))
                if b < off + cnt:
                    pieces.append((out, b, off + cnt, b))
                return pieces
        return [(self.mem[(gpu, buf)], off, off + cnt, off)]

    def _where(self, g: int, tb: Tb, st: Step) -> str:
        return f"line {st.line}: gpu {g} tb {tb.id} step {st.s} ({st.type})"

    def _read(self, g: int, tb: Tb, st: Step, buf: str, off: int) -> list[Value]:
        gpu = self.sizes[g]
        if off < 0 or off + st.cnt > gpu.size(buf):
            self.error(f"{self._where(g, tb, st)}: reads {buf}[{off}..{off + st.cnt - 1}] "
                       f"outside the {gpu.size(buf)} chunk(s) of {buf}")
            return [("x", "out of bounds")] * st.cnt
        out: list[Value] = []
        for cells, a, b, k in self._segments(g, buf, off, st.cnt):
            part = cells[a:b]
            if None in part:
                for j, v in enumerate(part):
                    if v is None:
                        self.error(f"{self._where(g, tb, st)}: reads {buf}[{k + j}] before "
                                   "anything was written there")
                        part[j] = ("x", f"uninitialized {buf}[{k + j}] of gpu {g}")
            out += part  # type: ignore[arg-type]  # every None replaced just above
        return out

    def _write(self, g: int, tb: Tb, st: Step, buf: str, off: int, values: list[Value]) -> None:
        gpu = self.sizes[g]
        if off < 0 or off + len(values) > gpu.size(buf):
            self.error(f"{self._where(g, tb, st)}: writes {buf}[{off}..{off + len(values) - 1}] "
                       f"outside the {gpu.size(buf)} chunk(s) of {buf}")
            return
        for cells, a, b, k in self._segments(g, buf, off, len(values)):
            cells[a:b] = values[k - off:k - off + b - a]

    def _sum(self, xs: list[Value], ys: list[Value]) -> list[Value]:
        """``_add`` of each pair, the usual one (two disjoint sums of a unit) inline."""
        return [("r", a[1], a[2] | b[2], "")
                if a[0] == "r" == b[0] and a[1] == b[1] and not a[2] & b[2] and not a[3]
                and not b[3] else self._add(a, b) for a, b in zip(xs, ys, strict=True)]

    def _add(self, a: Value, b: Value) -> Value:
        if a[0] == "x" or b[0] == "x":
            return a if a[0] == "x" else b
        if a[0] != "r" or b[0] != "r":
            return ("x", "reduction of data that a non-combining collective never reduces")
        if a[1] != b[1]:
            return ("x", f"sums unit {a[1]} with unit {b[1]}")
        twice = a[2] & b[2]
        problem = a[3] or b[3] or (
            f"counts rank(s) {_ranks(twice)} twice" if twice else "")
        return ("r", a[1], a[2] | b[2], problem)

    def execute(self) -> None:
        tbs = [(g.id, tb) for g in self.algo.gpus for tb in g.tbs]
        index = {(g, tb.id): tb for g, tb in tbs}
        pc = dict.fromkeys(index, 0)
        flag = dict.fromkeys(index, -1)
        self._run(tbs, index, pc, flag)
        for g, tb in tbs:
            k = pc[(g, tb.id)]
            if k < len(tb.steps):
                st = tb.steps[k]
                reason = self._blocked(g, tb, st, index, flag) or "blocked"
                self.result.stalls.append(Stall(g, tb.id, st.s, st.line,
                                                f"{self.mode}: {reason}"))
        if self.result.stalls:
            return
        for (src, dst, chan), q in self.fifo.items():
            if q:
                self.error(f"{len(q)} message(s) sent from gpu {src} to gpu {dst} on channel "
                           f"{chan} were never received (first by {q[0][1]})")
        self._check_outputs()

    def _run(self, tbs: list[tuple[int, Tb]], index: dict, pc: dict, flag: dict) -> None:
        """Run the threadblocks in passes, in order, each as far as it can, until a pass
        runs nothing (the order every run follows), visiting only those something may have
        unblocked: a message on the connection one receives from, room on the one it sends
        on, or a flag it waits for. One that nothing woke would stay blocked, so skipping it
        changes nothing; one woken later in a pass runs in that pass, one before it in the
        next. (Threadblocks of a rank that share an id share their place in its steps: any
        step wakes every one there.)"""
        shared = len(index) != len(tbs)
        everyone = range(len(tbs))
        readers: dict[tuple[int, int, int], list[int]] = {}
        writers: dict[tuple[int, int, int], list[int]] = {}
        for i, (g, tb) in enumerate(tbs):
            if tb.recv >= 0:
                readers.setdefault((tb.recv, g, tb.chan), []).append(i)
            if tb.send >= 0:
                writers.setdefault((g, tb.send, tb.chan), []).append(i)
        waiting: dict[tuple[int, int], list[int]] = {}  # (gpu, tb id) -> on its flag
        now = list(range(len(tbs)))  # a heap of this pass's, by position
        while now:
            queued, later = set(now), set()
            while now:
                i = heapq.heappop(now)
                g, tb = tbs[i]
                key = (g, tb.id)
                k = pc[key]
                steps = tb.steps
                while k < len(steps):
                    st = steps[k]
                    if self._blocked(g, tb, st, index, flag) is not None:
                        if st.depid >= 0:
                            waiting.setdefault((g, st.depid), []).append(i)
                        break
                    self._step(g, tb, st)
                    if st.hasdep == 1:
                        flag[key] = st.s
                    woken = everyone if shared else [
                        *(writers.get((tb.recv, g, tb.chan), ()) if st.type in RECVS else ()),
                        *(readers.get((g, tb.send, tb.chan), ()) if st.type in SENDS else ()),
                        *(waiting.pop(key, ()) if st.hasdep == 1 else ())]
                    for j in woken:
                        if j > i and j not in queued:
                            heapq.heappush(now, j)
                            queued.add(j)
                        elif j < i:
                            later.add(j)
                    k += 1
                    self.result.steps += 1
                pc[key] = k
            now = sorted(later)

    def _blocked(self, g: int, tb: Tb, st: Step, index: dict, flag: dict) -> str | None:
        """None if ``st`` can run now, else what it waits for."""
        if st.depid >= 0:
            target = index.get((g, st.depid))
            if target is None:
                return f"depends on tb {st.depid}, which does not exist"
            have = flag[(g, st.depid)]
            if have < st.deps:
                unpublished = (st.deps < len(target.steps)
                               and target.steps[st.deps].hasdep != 1)
                return (f"waits for tb {st.depid} step {st.deps} (tb {st.depid} has published "
                        f"step {have})" + ("; that step has hasdep=0, so it is never published"
                                           if unpublished else ""))
        if st.type in RECVS:
            if tb.recv < 0:
                return "receives but the threadblock has recv=-1"
            q = self.fifo.get((tb.recv, g, tb.chan))
            if not q:
                return f"waits for a message from gpu {tb.recv} on channel {tb.chan}"
        if st.type in SENDS:
            if tb.send < 0:
                return "sends but the threadblock has send=-1"
            q = self.fifo.get((g, tb.send, tb.chan))
            if q and sum(len(m[0]) for m in q) + st.cnt > self.capacity:
                return (f"waits for room on the connection to gpu {tb.send} channel {tb.chan} "
                        f"({len(q)} message(s) not yet received)")
        return None

    def _step(self, g: int, tb: Tb, st: Step) -> None:
        t = st.type
        if t == "nop":
            return
        incoming: list[Value] = []
        if t in RECVS:
            values, origin = self.fifo[(tb.recv, g, tb.chan)].popleft()
            if len(values) != st.cnt:
                self.error(f"{self._where(g, tb, st)}: receives cnt={st.cnt} but the matching "
                           f"send ({origin}) sent {len(values)}")
                values = (values + [("x", "count mismatch")] * st.cnt)[: st.cnt]
            incoming = values
        src = self._read(g, tb, st, st.srcbuf, st.srcoff) if t in READS_SRC else []
        if t in ("rrs", "rrc", "rrcs"):
            result = self._sum(incoming, src)
        elif t == "re":
            dst = self._read(g, tb, st, st.dstbuf, st.dstoff)
            result = self._sum(dst, src)
        elif t in ("r", "rcs"):
            result = incoming
        else:  # s, cpy
            result = src
        if t in WRITES_DST:
            self._write(g, tb, st, st.dstbuf, st.dstoff, result)
        if t in SENDS:
            q = self.fifo.setdefault((g, tb.send, tb.chan), deque())
            q.append((result, f"gpu {g} tb {tb.id} step {st.s}"))

    def _check_outputs(self) -> None:
        units = self.units
        seen: dict[int, tuple[int, int]] = {}
        want: list[Value] = []
        for gpu in self.algo.gpus:
            cells = self.mem[(gpu.id, "o")]
            expected = units.expected(gpu.id, self.root)
            if expected != seen:  # ranks mostly expect alike (AllReduce, AllGather)
                seen = expected
                want = [("d", origin, unit) if origin >= 0 else ("r", unit, self.full, "")
                        for origin, unit in expected.values()]
            if [cells[k] if k < len(cells) else None for k in expected] == want:
                continue  # every output as promised; else each wrong one is named below
            for k, (origin, unit) in expected.items():
                v = cells[k] if k < len(cells) else None
                where = f"gpu {gpu.id} o[{k}]"
                if v is None:
                    self.error(f"{where}: never written")
                elif v[0] == "x":
                    self.error(f"{where}: {v[1]}")
                elif origin < 0:
                    if v[0] != "r" or v[1] != unit:
                        self.error(f"{where}: holds {_show(v)}, expected the sum of unit {unit}")
                    elif v[3]:
                        self.error(f"{where}: {v[3]}")
                    elif v[2] != self.full:
                        self.error(f"{where}: lacks the contribution(s) of rank(s) "
                                   f"{_ranks(self.full & ~v[2])}")
                elif v != ("d", origin, unit):
                    self.error(f"{where}: holds {_show(v)}, expected input unit {unit} of "
                               f"rank {origin}")
        if not self.inplace:
            for g, values in self.initial.items():
                cells = self.mem[(g, "i")]
                if cells[:len(values)] != values:
                    for k, v in enumerate(values):
                        if cells[k] != v:
                            self.error(f"gpu {g} i[{k}]: the input was overwritten (an "
                                       "out-of-place call's send buffer must stay intact)")


def _ranks(mask: int) -> str:
    return ",".join(str(r) for r in range(mask.bit_length()) if mask >> r & 1)


def _show(v: Value) -> str:
    if v[0] == "d":
        return f"input unit {v[2]} of rank {v[1]}"
    if v[0] == "r":
        return f"a sum of unit {v[1]} over rank(s) {_ranks(v[2])}"
    return str(v[1])
